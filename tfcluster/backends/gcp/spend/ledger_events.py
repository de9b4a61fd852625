"""The cost ledger's events on gcp, read from Compute Engine (tfcluster/ledger.py keeps and sums them).

What Compute tells, and what it forgets:
- An instance carries only its *last* start and stop: lastStartTimestamp and lastStopTimestamp,
  RFC 3339 ([Output Only] "Last start timestamp" / "Last stop timestamp",
  https://cloud.google.com/compute/docs/reference/rest/v1/instances). Each sync records the ones
  not yet in the ledger, at exactly those times, so the ledger keeps every one of them.
- A Spot preemption is a zone operation of type compute.instances.preempted
  (https://cloud.google.com/compute/docs/instances/create-use-preemptible#detecting_if_an_instance_was_preempted);
  a deletion (terraform destroy, the watchdog's delete) one of type "delete", whose endTime is when
  the instance was gone (https://cloud.google.com/compute/docs/reference/rest/v1/zoneOperations:
  operationType, targetLink, insertTime, endTime).
- A VM halted from inside (the watchdog's stop, the hypervisor deadline) leaves no operation of
  ours: it is seen TERMINATED, at its lastStopTimestamp.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from tfcluster import ledger
from tfcluster.backends.gcp.zones import reservations
from tfcluster.backends.gcp.prices.cost import PRICES
from tfcluster.ledger import (COMPUTE_OPERATION, DELETE, HALTS, OBSERVED, OWN, PREEMPTED, START, STOP,
                              TERMINATED_SEEN, Event, Ledger, Prices, Storage)
from tfcluster.state import ClusterState

if TYPE_CHECKING:
    from tfcluster.backends.gcp.cloud.compute import ComputeApi
    from tfcluster.backends.gcp.prices.cost import Quote

# A preemption's operation starts the stop; the instance is TERMINATED within 30 s of it (the
# Spot page's shutdown period). A stop this close after the operation is that preemption.
PREEMPTION_SLACK_SECONDS = 120.0
# Two timestamps of one event as Compute and the ledger hold them (milliseconds in RFC 3339).
SAME_SECONDS = 1.0
# How often `status` and a run's end look at the bucket and the registry again (listing a bucket
# of checkpoints takes a while); `up` and `down` always do.
STORAGE_SAMPLE_SECONDS = 600.0
# The statuses of a VM that stands halted (https://cloud.google.com/compute/docs/instances/instance-life-cycle).
HALTED = ("TERMINATED", "STOPPED", "SUSPENDED")


def epoch(stamp: str) -> float | None:
    return datetime.fromisoformat(stamp).timestamp() if stamp else None


@dataclass(frozen=True)
class Seen:
    """One instance as instances.list shows it now."""

    # RUNNING, TERMINATED, ...
    status: str
    # lastStartTimestamp and lastStopTimestamp (epoch seconds; None when Compute gives none).
    last_start: float | None
    last_stop: float | None


def seen_of(vm) -> Seen:
    return Seen(vm.status, epoch(vm.last_start_timestamp or vm.creation_timestamp), epoch(vm.last_stop_timestamp))


def operations(api, zone: str, kind: str, names: set[str]) -> list[tuple[str, float, str]]:
    """(instance, when, operation name) of the zone's ``kind`` operations on ``names``: a
    preemption at its insertTime, anything else at its endTime (when it was done)."""
    request = api.compute_v1.ListZoneOperationsRequest(project=api.project, zone=zone,
                                                       filter=f'operationType="{kind}"')
    found = []
    for operation in api.zone_operations.list(request=request):
        name = operation.target_link.rsplit("/", 1)[-1]
        stamp = (operation.insert_time if kind == "compute.instances.preempted" else operation.end_time)
        if name in names and stamp and (kind != "delete" or operation.status.name == "DONE"):
            found.append((name, epoch(stamp), operation.name))
    return found


def observe(events: list[Event], seen: dict[str, Seen], preempted: list, deleted: list, own: str, run: str,
            now: float) -> list[Event]:
    """The events Compute shows that the ledger lacks. ``own``: the kind of operation tfcluster just
    made (START, STOP, DELETE, or ""), whose matching events are ours."""
    new: list[Event] = []

    def have(instance: str, kinds, at: float, slack: float = SAME_SECONDS) -> bool:
        return any(e.instance == instance and e.kind in kinds and abs(e.at - at) <= slack for e in events + new)

    def state(instance: str) -> str | None:
        open_ = [kind for name, kind, _, still in ledger.spells_of(events + new, now) if name == instance and still]
        return open_[0] if open_ else None

    for name, at, operation in sorted(preempted, key=lambda item: item[1]):
        vm = seen.get(name)
        if vm and vm.last_stop and -SAME_SECONDS <= vm.last_stop - at <= PREEMPTION_SLACK_SECONDS:
            at = vm.last_stop  # The stop the preemption made, at Compute's own time.
        if not have(name, HALTS, at, PREEMPTION_SLACK_SECONDS):
            new.append(Event(at, name, PREEMPTED, COMPUTE_OPERATION, run, operation))
    for name, at, operation in sorted(deleted, key=lambda item: item[1]):
        earlier = any(e.instance == name and e.at < at for e in events + new)
        if earlier and not have(name, (DELETE,), at):
            new.append(Event(at, name, DELETE, OWN if own == DELETE else COMPUTE_OPERATION, run, operation))
    for name, vm in sorted(seen.items()):
        if vm.last_stop and not have(name, HALTS, vm.last_stop, PREEMPTION_SLACK_SECONDS):
            kind, source = (STOP, OWN) if own == STOP else (TERMINATED_SEEN, OBSERVED)
            new.append(Event(vm.last_stop, name, kind, source, run, "lastStopTimestamp"))
        if vm.last_start and not have(name, (START,), vm.last_start):
            new.append(Event(vm.last_start, name, START, OWN if own == START else OBSERVED, run,
                             "lastStartTimestamp"))
        if vm.status in HALTED and state(name) == "running":  # Halted, and Compute gave no stop time.
            new.append(Event(now, name, TERMINATED_SEEN, OBSERVED, run, f"status {vm.status}"))
    for name in sorted({e.instance for e in events + new} - set(seen)):
        if state(name) is not None:  # Gone from instances.list with no delete operation listed.
            new.append(Event(now, name, DELETE, OWN if own == DELETE else OBSERVED, run, "not listed"))
    return new


def disagreements(events: list[Event], seen: dict[str, Seen]) -> list[str]:
    """Where the ledger's last start or stop of an instance is not Compute's."""
    lines = []
    for name, vm in sorted(seen.items()):
        mine = [e for e in events if e.instance == name]
        for what, kinds, theirs in (("start", (START,), vm.last_start), ("stop", HALTS, vm.last_stop)):
            last = max((e.at for e in mine if e.kind in kinds), default=None)
            if theirs is not None and (last is None or abs(last - theirs) > SAME_SECONDS):
                said = "none" if last is None else datetime.fromtimestamp(last).astimezone().isoformat(timespec="seconds")
                lines.append(f"{name}: the ledger's last {what} is {said}, Compute's last{what.capitalize()}Timestamp "
                             f"{datetime.fromtimestamp(theirs).astimezone().isoformat(timespec='seconds')}")
    return lines


class SpendTracker:
    """Backend.spend_sync on gcp, held by GcpBackend: ``sync`` brings a cluster's cost ledger up to date
    with what Compute shows (starts, stops, preemptions, deletions, the prices in force, storage) and
    returns where the ledger and Compute disagree.

    It needs: ``api(cluster)``, the cluster's ComputeApi; ``workdir(name)``, the cluster's terraform
    folder (whose applied variables say what the VMs are); ``quote(settings, project, zone, workers, spot,
    applied)``, their cost.Quote (prices.Quoter.quote)."""

    def __init__(self, api: Callable[[ClusterState], ComputeApi], workdir: Callable[[str], Path],
                 quote: Callable[..., Quote]):
        self._api, self.workdir, self._quote = api, workdir, quote

    def sync(self, cluster, settings, book: Ledger, own: str = "", run: str = "") -> list[str]:
        from tfcluster.backends.gcp.cloud.errors import translated

        with translated(cluster.project, "reading the VMs' starts and stops for the cost ledger"):
            api = self._api(cluster)
            now = time.time()
            listed = api.list_cluster(cluster.zone, cluster.name)
            seen = {vm.name: seen_of(vm) for vm in listed}
            # On a reservation when every VM consumes one (reservations.py); said by Compute, not assumed.
            held = {reservations.consumed(vm) for vm in listed}
            last = book.prices()
            # No VM listed (after `down`): the last minute's remainder was billed where the VMs ran, so the
            # reservation they were on stays in the prices line.
            on = next(iter(held)) if len(held) == 1 else (last.reservation if not listed and last else "")
            book.note_prices(self._spend_prices(cluster, settings, now, on))
            known = {record.instance for record in cluster.hosts} | book.instances() | set(seen)
            preempted = operations(api, cluster.zone, "compute.instances.preempted", known)
            deleted = operations(api, cluster.zone, "delete", known)
            book.append(observe(book.events(), seen, preempted, deleted, own, run, now))
            samples = book.storage()
            if own in (START, DELETE) or not samples or now - samples[-1].at >= STORAGE_SAMPLE_SECONDS:
                book.note_storage(self._spend_storage(cluster, now, gone=own == DELETE))
            return disagreements(book.events(), seen)

    def _spend_storage(self, cluster, now: float, gone: bool) -> Storage:
        """What the bucket and the registry hold now; nothing once `down` is done (what it kept is
        no longer the cluster's: `down` names it with its monthly cost)."""
        from tfcluster.backends.gcp.cloud.registry import repository_usage
        from tfcluster.backends.gcp.vms.teardown import bucket_usage

        if gone:
            return Storage(now, 0, 0)
        bucket = bucket_usage(cluster.project, cluster.bucket) if cluster.bucket else None
        images = repository_usage(cluster) if cluster.registry else None
        return Storage(now, bucket.size if bucket else 0, images.size if images else 0)

    def _spend_prices(self, cluster, settings, now: float, reservation: str = "") -> Prices | None:
        """The rates of the VMs Terraform made (its variables); None once they are gone with `down`."""
        tfvars = self.workdir(cluster.name) / "terraform.tfvars.json"
        if not tfvars.exists():
            return None
        applied = json.loads(tfvars.read_text())
        quote = self._quote(settings, cluster.project, cluster.zone, len(cluster.hosts),
                            bool(applied.get("spot", settings.spot)), applied)
        part = lambda e: {"vm": e.vm, "gpu": e.gpu, "disk": e.disk, "ip": e.ip, "ssd": e.ssd}  # noqa: E731
        table = json.loads(PRICES.read_text())  # Storage: the table's rates, as `down` prices what it keeps.
        return Prices(at=now, on_demand=part(quote.on_demand), spot=part(quote.spot), spot_in_use=quote.spot_in_use,
                      gpu_count=int(applied.get("gpu_count", settings.gpu_count)), workers=len(cluster.hosts),
                      date=quote.date, source=quote.source.split("; catalog unavailable")[0],
                      bucket_gib_hour=table["standard_storage_gib_month"] / 730,
                      registry_gib_hour=table["artifact_registry"]["storage_gib_month"] / 730,
                      # A Flex-start rate from the table's discount is not live: a budget counts on-demand.
                      live=quote.live and not (quote.flex_in_use and quote.flex_table),
                      flex=part(quote.flex) if quote.flex else {}, flex_in_use=quote.flex_in_use,
                      reservation=reservation)
