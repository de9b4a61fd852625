"""Current list prices from the Cloud Billing Catalog API (google-cloud-billing over REST).

How Google publishes them (https://cloud.google.com/billing/docs/how-to/get-pricing-information-api,
https://cloud.google.com/billing/v1/how-tos/catalog-api, SKU reference
https://cloud.google.com/billing/docs/reference/rest/v1/services.skus/list): services.list names
"Compute Engine"; services.skus.list pages through its SKUs (5000 a page, nextPageToken until the
last). skus.list has no server-side filter (only currency, time range and paging), so the pages are
read here until every SKU we need is found, within a deadline. A SKU is one billed component:
vCPU, RAM and each GPU model are separate SKUs, told apart by `description`, `category`
(resourceGroup, usageType "OnDemand" or "Preemptible" for Spot) and `serviceRegions`; the price is
pricingInfo[-1].pricingExpression.tieredRates[0].unitPrice (units + nanos) per usageUnit.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from tfcluster import gpus

COMPUTE_ENGINE = "Compute Engine"  # Service.displayName in services.list.
PAGE_SIZE = 5000  # The API's default and largest page.
DEADLINE_SECONDS = 20.0  # The whole lookup (services + SKU pages); then the dated table is used.

# The SKU descriptions per component, as the catalog words them ("... running in Americas" or a
# city). Spot SKUs are usageType "Preemptible"; older ones lack the "Spot" prefix. A key is
# (usage type, component): "vcpu"/"memory" for N1, "FAMILY vcpu"/"FAMILY memory" for G2, A2 and A3
# ("A2 Instance Core running in Americas"), the accelerator type for a GPU (tfcluster/gpus.py sku).
_PATTERNS = {
    ("OnDemand", "vcpu"): (r"N1 Predefined Instance Core", "N1Standard", "h"),
    ("OnDemand", "memory"): (r"N1 Predefined Instance Ram", "N1Standard", "GiBy.h"),
    ("Preemptible", "vcpu"): (r"(Spot )?Preemptible N1 Predefined Instance Core", "N1Standard", "h"),
    ("Preemptible", "memory"): (r"(Spot )?Preemptible N1 Predefined Instance Ram", "N1Standard", "GiBy.h"),
    **{(usage, f"{f.name} {part}"): (rf"{'(Spot )?Preemptible ' if usage == 'Preemptible' else ''}{f.sku} {word}",
                                     None, unit)
       for f in gpus.FAMILIES.values() if f.name != "n1" for usage in ("OnDemand", "Preemptible")
       for part, word, unit in (("vcpu", "Core", "h"), ("memory", "Ram", "GiBy.h"))},
    **{("OnDemand", g.accelerator): (g.sku, "GPU", "h") for g in gpus.GPUS.values()},
    **{("Preemptible", g.accelerator): (rf"({g.sku} attached to Spot Preemptible VMs|Preemptible {g.sku})", "GPU", "h")
       for g in gpus.GPUS.values()},
}

# Flex-start VMs (Dynamic Workload Scheduler) bill as SKUs of their own: "DWS Defined Duration A3 Core
# running in Americas", "... A3 Ram ...", "Nvidia H100 80GB GPU attached to DWS Defined Duration VMs running
# in Americas" (as catalog readers quote them; usageType OnDemand, as the catalog's other DWS SKUs). Google
# gives their discount as "up to 53%" for vCPUs, memory and GPUs
# (https://cloud.google.com/ai-hypercomputer/docs/consumption-models). No Flex-start for N1.
FLEX = "FlexStart"
# Only these series' Flex-start VMs are discounted: "For A4, A3, A2, and H4D machine types, you obtain vCPUs,
# memory, and any attached GPUs at a discounted price" (https://cloud.google.com/compute/docs/instances/
# about-flex-start-vms, Pricing). Others (G2 with L4) bill on-demand, and the catalog sells no DWS SKU for them.
FLEX_DISCOUNTED = ("a4", "a3", "a2", "h4d")
_PATTERNS.update({
    **{(FLEX, f"{f.name} {part}"): (rf"DWS Defined Duration {f.name.upper()} {word}", None, unit)
       for f in gpus.FAMILIES.values() if f.name in FLEX_DISCOUNTED
       for part, word, unit in (("vcpu", "Core", "h"), ("memory", "Ram", "GiBy.h"))},
    **{(FLEX, g.accelerator): (rf"{g.sku} attached to DWS Defined Duration VMs", "GPU", "h")
       for g in gpus.GPUS.values() if g.family in FLEX_DISCOUNTED},
})
# The catalog's usageType of each key's SKUs where it is not the key's own.
CATALOG_USAGE = {FLEX: "OnDemand"}
# What on-demand and Spot prices need (Flex-start's are read where the catalog has them).
_REQUIRED = {key for key in _PATTERNS if key[0] != FLEX}


def flex_discounted(machine_type: str) -> bool:
    """Whether the machine type's Flex-start VMs bill at DWS prices (FLEX_DISCOUNTED), not on-demand."""
    return machine_type.split("-", 1)[0] in FLEX_DISCOUNTED


def flex_needs(machine_type: str, accelerator: str) -> set:
    """The Flex-start keys of a VM: none for N1, which has no Flex-start, nor for a series whose Flex-start
    VMs bill on-demand (G2)."""
    if not flex_discounted(machine_type):
        return set()
    family = machine_type.split("-", 1)[0]
    return {(FLEX, f"{family} vcpu"), (FLEX, f"{family} memory"), (FLEX, accelerator)}


def needs(machine_type: str, accelerator: str) -> set:
    """The (usage, component) keys a VM of ``machine_type`` with ``accelerator`` GPUs is priced from."""
    family = machine_type.split("-", 1)[0]
    parts = ("vcpu", "memory") if family == "n1" else (f"{family} vcpu", f"{family} memory")
    return {(usage, part) for usage in ("OnDemand", "Preemptible") for part in (*parts, accelerator)}


@dataclass(frozen=True)
class Rates:
    """USD per hour of what a tfcluster VM is made of, on one provisioning model."""

    # Per vCPU-hour of an N1 predefined machine type.
    vcpu_hour: float
    # Per GiB-hour of N1 memory.
    memory_gib_hour: float
    # Per GPU-hour, by accelerator type (nvidia-tesla-t4, nvidia-l4, ...).
    gpu_hour: dict
    # G2, A2, A3: family -> [per vCPU-hour, per GiB-hour].
    family_hour: dict = field(default_factory=dict)

    def vm_hour(self, machine_type: str) -> float:
        """The machine type's vCPUs and memory for an hour (tfcluster/gpus.py shapes)."""
        vcpus, memory = gpus.shape_of(machine_type)
        family = machine_type.split("-", 1)[0]
        vcpu, ram = (self.vcpu_hour, self.memory_gib_hour) if family == "n1" else self.family_hour[family]
        return vcpus * vcpu + memory * ram


class CatalogUnavailable(Exception):
    """The catalog could not give the prices; the message is one line saying why."""


def _price(sku) -> float | None:
    """USD per usage unit of the latest pricing, from its first tier (the catalog's tiers start at 0)."""
    if not sku.pricing_info:
        return None
    rates = sku.pricing_info[-1].pricing_expression.tiered_rates  # Chronological: the last is current.
    if not rates:
        return None
    money = rates[0].unit_price
    if money.currency_code and money.currency_code != "USD":
        return None
    return money.units + money.nanos / 1e9


def match_skus(skus, region: str) -> dict:
    """(usage type, component) -> USD per hour (per GiB-hour for memory), for the SKUs in ``skus``
    that are offered in ``region``. Commitments, custom and sole-tenant SKUs never match. Two SKUs
    with different prices for one component make that component unknown, not a guess."""
    found: dict = {}
    ambiguous: set = set()
    for sku in skus:
        if region not in sku.service_regions:
            continue
        for key, (pattern, group, unit) in _PATTERNS.items():
            usage, _ = key
            if sku.category.usage_type != CATALOG_USAGE.get(usage, usage) or (
                    group and sku.category.resource_group != group):
                continue
            if not re.fullmatch(rf"{pattern} running in [A-Za-z .-]+", sku.description):
                continue
            if sku.pricing_info and sku.pricing_info[-1].pricing_expression.usage_unit != unit:
                continue
            price = _price(sku)
            if price is None:
                continue
            if key in found and abs(found[key] - price) > 1e-12:
                ambiguous.add(key)
            found.setdefault(key, price)
    return {key: price for key, price in found.items() if key not in ambiguous}


def rates_from(found: dict, wanted: set | None = None) -> tuple[Rates, Rates] | None:
    """(on-demand, spot) Rates when every component in ``wanted`` (default: all) was found, else None."""
    if not (wanted or _REQUIRED) <= set(found):
        return None
    on_demand, spot = ({"gpu_hour": {}, "family_hour": {}, "vcpu_hour": 0.0, "memory_gib_hour": 0.0},
                       {"gpu_hour": {}, "family_hour": {}, "vcpu_hour": 0.0, "memory_gib_hour": 0.0})
    for (usage, component), price in found.items():
        if usage == FLEX:
            continue
        into = on_demand if usage == "OnDemand" else spot
        if component in ("vcpu", "memory"):
            into[{"vcpu": "vcpu_hour", "memory": "memory_gib_hour"}[component]] = price
        elif " " in component:
            family, part = component.split()
            into["family_hour"].setdefault(family, [0.0, 0.0])[part == "memory"] = price
        else:
            into["gpu_hour"][component] = price
    return Rates(**on_demand), Rates(**spot)


def flex_rates(found: dict, machine_type: str, accelerator: str) -> Rates | None:
    """Flex-start Rates from the catalog's DWS Defined Duration SKUs in ``found``, or None when it lacks one;
    a series whose Flex-start VMs bill on-demand (G2) gets its on-demand Rates."""
    if not machine_type.startswith("n1-") and not flex_discounted(machine_type):
        both = rates_from(found, {key for key in needs(machine_type, accelerator) if key[0] == "OnDemand"})
        return both[0] if both else None
    wanted = flex_needs(machine_type, accelerator)
    if not wanted or not wanted <= set(found):
        return None
    family = machine_type.split("-", 1)[0]
    return Rates(vcpu_hour=0.0, memory_gib_hour=0.0, gpu_hour={accelerator: found[(FLEX, accelerator)]},
                 family_hour={family: [found[(FLEX, f"{family} vcpu")], found[(FLEX, f"{family} memory")]]})


def missing(found: dict, wanted: set | None = None) -> list[str]:
    words = {"Preemptible": "Spot", FLEX: "Flex-start"}
    return sorted(f"{component} ({words.get(usage, 'on-demand')})"
                  for usage, component in (wanted or _REQUIRED) - set(found))


def read_skus(project: str, regions: list[str], wanted: set, deadline_seconds: float = DEADLINE_SECONDS) -> dict:
    """Region -> {(usage, component): USD}, reading SKU pages until every region has every
    ``wanted`` component or the pages end; CatalogUnavailable with a one-line reason otherwise."""
    found: dict = {region: {} for region in regions}

    def page(skus) -> bool:
        for region in regions:
            for key, price in match_skus(skus, region).items():
                found[region].setdefault(key, price)
        return all(wanted <= set(prices) for prices in found.values())

    _pages(project, page, deadline_seconds)
    return found


def read_catalog(project: str, region: str, deadline_seconds: float = DEADLINE_SECONDS,
                 wanted: set | None = None) -> tuple[Rates, Rates]:
    """(on-demand, spot) Rates for ``region`` (every component in ``wanted``, default all), read now
    through the real client; CatalogUnavailable with a one-line reason otherwise. No retry: a
    refusal or a slow catalog means the dated table."""
    wanted = wanted or _REQUIRED
    found = read_skus(project, [region], wanted, deadline_seconds)[region]
    rates = rates_from(found, wanted)
    if rates is None:
        raise CatalogUnavailable(f"no price in {region} for {', '.join(missing(found, wanted))}")
    return rates


def catalog_problem(project: str, deadline_seconds: float = DEADLINE_SECONDS) -> str:
    """Why live prices cannot be read ("" when the catalog answers): its services' first page."""
    try:
        _pages(project, lambda skus: True, deadline_seconds, skus=False)
    except CatalogUnavailable as error:
        return str(error)
    return ""


def _pages(project: str, take, deadline_seconds: float, skus: bool = True) -> None:
    """Feed each SKU page to ``take`` until it answers True or the pages end (``skus`` False: only
    ask for the services, to learn whether the catalog answers)."""
    import warnings

    import google.auth
    from google.api_core import exceptions as api
    from google.auth import exceptions as auth
    from google.cloud import billing_v1

    from tfcluster.backends.gcp.cloud.errors import from_exception

    deadline = time.monotonic() + deadline_seconds

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise CatalogUnavailable(f"the SKU list took longer than {deadline_seconds:.0f} s")
        return remaining

    try:
        with warnings.catch_warnings():  # google-auth warns about end-user credentials; not our line.
            warnings.simplefilter("ignore")
            # The quota project is the cluster's (x-goog-user-project): user credentials need one,
            # and a disabled Cloud Billing API is then named in that project.
            credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-billing.readonly"],
                                                 quota_project_id=project)
            client = billing_v1.CloudCatalogClient(transport="rest", credentials=credentials)
            services = client.list_services(request={"page_size": PAGE_SIZE}, timeout=left(), retry=None)
            service = next((s for s in services if s.display_name == COMPUTE_ENGINE), None)
            if service is None:
                raise CatalogUnavailable(f"the catalog lists no {COMPUTE_ENGINE!r} service")
            if not skus:
                return
            token = ""
            while True:
                page = client.list_skus(request={"parent": service.name, "page_size": PAGE_SIZE,
                                                 "page_token": token}, timeout=left(), retry=None)
                # One page per call (the pager reads its first page; its attributes are that
                # response's): the pager would reuse one timeout for every page.
                if take(page.skus):
                    return
                token = page.next_page_token
                if not token:
                    return
                left()
    except CatalogUnavailable:
        raise
    except api.TooManyRequests:
        # https://cloud.google.com/billing/docs/how-to/get-pricing-information-api: quota-limited per
        # project; no retry here, the table is good enough for an estimate.
        raise CatalogUnavailable("Google rate-limited the catalog (429), try again in a minute") from None
    except (api.GoogleAPICallError, auth.GoogleAuthError) as error:
        mapped = from_exception(error, project, "catalog")
        reason = str(mapped).removeprefix("catalog: ") if mapped else type(error).__name__
        raise CatalogUnavailable(reason.split(", then re-run")[0].splitlines()[0][:200]) from None
    except (api.RetryError, OSError) as error:
        if time.monotonic() >= deadline - 0.1:  # The last request's timeout was what was left.
            raise CatalogUnavailable(f"the SKU list took longer than {deadline_seconds:.0f} s") from None
        raise CatalogUnavailable(f"cannot reach cloudbilling.googleapis.com ({type(error).__name__})") from None
