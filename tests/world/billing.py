"""A Cloud Billing Catalog stand-in behind cloudbilling.googleapis.com: the REST shapes
google-cloud-billing's CloudCatalogClient (transport "rest") sends and reads.

Modelled, with sources:
- GET /v1/services and GET /v1/services/{id}/skus, paged by pageSize/pageToken with
  nextPageToken until the last page (https://cloud.google.com/billing/v1/how-tos/catalog-api;
  https://cloud.google.com/billing/docs/reference/rest/v1/services.skus/list: default and largest
  page 5000; the server may return fewer). Compute Engine is service 6F81-5844-456A.
- Sku, Category, PricingInfo, PricingExpression, TierRate and google.type.Money fields as in
  google/cloud/billing_v1/types/cloud_catalog.py (JSON names: skuId, serviceRegions,
  pricingInfo[].pricingExpression.tieredRates[].unitPrice.{currencyCode,units,nanos}; units is
  an int64, so a JSON string). SKU descriptions as the catalog words them ("N1 Predefined Instance
  Core running in Americas", "Spot Preemptible ...", "Nvidia Tesla T4 GPU attached to Spot
  Preemptible VMs running in Americas", Flex-start's "DWS Defined Duration ..."), with commitments and other
  regions among them.
- Errors in Google's JSON error shape (https://cloud.google.com/apis/design/errors): 403
  PERMISSION_DENIED with a google.rpc.ErrorInfo reason SERVICE_DISABLED for
  cloudbilling.googleapis.com when the project (the x-goog-user-project header) has not enabled
  the API; 429 RESOURCE_EXHAUSTED, reason RATE_LIMIT_EXCEEDED, past the per-minute read quota
  (https://cloud.google.com/billing/quotas).
- A request without a bearer token answers 401 UNAUTHENTICATED.
The prices are illustrative test data, chosen apart from tfcluster's table so a test can tell
which one an estimate used.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlparse

from tests.world import compute_auth, discovery, facts
from tests.world.http import QuietHandler, TlsServer, send_json

COMPUTE_ID = "6F81-5844-456A"
AMERICAS = ["us-central1", "us-east1", "us-west1"]


def sku(sku_id: str, description: str, group: str, usage: str, regions: list[str], usd: float,
        unit: str = "h") -> dict:
    """One Compute Engine SKU in the catalog's JSON shape."""
    units, nanos = int(usd), round((usd - int(usd)) * 1e9)
    return {
        "name": f"services/{COMPUTE_ID}/skus/{sku_id}", "skuId": sku_id, "description": description,
        "category": {"serviceDisplayName": "Compute Engine", "resourceFamily": "Compute",
                     "resourceGroup": group, "usageType": usage},
        "serviceRegions": regions,
        "pricingInfo": [{
            "effectiveTime": "2026-11-22T08:00:00.000Z", "summary": "",
            "pricingExpression": {
                "usageUnit": unit, "displayQuantity": 1,
                "usageUnitDescription": "gibibyte hour" if unit == "GiBy.h" else "hour",
                "baseUnit": "By.s" if unit == "GiBy.h" else "s",
                "baseUnitDescription": "byte second" if unit == "GiBy.h" else "second",
                "baseUnitConversionFactor": 3865470566400 if unit == "GiBy.h" else 3600,
                "tieredRates": [{"startUsageAmount": 0,
                                 "unitPrice": {"currencyCode": "USD", "units": str(units), "nanos": nanos}}]},
            "currencyConversionRate": 1}],
        "serviceProviderName": "Google",
        # Enums as numbers: the client asks for `$alt=json;enum-encoding=int` (MULTI_REGIONAL 3, REGIONAL 2).
        "geoTaxonomy": {"type": 3 if len(regions) > 1 else 2, "regions": regions},
    }


def compute_skus() -> list[dict]:
    """The SKUs tfcluster needs in the Americas, among look-alikes it must not take."""
    return [
        sku("0A0A-0001", "Commitment v1: Cpu in Americas for 1 Year", "CPU", "Commit1Yr", AMERICAS, 0.019915),
        sku("0A0A-0002", "N1 Predefined Instance Core running in Paris", "N1Standard", "OnDemand",
            ["europe-west9"], 0.0348),
        sku("0A0A-0003", "Custom Instance Core running in Americas", "CPU", "OnDemand", AMERICAS, 0.033174),
        sku("2E27-4F75-95CD", "N1 Predefined Instance Core running in Americas", "N1Standard", "OnDemand",
            AMERICAS, 0.0332),
        sku("6C71-E950-1D6F", "N1 Predefined Instance Ram running in Americas", "N1Standard", "OnDemand",
            AMERICAS, 0.00445, "GiBy.h"),
        sku("0A0A-0004", "Licensing Fee for Ubuntu Pro on VM with 8 VCPU", "License", "OnDemand", [], 0.0),
        sku("1DCD-1BB3-27B4", "Spot Preemptible N1 Predefined Instance Core running in Americas", "N1Standard",
            "Preemptible", AMERICAS, 0.0071),
        sku("D3CA-A6A5-6DE3", "Spot Preemptible N1 Predefined Instance Ram running in Americas", "N1Standard",
            "Preemptible", AMERICAS, 0.00095, "GiBy.h"),
        sku("0A0A-0005", "Nvidia Tesla T4 GPU running in Paris", "GPU", "OnDemand", ["europe-west9"], 0.41),
        sku("039F-D0DA-4055", "Nvidia Tesla T4 GPU running in Americas", "GPU", "OnDemand", AMERICAS, 0.36),
        sku("0A0A-0006", "Commitment v1: Nvidia Tesla T4 GPU in Americas for 1 Year", "GPU", "Commit1Yr",
            AMERICAS, 0.22),
        sku("C5B6-2B2C-4A57", "Nvidia Tesla T4 GPU attached to Spot Preemptible VMs running in Americas", "GPU",
            "Preemptible", AMERICAS, 0.12),
        sku("2C5D-8E6F-7A1B", "Nvidia Tesla V100 GPU running in Americas", "GPU", "OnDemand", AMERICAS, 2.55),
        sku("8E1A-3B4C-5D6E", "Nvidia Tesla V100 GPU attached to Spot Preemptible VMs running in Americas", "GPU",
            "Preemptible", AMERICAS, 0.85),
        *family_skus(),
    ]


# G2, A2 and A3 bill their cores and RAM as "<family> Instance Core/Ram" SKUs and their GPUs by model
# (https://cloud.google.com/compute/vm-instance-pricing#accelerator-optimized, /compute/gpus-pricing).
# europe-west4 (Netherlands) lists L4 cheaper than the Americas here, so `offers` has an order to show.
FAMILY_PRICES = {  # family SKU words -> (core, RAM, Spot core, Spot RAM) in the Americas.
    "G2 Instance": (0.025, 0.0029, 0.009, 0.0011), "A2 Instance": (0.032, 0.0043, 0.0096, 0.0013),
    "A3 Instance": (0.030, 0.0030, 0.010, 0.0010)}
# The A100 80GB card's SKU is "Nvidia Tesla A100 80GB GPU running in ..." as public catalog readers see
# it (price readers match "nvidia tesla a100 80gb gpu running in americas"; 40GB is "Nvidia Tesla A100 GPU").
# The series each card comes in (the GPU machine-type tables: L4 on G2, A100 on A2, H100 on A3).
GPU_SERIES = {"Nvidia L4 GPU": "g2", "Nvidia Tesla A100 GPU": "a2", "Nvidia Tesla A100 80GB GPU": "a2",
              "Nvidia H100 80GB GPU": "a3"}
GPU_PRICES = {"Nvidia L4 GPU": (0.57, 0.22), "Nvidia Tesla A100 GPU": (3.00, 1.10),
              "Nvidia Tesla A100 80GB GPU": (4.00, 1.50), "Nvidia H100 80GB GPU": (10.00, 3.60)}


def family_skus() -> list[dict]:
    found = []
    for index, (words, (core, ram, spot_core, spot_ram)) in enumerate(FAMILY_PRICES.items()):
        found += [sku(f"FA{index}-1", f"{words} Core running in Americas", "CPU", "OnDemand", AMERICAS, core),
                  sku(f"FA{index}-2", f"{words} Ram running in Americas", "RAM", "OnDemand", AMERICAS, ram, "GiBy.h"),
                  sku(f"FA{index}-3", f"Spot Preemptible {words} Core running in Americas", "CPU", "Preemptible",
                      AMERICAS, spot_core),
                  sku(f"FA{index}-4", f"Spot Preemptible {words} Ram running in Americas", "RAM", "Preemptible",
                      AMERICAS, spot_ram, "GiBy.h")]
    for index, (words, (price, spot)) in enumerate(GPU_PRICES.items()):
        found += [sku(f"GP{index}-1", f"{words} running in Americas", "GPU", "OnDemand", AMERICAS, price),
                  sku(f"GP{index}-2", f"{words} attached to Spot Preemptible VMs running in Americas", "GPU",
                      "Preemptible", AMERICAS, spot)]
    # Flex-start VMs (Dynamic Workload Scheduler) bill as their own OnDemand SKUs, "DWS Defined Duration A3
    # Core running in Americas" and "Nvidia H100 80GB GPU attached to DWS Defined Duration VMs running in
    # Americas" (as catalog readers quote them), discounted "up to 53%" (ai-hypercomputer consumption models).
    # Here 50% off the Americas' on-demand prices above, so a test can tell them from the table's 45%. Only
    # the series Google discounts have them (tests/world/facts.py, FLEX_START_DISCOUNT): none for G2 or L4.
    for index, (words, (core, ram, _, _)) in enumerate(FAMILY_PRICES.items()):
        family = words.split()[0]
        if family.lower() not in facts.FLEX_START_DISCOUNTED_SERIES:
            continue
        found += [sku(f"DW{index}-1", f"DWS Defined Duration {family} Core running in Americas", "CPU", "OnDemand",
                      AMERICAS, core / 2),
                  sku(f"DW{index}-2", f"DWS Defined Duration {family} Ram running in Americas", "RAM", "OnDemand",
                      AMERICAS, ram / 2, "GiBy.h")]
    for index, (words, (price, _)) in enumerate(GPU_PRICES.items()):
        if GPU_SERIES[words] not in facts.FLEX_START_DISCOUNTED_SERIES:
            continue
        found.append(sku(f"DG{index}-1", f"{words} attached to DWS Defined Duration VMs running in Americas", "GPU",
                         "OnDemand", AMERICAS, price / 2))
    netherlands = ["europe-west4"]
    return found + [
        sku("NL-1", "G2 Instance Core running in Netherlands", "CPU", "OnDemand", netherlands, 0.026),
        sku("NL-2", "G2 Instance Ram running in Netherlands", "RAM", "OnDemand", netherlands, 0.003, "GiBy.h"),
        sku("NL-3", "Spot Preemptible G2 Instance Core running in Netherlands", "CPU", "Preemptible", netherlands, 0.008),
        sku("NL-4", "Spot Preemptible G2 Instance Ram running in Netherlands", "RAM", "Preemptible", netherlands,
            0.001, "GiBy.h"),
        sku("NL-5", "Nvidia L4 GPU running in Netherlands", "GPU", "OnDemand", netherlands, 0.40),
        sku("NL-6", "Nvidia L4 GPU attached to Spot Preemptible VMs running in Netherlands", "GPU", "Preemptible",
            netherlands, 0.15)]


@dataclass
class Catalog:
    """What the stand-in serves; tests change it as Google's side would change."""

    services: list = field(default_factory=lambda: [
        {"name": "services/0017-8C5E-5B91", "serviceId": "0017-8C5E-5B91", "displayName": "Cloud Pub/Sub",
         "businessEntityName": "businessEntities/GCP"},
        {"name": f"services/{COMPUTE_ID}", "serviceId": COMPUTE_ID, "displayName": "Compute Engine",
         "businessEntityName": "businessEntities/GCP"}])
    skus: list = field(default_factory=compute_skus)
    # The most items one page holds (the API's own cap is 5000; tests lower it to page).
    page_limit: int = 5000
    # Projects (x-goog-user-project) that have not enabled cloudbilling.googleapis.com.
    disabled_projects: set = field(default_factory=set)
    # The next N calls answer 429.
    rate_limited_calls: int = 0
    # Seconds each answer takes (a slow catalog: the real SKU list is tens of thousands of SKUs).
    answer_seconds: float = 0.0
    # Every request: {"path", "query", "project", "authorization"}.
    requests: list = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Google's identity system (the Compute stand-in's state, tests/world/compute_auth.py); None
    # takes any bearer token (a catalog tested alone).
    identity: object = None


def _error(code: int, status: str, message: str, reason: str, project: str) -> tuple[int, dict]:
    return code, {"error": {"code": code, "message": message, "status": status, "details": [
        {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason, "domain": "googleapis.com",
         "metadata": {"service": "cloudbilling.googleapis.com", "consumer": f"projects/{project}"}}]}}


def _page(items: list, key: str, query: dict, limit: int) -> tuple[int, dict]:
    size = min(int((query.get("pageSize") or ["5000"])[0]) or 5000, limit)
    start = int((query.get("pageToken") or ["0"])[0] or 0)
    body = {key: items[start:start + size]}
    if start + size < len(items):
        body["nextPageToken"] = str(start + size)  # Opaque to clients; absent on the last page.
    return 200, body


def route(catalog: Catalog, path: str, query: dict, headers: dict) -> tuple[int, dict]:
    project = headers.get("x-goog-user-project", "")
    with catalog.lock:
        catalog.requests.append({"path": path, "query": query, "project": project,
                                 "authorization": headers.get("authorization", "")})
        if not headers.get("authorization", "").startswith("Bearer "):
            return 401, {"error": {"code": 401, "status": "UNAUTHENTICATED",
                                   "message": "Request is missing required authentication credential."}}
        if project in catalog.disabled_projects:
            return _error(403, "PERMISSION_DENIED",
                          f"Cloud Billing API has not been used in project {project} before or it is disabled. "
                          f"Enable it by visiting https://console.developers.google.com/apis/api/"
                          f"cloudbilling.googleapis.com/overview?project={project} then retry.",
                          "SERVICE_DISABLED", project)
        if catalog.rate_limited_calls:
            catalog.rate_limited_calls -= 1
            return _error(429, "RESOURCE_EXHAUSTED",
                          "Quota exceeded for quota metric 'Read requests' and limit 'Read requests per minute' "
                          "of service 'cloudbilling.googleapis.com'.", "RATE_LIMIT_EXCEEDED", project)
        if path == "/v1/services":
            return _page(catalog.services, "services", query, catalog.page_limit)
        if path == f"/v1/services/{COMPUTE_ID}/skus":
            return _page(catalog.skus, "skus", query, catalog.page_limit)
        if path.startswith("/v1/services/") and path.endswith("/skus"):
            return 200, {"skus": []}
    return 404, {"error": {"code": 404, "status": "NOT_FOUND", "message": f"stand-in: no route for {path}"}}


class CatalogServer(TlsServer):
    """The catalog over HTTPS on ``address``:443, where cloudbilling.googleapis.com points."""

    def __init__(self, catalog: Catalog, address: str, context):
        catalog_ref = catalog

        class Handler(QuietHandler):
            def do_GET(self):
                parsed = urlparse(self.path)
                headers = {k.lower(): v for k, v in self.headers.items()}
                query = parse_qs(parsed.query)
                code, payload = discovery.serve("cloudbilling.v1", "GET", parsed.path, query, None, lambda call: (
                    catalog_ref.identity is not None and compute_auth.esf_refusal(catalog_ref.identity, headers, call))
                    or route(catalog_ref, parsed.path, query, headers))
                if catalog_ref.answer_seconds:
                    time.sleep(catalog_ref.answer_seconds)  # Models a slow server; nothing waits on it.
                send_json(self, code, payload)

        self.catalog = catalog
        super().__init__(address, context, Handler)
