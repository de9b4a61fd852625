"""A Cloud Monitoring stand-in behind monitoring.googleapis.com: projects.timeSeries.list, for the
family quota usage series tfcluster reads.

Under Google's discovery document monitoring.v3.json (tests/world/discovery.py): the method's path
(v3/{+name}/timeSeries, GET), its query parameters (each known, enums valid: aggregation.*, filter,
interval.startTime / endTime, orderBy, pageSize, pageToken, view FULL|HEADERS; plus Google's system
parameters), and the response schema (ListTimeSeriesResponse: timeSeries[] of TimeSeries with
metric {type, labels}, resource {type, labels}, metricKind, valueType, points[] {interval
{startTime, endTime}, value {int64Value}}): a request outside it gets Google's 400, and an answer
outside it fails the test that saw it.

Behaviour (https://cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.timeSeries/list,
https://cloud.google.com/monitoring/api/v3/filters):
- The filter selects one metric type, ANDed with equalities on resource.type, resource.labels.KEY,
  metric.labels.KEY (also the singular `label`); anything else this stand-in cannot read is 400
  INVALID_ARGUMENT, as Google answers a filter it cannot parse. interval.endTime is required.
- Which series exist is a fact on no discovery document (tests/world/facts.py, FAMILY_USAGE_SERIES):
  Compute's compute.googleapis.com/quota/<quota>/usage on compute.googleapis.com/Location (labels
  resource_container, location), a GAUGE INT64 point per family in use. The family's label name is
  in doubt: ``family_label`` "dimension" names it as the Cloud Quotas dimension (gpu_family,
  vm_family); "unnamed" carries it under a name the product does not know. ``family_series`` False:
  no such series at all (USAGE_POINTS_ARE_RARE: a real project may show none in the window).
- No token 401; the API off 403 SERVICE_DISABLED; ``refused`` 403 PERMISSION_DENIED ("Permission
  monitoring.timeSeries.list denied (or the resource may not exist)."); ``quota_project_required``
  and user credentials without x-goog-user-project: 403 as Google answers (facts.QUOTA_PROJECT_APIS:
  the world runs Monitoring both ways).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone

from tests.world import compute_auth, discovery, facts
from tests.world import quotas as table
from tests.world.cloudquotas import quota_project_refusal
from tests.world.http import JsonGetServer, google_error

MONITORING_NAMES = ("monitoring.googleapis.com",)
USAGE = facts.FAMILY_USAGE_METRICS[table.GPU_FAMILY][0]
TERM = re.compile(r'\s*(?P<key>[a-z_.]+(?:\."?[a-zA-Z0-9_]+"?)?)\s*=\s*"(?P<value>[^"]*)"\s*')


_error = functools.partial(google_error, "monitoring.googleapis.com")


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
    # How the family usage series name their family (facts.FAMILY_USAGE_SERIES.alternatives).
    family_label: str = facts.FAMILY_USAGE_SERIES.alternatives[0]
    # The series exist at all (facts.USAGE_POINTS_ARE_RARE.alternatives: "present" / "absent").
    family_series: bool = True
    # User credentials must send x-goog-user-project (facts.QUOTA_PROJECT_APIS: in doubt for Monitoring).
    quota_project_required: bool = False
    requests: list = field(default_factory=list)


class MonitoringServer:
    def __init__(self, monitoring: Monitoring, compute, enabled, address: str, context):
        self.monitoring, self.compute, self.enabled = monitoring, compute, enabled
        self.http = JsonGetServer(address, context, lambda path, query, headers: discovery.serve(
            "monitoring.v3", "GET", path, query, None, lambda call: self.route(path, query, headers)))
        self.close = self.http.close

    def series(self, project: str, end: str) -> list[dict]:
        """Every family usage series the world has now (facts.FAMILY_USAGE_SERIES)."""
        if not self.monitoring.family_series:
            return []
        found = []
        for quota_id, region, family, value in table.family_usage(self.compute):
            metric, dimension = facts.FAMILY_USAGE_METRICS[quota_id]
            label = dimension if self.monitoring.family_label == "dimension" else "family_name"
            found.append({"metric": {"type": metric, "labels": {label: family}},
                          "resource": {"type": facts.LOCATION_RESOURCE,
                                       "labels": {"resource_container": project, "location": region}},
                          "metricKind": "GAUGE", "valueType": "INT64",
                          "points": [{"interval": {"startTime": end, "endTime": end},
                                      "value": {"int64Value": str(int(value))}}]})
        return found

    def route(self, path: str, query: dict, headers: dict) -> tuple[int, dict]:
        self.monitoring.requests.append((path, query))
        _, refused = compute_auth.principal(self.compute, headers)
        if refused:
            return refused
        if self.monitoring.quota_project_required:
            refused = quota_project_refusal(self.compute, headers, "monitoring.googleapis.com")
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

        found = [s for s in self.series(match["project"], end) if keep(s)]
        return 200, ({"timeSeries": found} if found else {})
