"""What a run's workers reported through their events and logs, for the live view and the summary
(tfcluster/launch.py follows the logs; tfcluster/commands/attempts.py feeds this)."""

from __future__ import annotations

from dataclasses import dataclass, field
from tfcluster.collective import CollectiveWatch
from tfcluster.pace import Pace
from tfcluster.throughput import ThroughputMeter


@dataclass
class Progress:
    """What the workers reported through events, for the live view and the summary."""

    replicas_in_sync: int | None = None
    epochs: int | None = None
    last_epoch: int = 0
    # First epoch each attempt started at (1 = from scratch).
    resumed_at: dict[int, int] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    model_dir: str | None = None
    keras_path: str | None = None
    saved_model_path: str | None = None
    # The served model's signatures, as `saved_model_cli show --all` prints them.
    signatures: str | None = None
    chance: float | None = None
    first_step_at: float | None = None
    scratch_dirs: dict[int, str] = field(default_factory=dict)
    scratch_removed: list[str] = field(default_factory=list)
    # Each preemption the launcher handled: worker, instance, address, at, attempt, noticed_at,
    # restarted_at (epoch seconds), for run.json and the summary.
    preemptions: list[dict] = field(default_factory=list)
    # Each host-maintenance notice that ended an attempt: worker, instance, event, attempt,
    # noticed_at, restarted_at (tfcluster/commands/maintenance.py).
    maintenance: list[dict] = field(default_factory=list)
    # The chief's strategy event (model, batch, data, devices, learning rate), for the summary.
    strategy: dict = field(default_factory=dict)
    # Every worker's step times and GPU samples, for the throughput figures.
    throughput: ThroughputMeter = field(default_factory=ThroughputMeter)
    # Where the chief is (epoch, step of steps, images/s, ETA), for the live line.
    pace: Pace = field(default_factory=Pace)
    # Every worker's all-reduce and transport, from its log (the summary's `collective` row).
    collective: CollectiveWatch = field(default_factory=CollectiveWatch)

    def update(self, worker: int, event: dict, attempt: int) -> None:
        """One event of worker ``worker`` (its index; 0 is the chief) in attempt ``attempt``."""
        kind = event["event"]
        self.throughput.observe(worker, event)
        if kind in ("scratch_dir", "scratch_removed"):
            target = self.scratch_removed if kind == "scratch_removed" else None
            if target is None:
                self.scratch_dirs[worker] = event.get("path")
            else:
                target.append(event.get("path"))
        if worker != 0:
            return  # Everything else comes from the chief, which sees the global view.
        self.pace.observe(event)
        if kind == "strategy":
            self.replicas_in_sync = event.get("replicas_in_sync")
            self.strategy = event
        elif kind == "first_step" and self.first_step_at is None:
            self.first_step_at = event.get("time")
        elif kind == "epoch_begin":
            self.epochs = event.get("epochs", self.epochs)
            self.resumed_at.setdefault(attempt, event.get("epoch", 1))
        elif kind == "epoch_end":
            self.last_epoch = event.get("epoch", self.last_epoch)
            self.metrics = event.get("metrics", self.metrics)
        elif kind == "done":
            self.metrics = event.get("metrics", self.metrics)
            self.model_dir = event.get("model_dir")
            self.keras_path = event.get("keras_path")
            self.saved_model_path = event.get("saved_model_path")
            self.signatures = event.get("signatures")
            self.chance = event.get("chance")
