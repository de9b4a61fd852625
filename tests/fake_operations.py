"""Zonal operations of the Compute stand-in (tests/fake_compute.py): they run on a clock,
PENDING -> RUNNING -> DONE, and apply their effect when DONE. Sources are cited in
fake_compute's docstring (zoneOperations reference, google-api-core's ExtendedOperation,
the resource-availability and Spot preemption pages)."""

from __future__ import annotations

import itertools
import time
from datetime import datetime, timezone

_COUNTER = itertools.count(1)


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def new_operation(state, project: str, zone: str, kind: str, target: str,
                   seconds: float, apply=None, error: dict | None = None) -> dict:
    """Record a PENDING operation that is DONE ``seconds`` from now; ``apply`` runs at DONE."""
    name = f"operation-{int(time.time() * 1000)}-{next(_COUNTER):06d}"
    record = {"kind": "compute#operation", "id": str(next(_COUNTER)), "name": name, "operationType": kind,
              "status": "PENDING", "progress": 0, "insertTime": _now_iso(),
              "targetLink": f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}/instances/{target}",
              "zone": f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}",
              "selfLink": f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}/operations/{name}"}
    with state.lock:
        state.operations[name] = {"json": record, "done_at": time.monotonic() + seconds, "apply": apply,
                                  "error": error}
    return dict(record)


def advance(state) -> None:
    """Move every operation along the clock: RUNNING once seen, DONE (effect applied) when due."""
    now = time.monotonic()
    with state.lock:
        for entry in state.operations.values():
            record = entry["json"]
            if record["status"] == "DONE":
                continue
            if now < entry["done_at"]:
                record.update(status="RUNNING", progress=50, startTime=record.get("startTime") or _now_iso())
                continue
            if entry["apply"] is not None:
                entry["apply"]()
            record.update(status="DONE", progress=100, endTime=_now_iso())
            record.setdefault("startTime", record["endTime"])
            if entry["error"] is not None:
                record.update(entry["error"])


# What runs on an instance: a change asked meanwhile is refused (preemptions are Google's own).
CHANGES = ("insert", "start", "stop", "delete", "setMetadata", "setScheduling", "setLabels", "resume")


def busy(state, project: str, zone: str, name: str) -> tuple[int, dict] | None:
    """Compute's refusal of a change to an instance while another operation on it is not DONE:
    400 resourceNotReady, "The resource '...' is not ready" (Compute's error reasons,
    https://cloud.google.com/compute/docs/reference/rest/v1/instances; googleapis/google-cloud-java#9312
    met it in the client's own smoke test)."""
    with state.lock:
        running = any(entry["json"]["status"] != "DONE" and entry["json"]["operationType"] in CHANGES
                      and entry["json"]["targetLink"].endswith(f"/zones/{zone}/instances/{name}")
                      for entry in state.operations.values())
    if not running:
        return None
    message = f"The resource 'projects/{project}/zones/{zone}/instances/{name}' is not ready"
    return 400, {"error": {"code": 400, "message": message,
                           "errors": [{"message": message, "domain": "global", "reason": "resourceNotReady"}]}}


def capacity_error(project: str, zone: str, code: str = "ZONE_RESOURCE_POOL_EXHAUSTED", machine: str = "",
                   attachment: str = "") -> dict:
    """The error a zonal operation ends with when the zone (or its region) has no capacity: the
    codes and messages of https://cloud.google.com/compute/docs/troubleshooting/troubleshooting-resource-availability
    ("Common error messages"), HTTP 503. REGION_RESOURCE_POOL_EXHAUSTED's message is the zone's
    wording for the region (the page lists the code, not its text)."""
    message = (f"The zone 'projects/{project}/zones/{zone}' does not have enough resources available to "
               "fulfill the request.  Try a different zone, or try again later.")
    if code == "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS":
        message = (f"A {machine} VM instance with {attachment} is currently unavailable in the {zone} zone. "
                   "Capacity changes frequently, so try your request in a different zone, with a different VM "
                   "hardware configuration, or at a later time. For more options, see troubleshooting documentation.")
    elif code == "REGION_RESOURCE_POOL_EXHAUSTED":
        message = (f"The region 'projects/{project}/regions/{zone.rsplit('-', 1)[0]}' does not have enough "
                   "resources available to fulfill the request.  Try a different region, or try again later.")
    return {"httpErrorStatusCode": 503, "httpErrorMessage": "SERVICE UNAVAILABLE",
            "error": {"errors": [{"code": code, "message": message}]}}


def preempt_instance(state, name: str) -> None:
    """Google preempts a Spot VM: it stops, and zoneOperations lists a compute.instances.preempted
    operation for it (see the module docstring)."""
    from tests.fake_compute import stop_instance

    zone = state.instances[name]["zone"]
    stop_instance(state, name)
    new_operation(state, state.project, zone, "compute.instances.preempted", name, 0.0)
    with state.lock:
        state.operations[list(state.operations)[-1]]["json"].update(
            status="DONE", progress=100, endTime=_now_iso(), statusMessage="Instance was preempted.")


def start_effect(state, name: str):
    def boot() -> None:
        instance = state.instances.get(name)
        if instance is None or instance["status"] == "RUNNING":
            return
        instance["external_ip"] = state.next_external_ip.pop(name, instance.get("internal_ip"))
        if callable(state.on_start):
            state.on_start(name, instance["external_ip"])
        instance["started"] = _now_iso()
        instance["status"] = "RUNNING"
        if state.guests_report_ready:
            return
        # The boot script reports readiness with the nonce of this boot (startup/startup.sh).
        nonce = instance.get("metadata", {}).get("tfcluster-boot-nonce", "")
        instance["guest"]["tfcluster/ready"] = f"{nonce}:ok"

    return boot
