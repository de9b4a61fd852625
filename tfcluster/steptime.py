"""The median step time, from the chief's step events.

One measure, shared by everything that reasons about a run's speed: the run summary's
throughput, the stall limit and the budget's projection. It reads the ``first_step`` and
``step`` events of ``trainer/events.py`` (each carries its time, epoch, step within the epoch
and, when known, the steps per epoch) and takes the median over the intervals between them,
so a slow first step (graph building, the first data fetch) or one slow backup does not
skew it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

STEP_EVENTS = ("first_step", "step", "progress")


@dataclass
class StepClock:
    # (event time in epoch seconds, global step) of each step event, in arrival order.
    samples: list[tuple[float, int]] = field(default_factory=list)
    # Steps per epoch, from the first event that carries it (needed to make steps global).
    steps_per_epoch: int | None = None
    # Seconds per step of each interval between two consecutive samples of one attempt.
    intervals: list[float] = field(default_factory=list)
    # The same intervals by the epoch of the event that closes them (1-based).
    epoch_intervals: dict[int, list[float]] = field(default_factory=dict)

    def observe(self, event: dict) -> None:
        """Take one event; anything that is not a step event is ignored."""
        if event.get("event") not in STEP_EVENTS or "time" not in event or "step" not in event:
            return
        now = float(event["time"])
        epoch = max(int(event.get("epoch") or 1), 1)
        if event["event"] == "progress":  # A global step from the script helper.
            step = int(event["step"])  # After a restart it goes back: no interval below.
        else:
            if event.get("steps"):
                self.steps_per_epoch = int(event["steps"])
            step = int(event["step"]) + (epoch - 1) * (self.steps_per_epoch or 0)
        if event["event"] == "first_step":
            self.samples.append((now, step))  # A new attempt: no interval across a restart.
            return
        if self.samples:
            before, before_step = self.samples[-1]
            if step > before_step and now >= before:
                self.intervals.append((now - before) / (step - before_step))
                self.epoch_intervals.setdefault(epoch, []).append(self.intervals[-1])
        self.samples.append((now, step))

    @property
    def median_step_seconds(self) -> float | None:
        """The median seconds per step, or None before two step events of one attempt."""
        return statistics.median(self.intervals) if self.intervals else None

    def epoch_median_step_seconds(self, epoch: int) -> float | None:
        """The median seconds per step of one epoch (1-based), or None without an interval in it."""
        values = self.epoch_intervals.get(epoch)
        return statistics.median(values) if values else None

    @property
    def last_progress_at(self) -> float | None:
        """When the last step event was written (epoch seconds), or None before any."""
        return self.samples[-1][0] if self.samples else None
