"""A Cloud Quotas API stand-in behind cloudquotas.googleapis.com: QuotaInfos, read-only, in the REST
shapes google-cloud-quotas' CloudQuotasClient (transport "rest") sends and reads.

No discovery document exists for Cloud Quotas (google-api-python-client has none), so the client's
own types are the contract (google-cloud-quotas 0.6.3):
- Methods and paths from google/cloud/cloudquotas_v1/services/cloud_quotas/transports/rest_base.py:
  GET /v1/{name=projects/*/locations/*/services/*/quotaInfos/*} (GetQuotaInfo) and
  GET /v1/{parent=projects/*/locations/*/services/*}/quotaInfos (ListQuotaInfos, pageSize and
  pageToken, nextPageToken until the last page).
- Every query parameter must be a field of the request message (GetQuotaInfoRequest,
  ListQuotaInfosRequest in types/cloudquotas.py) or one of Google's system parameters; any other is
  400 "Invalid JSON payload received. Unknown name ...: Cannot bind query parameter."
  (https://cloud.google.com/apis/docs/system-parameters; the text Google's REST front end gives).
- Every answer is parsed back into the proto types with unknown fields refused
  (google.protobuf.json_format.Parse); one that does not parse is recorded as the world leaving
  Google's description (tests/world/discovery.py), so a field or enum value the client does not
  know fails the test that saw it; resources.py: QuotaInfo (quotaId, metric, service, isPrecise, containerType,
  dimensions, dimensionsInfos[].dimensions / .details.value (int64, a JSON string) /
  .applicableLocations), "The ID component following locations/ must be global".
- The values are the world's quota table (tests/world/quotas.py): every Compute metric as
  METRIC-per-project-region (or -per-project), and the family quotas.
- Cloud Quotas is a client-based API (tests/world/facts.py, QUOTA_PROJECT): user credentials without a
  quota project (no x-goog-user-project header) are refused 403 in Google's words; a service account's
  own project is its quota project.
- Errors in Google's JSON shape (https://cloud.google.com/apis/design/errors): no token 401
  UNAUTHENTICATED; the API off 403 SERVICE_DISABLED; ``refused`` 403 PERMISSION_DENIED
  ("Permission 'cloudquotas.quotas.get' denied on resource ..."); an unknown quota ID 404 NOT_FOUND.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field

from tests.world import compute_auth, discovery, facts
from tests.world import quotas as table
from tests.world.discovery import SYSTEM_PARAMETERS
from tests.world.http import JsonGetServer, google_error

CLOUDQUOTAS_NAMES = ("cloudquotas.googleapis.com",)
SERVICE = "compute.googleapis.com"


_error = functools.partial(google_error, "cloudquotas.googleapis.com")


def quota_project_refusal(state, headers: dict, api: str) -> tuple[int, dict] | None:
    """Google's 403 when a user's credentials name no quota project (facts.QUOTA_PROJECT: a service
    account's own project is its quota project); None otherwise."""
    if compute_auth.bearer(headers) not in state.user_tokens or headers.get("x-goog-user-project"):
        return None
    return google_error(api, 403, "PERMISSION_DENIED", facts.NO_QUOTA_PROJECT_MESSAGE.format(api=api),
                        "SERVICE_DISABLED")


def _request_fields(message) -> set[str]:
    """The JSON names of a request message's fields (what query parameters may bind to)."""
    return {f.json_name for f in type(message).pb(message).DESCRIPTOR.fields}


def checked(payload: dict, message_type) -> dict:
    """``payload`` as the client will parse it: unknown fields or enum values raise."""
    from google.protobuf import json_format

    json_format.Parse(json.dumps(payload), message_type.pb(message_type()), ignore_unknown_fields=False)
    return payload


def answered(payload: dict, message_type) -> tuple[int, dict]:
    """A 200 answer, recorded as a break of the client's types when it is not one (the test that saw
    it fails at teardown, tests/world/discovery.py), and sent as it is."""
    try:
        checked(payload, message_type)
    except Exception as error:  # noqa: BLE001 - json_format's ParseError, or a type error inside it
        discovery.violation(f"cloudquotas_v1 (google-cloud-quotas' types): the world's "
                            f"{message_type.__name__} answer does not parse: {error}")
    return 200, payload


def _info(state, quota_id: str, project: str) -> dict | None:
    """The QuotaInfo of ``quota_id`` from the world's quota table, or None when there is none."""
    name = f"projects/{project}/locations/global/services/{SERVICE}/quotaInfos/{quota_id}"
    base = {"name": name, "quotaId": quota_id, "service": SERVICE, "isPrecise": True,
            "containerType": 1,  # PROJECT; the client asks for `$alt=json;enum-encoding=int`.
            "quotaIncreaseEligibility": {"isEligible": True}}
    if quota_id in table.FAMILY_METRICS:
        metric, label = table.FAMILY_METRICS[quota_id]
        rows = [{"dimensions": dims, "details": {"value": str(int(value))} if value else {},
                 "applicableLocations": [dims["region"]] if "region" in dims else table.regions(state)}
                for dims, value in table.family_rows(state, quota_id)]
        return {**base, "metric": metric, "dimensions": [label, "region"], "dimensionsInfos": rows,
                "quotaDisplayName": "GPUs per GPU family" if label == "gpu_family" else "CPUs per VM family"}
    found = re.fullmatch(r"(?P<metric>[A-Z0-9-]+)-per-project(?P<regional>-region)?", quota_id)
    if not found:
        return None
    metric = found["metric"].replace("-", "_")
    if found["regional"]:
        limits = {region: table.region_quotas(state, region) for region in table.regions(state)}
        rows = [{"dimensions": {"region": region}, "details": {"value": str(int(quotas[metric][0]))}
                 if quotas[metric][0] else {}, "applicableLocations": [region]}
                for region, quotas in limits.items() if metric in quotas]
        if not rows:
            return None
        dimensions = ["region"]
    else:
        quotas = table.project_quotas(state)
        if metric not in quotas:
            return None
        rows = [{"details": {"value": str(int(quotas[metric][0]))} if quotas[metric][0] else {},
                 "applicableLocations": ["global"]}]
        dimensions = []
    return {**base, "metric": f"compute.googleapis.com/{metric.lower()}", "dimensions": dimensions,
            "dimensionsInfos": rows}


@dataclass
class CloudQuotas:
    """Switches a test flips, as Google's side would change."""

    # The caller lacks cloudquotas.quotas.get (roles/cloudquotas.viewer).
    refused: bool = False
    # Every request: (path, query).
    requests: list = field(default_factory=list)


class CloudQuotasServer:
    """The API over HTTPS on ``address``:443."""

    def __init__(self, quotas: CloudQuotas, compute, enabled, address: str, context, services: dict | None = None):
        # services: another service's QuotaInfos, service -> infos(project) (Vertex AI's: tests/world/vertex.py).
        self.quotas, self.compute, self.enabled, self.services = quotas, compute, enabled, dict(services or {})
        self.http = JsonGetServer(address, context, self.route)
        self.close = self.http.close

    def route(self, path: str, query: dict, headers: dict) -> tuple[int, dict]:
        from google.cloud import cloudquotas_v1

        self.quotas.requests.append((path, query))
        _, refused = compute_auth.principal(self.compute, headers)
        if refused:
            return refused
        refused = quota_project_refusal(self.compute, headers, "cloudquotas.googleapis.com")
        if refused:
            return refused
        if not self.enabled("cloudquotas.googleapis.com"):
            project = (re.match(r"/v1/projects/([^/]+)", path) or [None, "?"])[1]
            return _error(403, "PERMISSION_DENIED", f"Cloud Quotas API has not been used in project {project} before "
                          "or it is disabled. Enable it by visiting https://console.developers.google.com/apis/api/"
                          f"cloudquotas.googleapis.com/overview?project={project} then retry.", "SERVICE_DISABLED")
        get = re.fullmatch(r"/v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/services/(?P<service>[^/]+)"
                           r"/quotaInfos/(?P<quota>[^/]+)", path)
        listed = re.fullmatch(r"/v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/services/"
                              r"(?P<service>[^/]+)/quotaInfos", path)
        match = get or listed
        if match is None:
            return _error(404, "NOT_FOUND", f"The requested URL {path} was not found on this server.")
        request = cloudquotas_v1.GetQuotaInfoRequest() if get else cloudquotas_v1.ListQuotaInfosRequest()
        allowed = _request_fields(request) - {"name", "parent"}
        for key in query:
            if key not in allowed and key not in SYSTEM_PARAMETERS:
                return _error(400, "INVALID_ARGUMENT", f'Invalid JSON payload received. Unknown name "{key}": Cannot '
                              f"bind query parameter. Field '{key}' could not be found in request message.")
        if match["location"] != "global":
            return _error(400, "INVALID_ARGUMENT", f"The location must be global (got {match['location']}).")
        if self.quotas.refused:
            return _error(403, "PERMISSION_DENIED", f"Permission 'cloudquotas.quotas.get' denied on resource "
                          f"'{path[4:]}' (or it may not exist).", "IAM_PERMISSION_DENIED")
        if match["service"] in self.services:
            infos = self.services[match["service"]](match["project"])
            if get:
                info = next((i for i in infos if i["quotaId"] == match["quota"]), None)
                return answered(info, cloudquotas_v1.QuotaInfo) if info else \
                    _error(404, "NOT_FOUND", f"QuotaInfo {path[4:]} not found.")
        elif match["service"] != SERVICE:
            return (200, {}) if listed else _error(404, "NOT_FOUND", f"QuotaInfo {path[4:]} not found.")
        if get:
            info = _info(self.compute, match["quota"], match["project"])
            if info is None:
                return _error(404, "NOT_FOUND", f"QuotaInfo {path[4:]} not found.")
            return answered(info, cloudquotas_v1.QuotaInfo)
        if match["service"] in self.services:
            infos = self.services[match["service"]](match["project"])
        else:
            ids = [f"{m.replace('_', '-')}-per-project-region" for m in table.NEW_PROJECT_REGION]
            ids += [f"{m.replace('_', '-')}-per-project" for m in table.NEW_PROJECT] + list(table.FAMILY_METRICS)
            infos = [info for info in (_info(self.compute, quota_id, match["project"]) for quota_id in sorted(ids))
                     if info]
        size = int((query.get("pageSize") or ["50"])[0] or 50)
        start = int((query.get("pageToken") or ["0"])[0] or 0)
        body = {"quotaInfos": infos[start:start + size]}
        if start + size < len(infos):
            body["nextPageToken"] = str(start + size)
        return answered(body, cloudquotas_v1.ListQuotaInfosResponse)
