"""What `status` shows of each VM of a gcp cluster: its state, how it got its capacity (its
provisioning model, the reservation it consumes), its uptime and its cost so far; and when the
hypervisor deadline stops it.

Compute says each of these on the instance (instances.list / get, compute.v1.json): status,
scheduling.provisioningModel, resourceStatus.reservationConsumptionInfo.consumedReservation,
lastStartTimestamp, scheduling.maxRunDuration. A VM on a reservation costs nothing more while the
reservation exists: "You're charged for the reserved resources at the same on-demand rate as running
VMs ... A VM consuming a reservation doesn't incur separate charges"
(https://cloud.google.com/compute/docs/instances/reservations-overview).
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Callable

from tfcluster.backends.base import VmRow
from tfcluster.backends.gcp.zones import reservations
from tfcluster.backends.gcp.cloud.compute import ComputeApi
from tfcluster.backends.gcp.zones.placement import topology_of
from tfcluster.tfconfig import spread

# Compute's provisioning model in a status line.
MODEL_WORDS = {"SPOT": "Spot", "FLEX_START": "Flex-start", "STANDARD": "on-demand"}


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def how(vm) -> str:
    """How the VM got its capacity, for its status: "Spot", "on-demand, reservation r1"."""
    model = MODEL_WORDS.get(vm.scheduling.provisioning_model or "STANDARD", vm.scheduling.provisioning_model)
    held = reservations.consumed(vm)
    return f"{model}, reservation {held}" if held else model


def rows(cluster, settings, prices, workdir: Path, announce: Callable[[str], None]) -> list[VmRow]:
    """Each VM's state (and how it got its capacity), uptime and cost so far, from instances.list; ``prices``
    (GcpBackend.prices, a prices.Quoter) quotes them, ``workdir`` holds what was applied, ``announce`` says
    the cost and placement lines."""
    api = ComputeApi(cluster.project)
    listed = api.list_cluster(cluster.zone, cluster.name)
    # What the VMs are (Compute's provisioning model, or what was applied), not today's settings.
    tfvars = workdir / "terraform.tfvars.json"
    applied = json.loads(tfvars.read_text()) if tfvars.exists() else {}
    spot = any(vm.scheduling.provisioning_model == "SPOT" for vm in listed) or bool(applied.get("spot", settings.spot))
    quote = prices.quote(settings, cluster.project, cluster.zone, len(cluster.hosts), spot, applied)
    for line in quote.lines():
        announce(line)
    names = {vm.name for vm in listed}
    found = [VmRow(name=r.instance, status="DELETED (`invoke up` re-creates it)", uptime_seconds=0.0, cost_so_far=0.0)
             for r in cluster.hosts if r.instance not in names]
    reserved = []
    for vm in listed:
        started = vm.last_start_timestamp or vm.creation_timestamp
        uptime = max(0.0, time.time() - _epoch(started)) if vm.status == "RUNNING" and started else 0.0
        on_reservation = bool(reservations.consumed(vm))
        reserved += [vm.name] if on_reservation else []
        found.append(VmRow(name=vm.name, status=vm.status, uptime_seconds=uptime, capacity=how(vm),
                           cost_so_far=0.0 if on_reservation else quote.in_use.per_vm * uptime / 3600))
    if reserved:
        announce(f"cost: {', '.join(reserved)} run on a reservation: no cost beyond it (the project pays "
                          "the reservation's hours whether a VM uses them or not)")
    placed = spread([topology_of(vm) for vm in listed])  # resourceStatus.physicalHostTopology, where Compute says.
    if placed:
        announce(f"placement: {placed}")
    return found


def deadlines(api, cluster) -> dict[str, float | None]:
    """When max_run_duration stops each running VM: its last start plus the duration."""
    found = {}
    for record in cluster.hosts:
        instance = api.instance_or_none(cluster.zone, record.instance)
        if instance is None:
            found[record.name] = None
            continue
        seconds = instance.scheduling.max_run_duration.seconds
        started = instance.last_start_timestamp or instance.creation_timestamp
        found[record.name] = (_epoch(started) + seconds if instance.status == "RUNNING" and seconds and started
                              else None)
    return found
