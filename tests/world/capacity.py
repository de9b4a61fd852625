"""Capacity in the Compute stand-in (tests/fake_compute.py): room per zone and provisioning model,
Flex-start requests, reservations and the end of a VM's run duration.

What a test sets (``state.capacity``, a ``Capacity``):
- ``room[(zone, model)]``: how many more VMs of a provisioning model (STANDARD, SPOT, FLEX_START)
  the zone takes; absent is no limit. A STANDARD VM on a reservation takes none of it: the
  reservation holds its capacity.
- ``flex_from[zone]``: the moment (time.monotonic()) Dynamic Workload Scheduler finds Flex-start
  capacity there; absent is now.
- ``reservations``: (zone, name) -> Reservation.
- ``end_runs``: the world's clock ends a VM's run duration by itself (off by default: other
  tests stop their VMs with their own deadlines and watchdogs, tests/test_booted_cluster.py).
  ``end_run(state, name)`` ends one now.

Behaviours and their sources:
- Flex-start (provisioningModel FLEX_START):
  - machine types: "Flex-start VMs support all accelerator-optimized machine types (except A4X and
    G4) and H4D machine types" (https://cloud.google.com/compute/docs/instances/about-flex-start-vms):
    an N1 with attached GPUs is refused;
  - the run duration must be "between 10 minutes and seven days" (maxRunDuration; the gcloud and
    REST tabs of https://cloud.google.com/ai-hypercomputer/docs/create/create-vm; the console tab of
    the same page says 46 seconds to 168 hours: the pages disagree, the API's text is kept);
  - the wait: a request with params.requestValidForDuration of 90 s or more makes the VM PENDING
    "In this state, Compute Engine attempts to acquire the necessary resources to start your VM
    until its wait time ends. If Compute Engine acquires the resources within this time ... the VM
    state changes to PROVISIONING. Otherwise, you encounter an error and Compute Engine deletes the
    Flex-start VM. You can optionally delete the Flex-start VM before the wait time ends"
    (https://cloud.google.com/compute/docs/instances/instance-lifecycle); Compute's Instance.status
    enum says PENDING is "waiting for available capacity from Dynamic Workload Scheduler (DWS)"
    (compute.v1.json). The insert's operation stays RUNNING meanwhile. Without a wait time (unset
    or 0 s) "Compute Engine only allocates resources if they are immediately available" (the
    create-vm page above), so the insert fails at once when the zone has none. Neither page gives
    the expiry's error text: the world ends the operation with the resource-availability error
    (ZONE_RESOURCE_POOL_EXHAUSTED, tests/fake_operations.py capacity_error);
  - at the end of the run duration "Compute Engine automatically stops or deletes the VMs based on
    the termination action" (about-flex-start-vms), as for any VM with maxRunDuration
    (https://cloud.google.com/compute/docs/instances/limit-vm-runtime).
- Reservations (https://cloud.google.com/compute/docs/instances/reservations-overview and
  .../reservations-consume):
  - reservations.get, .list and .aggregatedList answer the Reservation resource (compute.v1.json:
    specificReservation.count, inUseCount and instanceProperties, specificReservationRequired,
    status); a missing one is 404 notFound;
  - a VM consumes one when it is in the reservation's zone, its properties match exactly (the
    machine type, and the same GPUs: an N1's attached accelerators; an A2/A3/G2 type's come with it)
    and the reservation has room (inUseCount < count). ANY_RESERVATION (the default when the body
    has no reservationAffinity) takes a matching reservation that does not require targeting
    (specificReservationRequired unset); NO_RESERVATION never consumes one; SPECIFIC_RESERVATION
    (key compute.googleapis.com/reservation-name) must consume the named one or the insert is refused;
  - "You can't consume a reservation to create ... Spot VMs or preemptible instances"
    (reservations-consume, Limitations); Google's Flex-start requests set NO_RESERVATION (create-vm
    page above); a SPOT or FLEX_START VM that names a reservation is refused;
  - a DENSE reservation (deploymentType, tests/world/facts.py DENSE_RESERVATIONS) takes only
    RESERVATION_BOUND VMs: any other is refused in Compute's words, and ANY_RESERVATION skips it;
  - refusals, in Compute's words where they were found: a reservation consumed automatically
    cannot be targeted by name ("Specified reservations [projects/P/reservations/NAME] can not be
    targeted as specificReservationRequired is not set", skypilot-org/skypilot#3327); a name not in
    the zone ("Could not find the given reservation with the following name", the fragment
    kubernetes/autoscaler#6006 matches; the rest of the sentence is the world's), a reservation not
    READY ("it requires reservation to be in READY state", the same PR), a provisioning model that
    may not consume ("must use ReservationAffinity of", the same PR). No page gives the text for a
    mismatch or a full reservation; the world's says which;
  - a VM on a reservation reports it in resourceStatus.reservationConsumptionInfo.consumedReservation
    (compute.v1.json, ResourceStatusReservationConsumptionInfo); a stopped or deleted VM gives its
    place back, and a started one consumes again where it may ("A reservation is consumed by
    running VMs": reservations-overview, how reservations work);
  - billing: "You're charged for the reserved resources at the same on-demand rate as running
    VMs ... until the reservation is deleted. A VM consuming a reservation doesn't incur separate
    charges." (reservations-overview).
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from datetime import datetime

from tests.fake_operations import capacity_error, new_operation
from tests.world import facts, placement

BASE = "/compute/v1/projects/(?P<project>[^/]+)"
MODELS = ("STANDARD", "SPOT", "FLEX_START", "RESERVATION_BOUND")
NAME_KEY = "compute.googleapis.com/reservation-name"
# Flex-start's wait and run duration bounds, in seconds (module docstring).
PENDING_FROM = 90
RUN_BOUNDS = (600, 7 * 24 * 3600)


@dataclass
class Reservation:
    """One zonal, specific-SKU reservation of the project."""

    name: str
    zone: str
    machine_type: str
    # VMs it holds.
    count: int
    # instanceProperties.guestAccelerators: [(accelerator type, count)] (attached GPUs of an N1).
    accelerators: tuple = ()
    # Only VMs that name it may consume it.
    specific_required: bool = False
    status: str = "READY"
    # Reservation.deploymentType (facts.RESERVATION_KINDS): a DENSE one takes RESERVATION_BOUND VMs only.
    deployment_type: str = "DEPLOYMENT_TYPE_UNSPECIFIED"
    # Instance names that consume it now.
    in_use: set = field(default_factory=set)
    created: str = "2026-11-20T08:00:00.000-08:00"


@dataclass
class Capacity:
    room: dict = field(default_factory=dict)
    flex_from: dict = field(default_factory=dict)
    reservations: dict = field(default_factory=dict)
    end_runs: bool = False
    # Flex-start requests waiting: instance name -> (insert operation name, deadline (monotonic)).
    pending: dict = field(default_factory=dict)
    # Compact placement (tests/world/placement.py refusal): zone -> how many more VMs of a COLLOCATED policy
    # Compute can place close together now (unset: any number); ``placement_code`` names the way
    # facts.COMPACT_PLACEMENT_REFUSAL is run ("" for no code, or its alternative code).
    placement_room: dict = field(default_factory=dict)
    placement_code: str = ""


def model_of(body: dict) -> str:
    """The provisioning model of an insert body (an unset one is STANDARD; `preemptible` is Spot)."""
    scheduling = body.get("scheduling") or {}
    model = scheduling.get("provisioningModel") or ""
    if model in MODELS:
        return model
    return "SPOT" if scheduling.get("preemptible") else "STANDARD"


def _error(code: int, reason: str, message: str) -> tuple[int, dict]:
    return code, {"error": {"code": code, "message": message,
                            "errors": [{"message": message, "domain": "global", "reason": reason}]}}


def _gpus(body: dict) -> list[tuple[str, int]]:
    return sorted((a.get("acceleratorType", "").rsplit("/", 1)[-1], int(a.get("acceleratorCount") or 0))
                  for a in body.get("guestAccelerators") or [])


def matches(reservation: Reservation, zone: str, body: dict) -> str | None:
    """Why a VM of ``body`` in ``zone`` cannot consume ``reservation`` (None when it can)."""
    machine = (body.get("machineType") or "").rsplit("/", 1)[-1]
    if reservation.zone != zone:
        return f"it is in {reservation.zone}"
    if reservation.machine_type != machine:
        return f"it holds {reservation.machine_type}, not {machine}"
    if sorted(reservation.accelerators) != _gpus(body):
        return f"its GPUs {list(reservation.accelerators) or 'none'} are not the VM's {_gpus(body) or 'none'}"
    return None


def _has_room(reservation: Reservation) -> bool:
    return reservation.status == "READY" and len(reservation.in_use) < reservation.count


def pick_reservation(state, project: str, zone: str, body: dict) -> tuple[Reservation | None, tuple | None]:
    """(the reservation a new or starting VM consumes, or None; Compute's refusal, or None)."""
    capacity = state.capacity
    affinity = body.get("reservationAffinity") or {"consumeReservationType": "ANY_RESERVATION"}
    kind = affinity.get("consumeReservationType") or "ANY_RESERVATION"
    model = model_of(body)
    if kind == "SPECIFIC_RESERVATION":
        if model not in ("STANDARD", "RESERVATION_BOUND"):
            return None, _error(400, "invalid", f"Invalid value for field 'resource.reservationAffinity': VMs with "
                                                f"provisioning model {model} must use ReservationAffinity of "
                                                "NO_RESERVATION.")
        if affinity.get("key") != NAME_KEY or len(affinity.get("values") or []) != 1:
            return None, _error(400, "invalid", "Invalid value for field 'resource.reservationAffinity.key': "
                                                f"'{affinity.get('key')}'. Expected '{NAME_KEY}' and one reservation.")
        name = affinity["values"][0].rsplit("/", 1)[-1]
        found = capacity.reservations.get((zone, name))
        if found is None:
            return None, _error(400, "invalid", "Could not find the given reservation with the following name: "
                                                f"projects/{project}/zones/{zone}/reservations/{name}.")
        if not found.specific_required:
            return None, _error(400, "invalid", "Invalid value for field 'resource.reservationAffinity': Specified "
                                                f"reservations [projects/{project}/reservations/{name}] can not be "
                                                "targeted as specificReservationRequired is not set")
        if found.status != "READY":
            return None, _error(400, "invalid", f"Cannot consume reservation {name}: it requires reservation to be "
                                                f"in READY state (it is {found.status}).")
        if found.deployment_type == "DENSE" and model != "RESERVATION_BOUND":
            return None, _error(400, "invalid", facts.DENSE_RESERVATIONS.quote)
        why = matches(found, zone, body)
        if why:
            return None, _error(400, "invalid", f"Specified reservation {name} does not match the instance's "
                                                f"properties: {why}.")
        if not _has_room(found):
            return None, _error(400, "invalid", f"Specified reservation {name} has no available resources: "
                                                f"{len(found.in_use)} of {found.count} in use.")
        return found, None
    if kind != "ANY_RESERVATION" or model != "STANDARD":
        return None, None
    for (where, _), candidate in sorted(capacity.reservations.items()):
        if where == zone and not candidate.specific_required and _has_room(candidate) \
                and candidate.deployment_type != "DENSE" and matches(candidate, zone, body) is None:
            return candidate, None
    return None, None


def consume(state, name: str, reservation: Reservation | None) -> None:
    """The instance ``name`` runs on ``reservation`` (or on none)."""
    release(state, name)
    if reservation is not None:
        reservation.in_use.add(name)
        state.instances[name]["reservation"] = (reservation.zone, reservation.name)


def release(state, name: str) -> None:
    """A stopped or deleted VM gives its place back."""
    for reservation in state.capacity.reservations.values():
        reservation.in_use.discard(name)
    if name in state.instances:
        state.instances[name].pop("reservation", None)


def _take_room(state, zone: str, model: str) -> bool:
    """Whether the zone has room for one more VM of ``model`` now (taking it)."""
    capacity = state.capacity
    if model == "FLEX_START" and capacity.flex_from.get(zone, 0.0) > time.monotonic():
        return False
    left = capacity.room.get((zone, model))
    if left is None:
        return True
    if left <= 0:
        return False
    capacity.room[(zone, model)] = left - 1
    return True


def insert_refusal(state, project: str, zone: str, body: dict) -> tuple[int, dict] | None:
    """Compute's refusal of the insert at the call (the module docstring), else None."""
    model = model_of(body)
    if model == "FLEX_START":
        machine = (body.get("machineType") or "").rsplit("/", 1)[-1]
        if machine.startswith("n1-"):
            return _error(400, "invalid", f"Invalid value for field 'resource.scheduling.provisioningModel': "
                                          f"'FLEX_START'. Machine type {machine} does not support the Flex-start "
                                          "provisioning model.")
        seconds = int(((body.get("scheduling") or {}).get("maxRunDuration") or {}).get("seconds") or 0)
        if not RUN_BOUNDS[0] <= seconds <= RUN_BOUNDS[1]:
            return _error(400, "invalid", f"Invalid value for field 'resource.scheduling.maxRunDuration': "
                                          f"'{seconds}s'. Flex-start VMs need a run duration between 10 minutes "
                                          "and 7 days.")
    return pick_reservation(state, project, zone, body)[1]


def wait_seconds(body: dict) -> int:
    """params.requestValidForDuration of an insert, in seconds (0 when unset)."""
    return int((((body.get("params") or {}).get("requestValidForDuration") or {}).get("seconds")) or 0)


def admit(state, project: str, zone: str, body: dict, record: dict, boot) -> dict | None:
    """Decide a new VM's fate by its provisioning model and the zone's capacity: None when it is made
    as usual (its insert operation then boots it), else the insert operation to answer (capacity
    refused at once, or a Flex-start request left PENDING). ``record`` is already in state.instances."""
    name = body["name"]
    model = model_of(body)
    reservation, _ = pick_reservation(state, project, zone, body)
    if reservation is not None:
        consume(state, name, reservation)
        return None
    unplaced = placement.refusal(state, project, zone, body)
    if unplaced:
        _forget(state, name)
        return new_operation(state, project, zone, "insert", name, state.other_seconds, error=unplaced)
    if _take_room(state, zone, model):
        return None
    if model == "FLEX_START" and wait_seconds(body) >= PENDING_FROM:
        record["status"] = "PENDING"
        operation = new_operation(state, project, zone, "insert", name, math.inf, apply=boot)
        state.capacity.pending[name] = (operation["name"], time.monotonic() + wait_seconds(body))
        return operation
    _forget(state, name)
    return new_operation(state, project, zone, "insert", name, state.other_seconds,
                         error=capacity_error(project, zone))


def _forget(state, name: str) -> None:
    with state.lock:
        state.instances.pop(name, None)
        state.others["disks"] = set(state.others.get("disks", set())) - {name}


def start_refused(state, name: str) -> bool:
    """A start of a stopped VM finds no room for its model (consuming its reservation again where it may)."""
    instance = state.instances[name]
    body = instance.get("body") or {}
    zone = instance["zone"]
    reservation, _ = pick_reservation(state, state.project, zone, body)
    if reservation is not None:
        consume(state, name, reservation)
        return False
    return not _take_room(state, zone, model_of(body))


def tick(state) -> None:
    """The world's clock: Flex-start requests granted or expired; run durations ended (when on)."""
    now = time.monotonic()
    capacity = state.capacity
    with state.lock:
        for name, (operation, deadline) in list(capacity.pending.items()):
            entry = state.operations.get(operation)
            instance = state.instances.get(name)
            if entry is None or instance is None or instance["status"] != "PENDING":
                capacity.pending.pop(name)
                if entry is not None and entry["done_at"] == math.inf:  # Deleted while it waited.
                    entry.update(done_at=now, apply=None, error=capacity_error(state.project, instance and
                                                                              instance["zone"] or "unknown"))
                continue
            if _take_room(state, instance["zone"], "FLEX_START"):
                capacity.pending.pop(name)
                instance["status"] = "PROVISIONING"
                entry["done_at"] = now
            elif now >= deadline:
                capacity.pending.pop(name)
                _forget(state, name)
                entry.update(done_at=now, apply=None, error=capacity_error(state.project, instance["zone"]))
        if capacity.end_runs:
            for name, instance in list(state.instances.items()):
                seconds = instance.get("max_run_seconds")
                started = instance.get("started")
                if instance["status"] == "RUNNING" and seconds and started and \
                        datetime.fromisoformat(started).timestamp() + seconds <= time.time():
                    end_run(state, name)


def end_run(state, name: str) -> None:
    """The VM's run duration ends: Compute stops or deletes it per its instanceTerminationAction."""
    from tests.fake_compute import stop_instance
    from tests.world.compute_resources import delete_effect

    instance = state.instances[name]
    release(state, name)
    if instance.get("termination_action") == "DELETE":
        delete_effect(state, name)()
        return
    stop_instance(state, name)
    if callable(state.on_stop):
        state.on_stop(name)


def resource_status(state, instance: dict) -> dict:
    """The instance's resourceStatus, where it has one: the reservation it consumes."""
    where = instance.get("reservation")
    if not where:
        return {}
    zone, name = where
    return {"resourceStatus": {"reservationConsumptionInfo": {
        "consumedReservation": f"projects/{state.project}/zones/{zone}/reservations/{name}"}}}


def reservation_json(state, reservation: Reservation) -> dict:
    """A Reservation as Compute answers it (int64 as strings)."""
    link = f"https://www.googleapis.com/compute/v1/projects/{state.project}/zones/{reservation.zone}"
    properties = {"machineType": reservation.machine_type}
    if reservation.accelerators:
        properties["guestAccelerators"] = [{"acceleratorType": kind, "acceleratorCount": count}
                                           for kind, count in reservation.accelerators]
    return {"kind": "compute#reservation", "name": reservation.name, "zone": link,
            "id": str(abs(hash((reservation.zone, reservation.name))) % 10 ** 18),
            "selfLink": f"{link}/reservations/{reservation.name}", "creationTimestamp": reservation.created,
            "specificReservation": {"count": str(reservation.count), "inUseCount": str(len(reservation.in_use)),
                                    "instanceProperties": properties},
            "specificReservationRequired": reservation.specific_required, "status": reservation.status,
            **({"deploymentType": reservation.deployment_type} if reservation.deployment_type == "DENSE" else {})}


def _permission(state, permission: str, path: str) -> tuple[int, dict] | None:
    if permission in state.missing_permissions:
        return _error(403, "forbidden", f"Required '{permission}' permission for '{path.removeprefix('/compute/v1/')}'")
    return None


def route(state, method: str, path: str, query: dict) -> tuple[int, dict] | None:
    """reservations.get / list / aggregatedList (the module docstring), else None."""
    if method != "GET":
        return None
    reservations = state.capacity.reservations
    match = re.fullmatch(BASE + "/zones/(?P<zone>[^/]+)/reservations/(?P<name>[^/]+)", path)
    if match:
        refused = _permission(state, "compute.reservations.get", path)
        if refused:
            return refused
        found = reservations.get((match["zone"], match["name"]))
        if found is None:
            return _error(404, "notFound", f"The resource 'projects/{match['project']}/zones/{match['zone']}/"
                                           f"reservations/{match['name']}' was not found")
        return 200, reservation_json(state, found)
    match = re.fullmatch(BASE + "/zones/(?P<zone>[^/]+)/reservations", path)
    if match:
        refused = _permission(state, "compute.reservations.list", path)
        if refused:
            return refused
        items = [reservation_json(state, r) for (zone, _), r in sorted(reservations.items()) if zone == match["zone"]]
        return 200, {"kind": "compute#reservationList", "items": items}
    if re.fullmatch(BASE + "/aggregated/reservations", path):
        refused = _permission(state, "compute.reservations.list", path)
        if refused:
            return refused
        zones: dict = {}
        for (zone, _), reservation in sorted(reservations.items()):
            zones.setdefault(f"zones/{zone}", {"reservations": []})["reservations"].append(
                reservation_json(state, reservation))
        return 200, {"kind": "compute#reservationAggregatedList", "items": zones}
    return None


