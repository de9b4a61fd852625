"""The cost ledger: every start and stop of a cluster's machines, kept after `down`, and the spend
figures computed from it.

    <state_dir>/ledger/<cluster>.jsonl    one JSON object a line, appended, never rewritten

Outside ``clusters/`` (removed by `down`), so `invoke costs` still lists a cluster that is gone.
Four kinds of line: ``{"type": "event", ...}`` (Event: a machine started, stopped, was preempted,
was seen halted, was deleted), ``{"type": "prices", ...}`` (Prices: the hourly rates in use, with
their source and date, appended whenever they change), ``{"type": "storage", ...}`` (Storage: what
the bucket and the registry held when looked at) and ``{"type": "cluster", "at": ...}`` (a cluster
of this name was created then: a later cluster that reuses the name starts a new generation, and
each generation's figures are its own). Figures (Figures) are computed from the lines, never stored.

Each spell is priced with the prices in force while it ran ("You pay the Spot price that is in
effect when your instances are running", https://cloud.google.com/compute/docs/instances/spot#pricing):
a spell that spans a price change is split there, and time before the first prices line takes the
first one. Storage samples likewise. Each start of a machine bills at least a minute ("a 1-minute
minimum", https://cloud.google.com/compute/vm-instance-pricing#billing_model). A cloud backend records its events with Compute's own timestamps
(tfcluster/backends/gcp/spend/ledger_events.py); Compute keeps only the last start and stop of a VM, so
this file is the only full history.

For the budget: ``cluster_spent_usd(state_dir, cluster)``, what the cluster has cost so far at the
prices in use (0.0 without prices: own hosts).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

# Event kinds: a start (or creation), and what ends a running spell: our stop, a Spot preemption,
# a halt seen as TERMINATED (the watchdog, the hypervisor deadline), a deletion (ends the disk too).
START, STOP, PREEMPTED, TERMINATED_SEEN, DELETE = "start", "stop", "preempted", "terminated_seen", "delete"
HALTS = (STOP, PREEMPTED, TERMINATED_SEEN)
# Event sources: tfcluster's own operation, an operation Compute lists (a preemption, someone
# else's delete), or a change seen in the machine's state and timestamps.
OWN, COMPUTE_OPERATION, OBSERVED = "own operation", "compute operation", "observed"
# Google bills each start of a VM for at least this long (the module docstring).
MINIMUM_SECONDS = 60.0
# What a running machine bills an hour (Prices.on_demand / spot keys), and a stopped one.
RUNNING_PARTS = ("vm", "gpu", "disk", "ip", "ssd")


@dataclass(frozen=True)
class Event:
    """One start or stop of one machine."""

    # When it happened (epoch seconds): Compute's own timestamp where it has one.
    at: float
    # The cloud instance name (gcp) or the worker name (local, ssh).
    instance: str
    # START, STOP, PREEMPTED, TERMINATED_SEEN or DELETE.
    kind: str
    # OWN, COMPUTE_OPERATION or OBSERVED.
    source: str
    # The run active when it was recorded ("" when none).
    run: str = ""
    # Where the time came from (lastStartTimestamp, an operation's name...).
    detail: str = ""


@dataclass(frozen=True)
class Prices:
    """The hourly rates of one machine, as they were when recorded."""

    # When recorded (epoch seconds).
    at: float
    # USD per hour of one machine, on-demand and Spot: {"vm": .., "gpu": .., "disk": ..}.
    on_demand: dict
    spot: dict
    # Whether the machines are Spot.
    spot_in_use: bool
    # GPUs per machine, and machines in the cluster (for the cluster's hourly rate).
    gpu_count: int
    workers: int
    # The day the prices are of, and where they came from (the catalog, or tfcluster's table).
    date: str
    source: str
    # USD per GiB-hour of the bucket (Standard storage) and of the registry (Artifact Registry).
    bucket_gib_hour: float = 0.0
    registry_gib_hour: float = 0.0
    # Read from the live catalog (None in lines written before this field: told by the source).
    live: bool | None = None
    # USD per hour of one Flex-start machine ({} where it has none), and whether the machines are Flex-start.
    flex: dict = field(default_factory=dict)
    flex_in_use: bool = False
    # The machines run on a reservation (the reservation's name): the project pays its hours whether used or
    # not, so a VM on it costs nothing more than its disk and address ("A VM consuming a reservation doesn't
    # incur separate charges", https://cloud.google.com/compute/docs/instances/reservations-overview).
    reservation: str = ""

    @property
    def in_use(self) -> dict:
        if self.reservation:
            return {**self.on_demand, "vm": 0.0, "gpu": 0.0, "ssd": 0.0}
        if self.flex_in_use and self.flex:
            return self.flex
        return self.spot if self.spot_in_use else self.on_demand

    @property
    def is_live(self) -> bool:
        return self.live if self.live is not None else self.source.startswith("Cloud Billing Catalog")

    @property
    def for_budget(self) -> dict:
        """What a budget counts (cost.Quote.for_budget): Spot at the on-demand rate without live prices."""
        return self.on_demand if not self.is_live else self.in_use

    def same_rates(self, other: "Prices | None") -> bool:
        return other is not None and (self.on_demand, self.spot, self.spot_in_use, self.gpu_count, self.workers,
                                      self.date, self.is_live, self.flex, self.flex_in_use, self.reservation) == (
            other.on_demand, other.spot, other.spot_in_use, other.gpu_count, other.workers, other.date, other.is_live,
            other.flex, other.flex_in_use, other.reservation)


def running_rate(rates: dict) -> float:
    """USD an hour of one running machine at ``rates`` (its VM, GPUs, disk, address, Local SSD)."""
    return sum(rates.get(part, 0.0) for part in RUNNING_PARTS)


def in_force(history: list[Prices], begin: float, end: float) -> list[tuple[float, float, Prices]]:
    """[begin, end) cut where the prices change: (from, to, the prices in force then). Time before the
    first prices line takes the first one."""
    if not history or end <= begin:
        return []
    cuts = [p.at for p in history[1:] if begin < p.at < end]
    edges = [begin, *cuts, end]
    pieces = []
    for start, stop in zip(edges, edges[1:]):
        current = [p for p in history if p.at <= start]
        pieces.append((start, stop, current[-1] if current else history[0]))
    return pieces


@dataclass(frozen=True)
class Storage:
    """What the cluster's bucket and registry held when looked at; it holds until the next look."""

    # When (epoch seconds).
    at: float
    # Bytes in the bucket (old versions included) and in the registry's images.
    bucket_bytes: int
    registry_bytes: int


@dataclass
class Figures:
    """What a cluster (or a run, its time window) cost."""

    # Hours machines ran (summed over machines), and GPU-hours in them.
    vm_hours: float = 0.0
    gpu_hours: float = 0.0
    # Hours machines stood stopped with their disk (which bills).
    stopped_disk_hours: float = 0.0
    # Machine-hours of work done again after preemptions (resumed checkpoint to the step reached).
    redone_hours: float = 0.0
    # GiB-hours stored in the bucket and in the registry.
    bucket_gib_hours: float = 0.0
    registry_gib_hours: float = 0.0
    # Whether a machine still bills (started, or stopped with its disk, and not deleted).
    open: bool = False
    # The latest prices (None: own hosts, hours only); each hour is priced with those in force then.
    prices: Prices | None = None
    # Per instance: its running hours (for the check against Compute).
    per_instance: dict = field(default_factory=dict)
    # USD: at the prices in use, at on-demand rates, as a budget counts them, and the storage part.
    machines_cost: float = 0.0
    on_demand_cost: float = 0.0
    budget_cost: float = 0.0
    storage_cost: float = 0.0

    @property
    def storage_usd(self) -> float:
        """The bucket and the registry (the same whatever the VMs' provisioning model)."""
        return 0.0 if self.prices is None else self.storage_cost

    @property
    def cost_usd(self) -> float | None:
        """At the prices in force during each spell; None without prices."""
        return None if self.prices is None else self.machines_cost + self.storage_cost

    @property
    def on_demand_usd(self) -> float | None:
        return None if self.prices is None else self.on_demand_cost + self.storage_cost

    @property
    def budget_usd(self) -> float | None:
        return None if self.prices is None else self.budget_cost + self.storage_cost

    @property
    def spot_saving_usd(self) -> float | None:
        """On-demand minus Spot for the same hours (0 when the machines were never Spot)."""
        return None if self.prices is None else self.on_demand_cost - self.machines_cost

    @property
    def redone_usd(self) -> float | None:
        if self.prices is None:
            return None
        return self.redone_hours * running_rate(self.prices.in_use)

    def words(self) -> str:
        """One line: the cost (or hours only), then the hours, the Spot saving and redone work."""
        hours = (f"{self.vm_hours:.2f} VM-hours" + (f", {self.gpu_hours:.2f} GPU-hours" if self.gpu_hours else "")
                 + f", {self.stopped_disk_hours:.2f} stopped-disk hours")
        if self.prices is None:
            redone = f", {self.redone_hours:.2f} VM-hours redone after preemptions" if self.redone_hours else ""
            return f"{hours}{redone} (own hosts: no prices)"
        text = f"${self.cost_usd:.2f} ({hours}"
        if self.prices.reservation:
            text += (f"; on reservation {self.prices.reservation}: no cost beyond it for the VMs (its hours are "
                     f"billed whether used or not), ${self.spot_saving_usd:.2f} against on-demand")
        elif self.prices.spot_in_use or self.prices.flex_in_use:
            text += (f"; {'Flex-start' if self.prices.flex_in_use else 'Spot'} saved ${self.spot_saving_usd:.2f} "
                     "against on-demand")
        if self.bucket_gib_hours or self.registry_gib_hours:
            text += (f"; storage ${self.storage_usd:.2f}: bucket {self.bucket_gib_hours:.2f} GiB-hours, "
                     f"registry {self.registry_gib_hours:.2f} GiB-hours")
        if self.redone_hours:
            text += f"; ${self.redone_usd:.2f} of it work redone after preemptions"
        return text + ")"

    def source(self) -> str:
        return "" if self.prices is None else f"prices of {self.prices.date}: {self.prices.source}"


class Ledger:
    """One cluster's ledger file."""

    def __init__(self, state_dir: Path, cluster: str):
        self.cluster = cluster
        self.path = Path(state_dir) / "ledger" / f"{cluster}.jsonl"

    def _lines(self) -> list[dict]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        lines = []
        for line in text.splitlines():
            try:
                lines.append(json.loads(line))
            except ValueError:
                continue  # A line cut by a crash mid-write: the others stand.
        return lines

    def events(self) -> list[Event]:
        fields = {f.name for f in dataclasses.fields(Event)}
        found = [Event(**{k: v for k, v in line.items() if k in fields})
                 for line in self._lines() if line.get("type") == "event"]
        return sorted(found, key=lambda e: e.at)

    def price_history(self) -> list[Prices]:
        """Every prices line, oldest first."""
        fields = {f.name for f in dataclasses.fields(Prices)}
        found = [Prices(**{k: v for k, v in line.items() if k in fields})
                 for line in self._lines() if line.get("type") == "prices"]
        return sorted(found, key=lambda p: p.at)

    def prices(self) -> Prices | None:
        """The latest prices recorded."""
        history = self.price_history()
        return history[-1] if history else None

    def generations(self) -> list[float]:
        """When each cluster of this name was created, oldest first (none in ledgers older than the marker)."""
        return sorted({float(line["at"]) for line in self._lines() if line.get("type") == "cluster" and "at" in line})

    def note_cluster(self, created_at: float) -> None:
        """Mark a cluster's creation once: a later cluster of the same name starts a new generation."""
        if created_at is not None and float(created_at) not in self.generations():
            self._append([{"type": "cluster", "at": float(created_at)}])

    def storage(self) -> list[Storage]:
        fields = {f.name for f in dataclasses.fields(Storage)}
        return sorted((Storage(**{k: v for k, v in line.items() if k in fields})
                       for line in self._lines() if line.get("type") == "storage"), key=lambda s: s.at)

    def note_storage(self, storage: Storage) -> None:
        self._append([{"type": "storage", **dataclasses.asdict(storage)}])

    def instances(self) -> set[str]:
        return {event.instance for event in self.events()}

    def _append(self, records: list[dict]) -> None:
        if not records:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = "".join(json.dumps(record, sort_keys=True) + "\n" for record in records)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, data.encode())  # One write in append mode: two writers never interleave a line.
        finally:
            os.close(fd)

    def append(self, events: list[Event]) -> None:
        self._append([{"type": "event", **dataclasses.asdict(event)} for event in events])

    def note_prices(self, prices: Prices | None) -> None:
        """Record ``prices`` when they differ from the last recorded."""
        if prices is not None and not prices.same_rates(self.prices()):
            self._append([{"type": "prices", **dataclasses.asdict(prices)}])

    def figures(self, start: float | None = None, end: float | None = None, now: float | None = None,
                redone_seconds: float = 0.0) -> Figures:
        """The cluster's figures, or a run's between ``start`` and ``end`` (a run still going: ``now``),
        each hour priced with the prices in force then (the module docstring)."""
        now = time.time() if now is None else now
        history = self.price_history()
        spells = spells_of(self.events(), now)
        low, high = start if start is not None else float("-inf"), min(end if end is not None else now, now)
        figures = Figures(prices=history[-1] if history else None, open=any(s[3] for s in spells))
        for instance, kind, (begin, finish), _ in spells:
            if kind == "running":  # At least a minute per start, billed even if the window ends sooner.
                finish = max(finish, begin + MINIMUM_SECONDS)
                top = end if end is not None else float("inf")
            else:
                top = high
            span = (max(begin, low), min(finish, top))
            hours = max(0.0, span[1] - span[0]) / 3600
            if kind == "running":
                figures.vm_hours += hours
                figures.per_instance[instance] = figures.per_instance.get(instance, 0.0) + hours
            else:
                figures.stopped_disk_hours += hours
            for piece_from, piece_to, prices in in_force(history, *span):
                piece = (piece_to - piece_from) / 3600
                rate = running_rate if kind == "running" else (lambda rates: rates["disk"])
                figures.machines_cost += piece * rate(prices.in_use)
                figures.on_demand_cost += piece * rate(prices.on_demand)
                figures.budget_cost += piece * rate(prices.for_budget)
        samples = self.storage()
        for sample, after in zip(samples, samples[1:] + [None]):
            span = (max(sample.at, low), min(after.at if after else now, high))
            hours = max(0.0, span[1] - span[0]) / 3600
            figures.bucket_gib_hours += sample.bucket_bytes / 2**30 * hours
            figures.registry_gib_hours += sample.registry_bytes / 2**30 * hours
            for piece_from, piece_to, prices in in_force(history, *span):
                piece = (piece_to - piece_from) / 3600
                figures.storage_cost += piece * (sample.bucket_bytes / 2**30 * prices.bucket_gib_hour
                                                 + sample.registry_bytes / 2**30 * prices.registry_gib_hour)
        prices = figures.prices
        workers = prices.workers if prices else len(figures.per_instance) or 1
        figures.gpu_hours = figures.vm_hours * (prices.gpu_count if prices else 0)
        figures.redone_hours = redone_seconds / 3600 * workers
        return figures


def spells_of(events: list[Event], now: float) -> list[tuple[str, str, tuple[float, float], bool]]:
    """(instance, "running" or "stopped", (from, to), still open) for each spell between events.
    A start while running, or a halt while stopped, changes nothing (the earlier one holds)."""
    spells = []
    state: dict[str, tuple[str, float]] = {}
    for event in sorted(events, key=lambda e: e.at):
        current = state.get(event.instance)
        if event.kind == START and (current is None or current[0] == "stopped"):
            if current is not None:
                spells.append((event.instance, "stopped", (current[1], event.at), False))
            state[event.instance] = ("running", event.at)
        elif event.kind in HALTS and current is not None and current[0] == "running":
            spells.append((event.instance, "running", (current[1], event.at), False))
            state[event.instance] = ("stopped", event.at)
        elif event.kind == DELETE and current is not None:
            spells.append((event.instance, current[0], (current[1], event.at), False))
            del state[event.instance]
    spells += [(name, kind, (since, max(since, now)), True) for name, (kind, since) in state.items()]
    return spells


def redone_seconds(samples: list[tuple[float, int]], median_step_seconds: float | None) -> float:
    """Seconds of work done twice: at each restart (a step that does not move past the one before,
    tfcluster/steptime.py's samples of the chief), the steps from the resumed one back to the step
    reached before it, at the median step time."""
    if not median_step_seconds:
        return 0.0
    steps = 0
    for (_, before), (_, after) in zip(samples, samples[1:]):
        if after <= before:
            steps += before - (after - 1)
    return steps * median_step_seconds


def run_figures(state_dir: Path, cluster: str, run, now: float | None = None) -> Figures:
    """A run's figures: the cluster's machines over the run's time, and its redone work."""
    return Ledger(state_dir, cluster).figures(run.started_at, run.ended_at, now,
                                              float(run.summary.get("redone_seconds") or 0.0))


def cluster_spent_usd(state_dir: Path, cluster: str, now: float | None = None, since: float | None = None,
                      for_budget: bool = False) -> float:
    """What ``cluster`` has cost so far (every machine-hour since its first `up`, across restarts),
    at the prices in force then; 0.0 when it has no prices (own hosts) or no ledger yet. ``since``: the
    cluster's creation, so an earlier cluster of the same name (gone with `down`) is not counted.
    ``for_budget``: as a budget counts it (Prices.for_budget: Spot at on-demand without live prices)."""
    figures = Ledger(state_dir, cluster).figures(start=since, now=now)
    return (figures.budget_usd if for_budget else figures.cost_usd) or 0.0


def ledgers(state_dir: Path) -> list[Ledger]:
    """Every cluster's ledger under ``state_dir``, up or gone, by name."""
    folder = Path(state_dir) / "ledger"
    return [Ledger(state_dir, path.stem) for path in sorted(folder.glob("*.jsonl"))] if folder.is_dir() else []
