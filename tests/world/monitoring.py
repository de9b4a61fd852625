"""A Cloud Monitoring stand-in behind monitoring.googleapis.com: projects.timeSeries.list, for the
quota usage series tfcluster reads (serviceruntime.googleapis.com/quota/allocation/usage).

Derived from Google's discovery document monitoring.v3.json (google-api-python-client's
discovery_cache): the method's path (v3/{+name}/timeSeries, GET), its query parameters (each known,
enums valid: aggregation.*, filter, interval.startTime / endTime, orderBy, pageSize, pageToken,
view FULL|HEADERS; plus Google's system parameters), and the response schema
(ListTimeSeriesResponse: timeSeries[] of TimeSeries with metric {type, labels}, resource {type,
labels}, metricKind, valueType, points[] {interval {startTime, endTime}, value {int64Value}}):
every answer is checked against it, so a field or enum value Google does not have fails the test.

Behaviour (https://cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.timeSeries/list,
https://cloud.google.com/monitoring/api/v3/filters, https://cloud.google.com/monitoring/api/metrics_gcp):
- The filter selects one metric type, ANDed with equalities on resource.type, resource.labels.KEY,
  metric.labels.KEY (also the singular `label`); anything else this stand-in cannot read is 400
  INVALID_ARGUMENT, as Google answers a filter it cannot parse. interval.endTime is required.
- serviceruntime.googleapis.com/quota/allocation/usage on consumer_quota (labels project_id,
  service, location; metric label quota_metric): a GAUGE INT64 point per quota in use, repeated at
  least every 24 hours while unchanged. The world reports the family quotas its instances hold
  (tests/world/quotas.py), with the family as a metric label (``family_labels``; off: series of the
  region without it, every family together), and its Compute metrics in use.
- No token 401; the API off 403 SERVICE_DISABLED; ``refused`` 403 PERMISSION_DENIED ("Permission
  monitoring.timeSeries.list denied (or the resource may not exist).").
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import lru_cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from tests.world import compute_auth
from tests.world import quotas as table
from tests.world.cloudquotas import SYSTEM_PARAMETERS
from tests.world.http import send_json

MONITORING_NAMES = ("monitoring.googleapis.com",)
USAGE = "serviceruntime.googleapis.com/quota/allocation/usage"
TERM = re.compile(r'\s*(?P<key>[a-z_.]+(?:\."?[a-zA-Z0-9_]+"?)?)\s*=\s*"(?P<value>[^"]*)"\s*')


@lru_cache(maxsize=1)
def document() -> dict:
    import googleapiclient

    path = Path(googleapiclient.__file__).parent / "discovery_cache" / "documents" / "monitoring.v3.json"
    return json.loads(path.read_text())


def method() -> dict:
    return document()["resources"]["projects"]["resources"]["timeSeries"]["methods"]["list"]


def check_response(value, schema: dict, where: str = "ListTimeSeriesResponse") -> None:
    """Raise AssertionError where ``value`` does not fit ``schema`` (a discovery schema or $ref)."""
    schemas = document()["schemas"]
    if "$ref" in schema:
        schema = schemas[schema["$ref"]]
    kind = schema.get("type")
    if kind == "object" and "properties" in schema:
        assert isinstance(value, dict), f"{where}: not an object"
        for key, item in value.items():
            assert key in schema["properties"], f"{where}: the stand-in answered a field Google does not have: {key}"
            check_response(item, schema["properties"][key], f"{where}.{key}")
    elif kind == "object":
        assert isinstance(value, dict), f"{where}: not a map"
        for key, item in value.items():
            check_response(item, schema.get("additionalProperties", {}), f"{where}.{key}")
    elif kind == "array":
        assert isinstance(value, list), f"{where}: not a list"
        for index, item in enumerate(value):
            check_response(item, schema["items"], f"{where}[{index}]")
    elif kind == "string":
        assert isinstance(value, str), f"{where}: not a string ({schema.get('format', '')})"
        if "enum" in schema:
            assert value in schema["enum"], f"{where}: {value!r} is not one of Google's values"
    elif kind in ("number", "integer"):
        assert isinstance(value, (int, float)) and not isinstance(value, bool), f"{where}: not a number"
    elif kind == "boolean":
        assert isinstance(value, bool), f"{where}: not a boolean"


def _error(code: int, status: str, message: str, reason: str = "") -> tuple[int, dict]:
    error = {"code": code, "message": message, "status": status}
    if reason:
        error["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason,
                             "domain": "googleapis.com", "metadata": {"service": "monitoring.googleapis.com"}}]
    return code, {"error": error}


def parse_filter(text: str) -> dict | None:
    """{key: value} of a conjunction of equalities, or None when it is not one."""
    terms = {}
    for part in re.split(r"\s+AND\s+", text.strip()):
        found = TERM.fullmatch(part)
        if not found:
            return None
        key = found["key"].replace(".label.", ".labels.").replace('"', "")
        terms[key] = found["value"]
    return terms if "metric.type" in terms else None


@dataclass
class Monitoring:
    """Switches a test flips."""

    # The caller lacks monitoring.timeSeries.list (roles/monitoring.viewer).
    refused: bool = False
    # Usage series name their family (gpu_family / vm_family) as a metric label.
    family_labels: bool = True
    requests: list = field(default_factory=list)


class MonitoringServer:
    def __init__(self, monitoring: Monitoring, compute, enabled, address: str, context):
        self.monitoring, self.compute, self.enabled = monitoring, compute, enabled
        server_ref = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                parsed = urlparse(self.path)
                code, payload = server_ref.route(parsed.path, parse_qs(parsed.query, keep_blank_values=True),
                                                 dict(self.headers))
                send_json(self, code, payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((address, 443), Handler)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def series(self, project: str, end: str) -> list[dict]:
        """Every quota usage series the world has now."""
        state = self.compute

        def one(quota_metric: str, location: str, labels: dict, value: float) -> dict:
            return {"metric": {"type": USAGE, "labels": {"quota_metric": quota_metric, **labels}},
                    "resource": {"type": "consumer_quota", "labels": {"project_id": project, "service":
                                                                      "compute.googleapis.com", "location": location}},
                    "metricKind": "GAUGE", "valueType": "INT64",
                    "points": [{"interval": {"startTime": end, "endTime": end}, "value": {"int64Value": str(int(value))}}]}

        found = []
        for quota_id, region, family, value in table.family_usage(state):
            metric, label = table.FAMILY_METRICS[quota_id]
            found.append(one(metric, region, {label: family} if self.monitoring.family_labels else {}, value))
        for region in table.regions(state):
            for metric, (_, usage) in table.region_quotas(state, region).items():
                if usage:
                    found.append(one(f"compute.googleapis.com/{metric.lower()}", region, {}, usage))
        for metric, (_, usage) in table.project_quotas(state).items():
            if usage:
                found.append(one(f"compute.googleapis.com/{metric.lower()}", "global", {}, usage))
        return found

    def route(self, path: str, query: dict, headers: dict) -> tuple[int, dict]:
        self.monitoring.requests.append((path, query))
        _, refused = compute_auth.principal(self.compute, headers)
        if refused:
            return refused
        match = re.fullmatch(r"/v3/projects/(?P<project>[^/]+)/timeSeries", path)
        if match is None:
            return _error(404, "NOT_FOUND", f"The requested URL {path} was not found on this server.")
        if not self.enabled("monitoring.googleapis.com"):
            return _error(403, "PERMISSION_DENIED", f"Cloud Monitoring API has not been used in project "
                          f"{match['project']} before or it is disabled. Enable it by visiting https://console."
                          f"developers.google.com/apis/api/monitoring.googleapis.com/overview?project="
                          f"{match['project']} then retry.", "SERVICE_DISABLED")
        parameters = method()["parameters"]
        for key, values in query.items():
            known = parameters.get(key)
            if known is None and key not in SYSTEM_PARAMETERS:
                return _error(400, "INVALID_ARGUMENT", f'Invalid JSON payload received. Unknown name "{key}": Cannot '
                              f"bind query parameter. Field '{key}' could not be found in request message.")
            if known and known.get("enum") and values[0] not in known["enum"] and not values[0].isdigit():
                return _error(400, "INVALID_ARGUMENT", f"Invalid value at '{key}' ({known['enum'][0].split('_')[0]}),"
                              f' "{values[0]}"')
        if not (query.get("interval.endTime") or [""])[0]:
            return _error(400, "INVALID_ARGUMENT", "Field interval.endTime had an invalid value: must be set.")
        wanted = parse_filter((query.get("filter") or [""])[0])
        if wanted is None:
            return _error(400, "INVALID_ARGUMENT", f"Field filter had an invalid value of \"{query.get('filter', [''])[0]}\""
                          ": the filter must name one metric.type and equalities joined by AND.")
        if self.monitoring.refused:
            return _error(403, "PERMISSION_DENIED", "Permission monitoring.timeSeries.list denied (or the resource may "
                          "not exist).", "IAM_PERMISSION_DENIED")
        end = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

        def keep(series: dict) -> bool:
            for key, value in wanted.items():
                scope, _, rest = key.partition(".")
                part = series[scope] if scope in ("metric", "resource") else {}
                found = part.get("type") if rest == "type" else part.get("labels", {}).get(rest.removeprefix("labels."))
                if found != value:
                    return False
            return True

        body = {"timeSeries": [s for s in self.series(match["project"], end) if keep(s)]}
        if not body["timeSeries"]:
            body = {}
        check_response(body, method()["response"])
        return 200, body

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
