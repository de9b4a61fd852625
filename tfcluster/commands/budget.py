"""`train --budget USD`: the run's dollar cap.

At the start the budget's end time (when the budget runs out at the cluster's hourly rate) goes
to every machine's watchdog, which halts its machine then, laptop or not. After 20 steps the
launcher projects the run's cost from the shared step clock (tfcluster/steptime.py):

    projected = median step time x steps left x hourly rate + what the run spent so far

and when that is over the budget it stops the run, as a stall does, and exits 2 with one line: the
projection, and the largest run that fits. A run that reports step backups (the trainer's
``--backup-every-steps N``, whose "backup" events say so) is stopped right after its next one, at
most N steps on; any other keeps its last backup (an epoch end: a multi-worker trainer on CPU cannot
be made to save on demand). What the run spent
so far is its time since it started at the cluster's rate. A run that reports no total (a script
calling ``tfcluster.progress(step)`` without ``total=``) cannot be projected: only the end time caps it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from tfcluster.money import usd
from tfcluster.steptime import StepClock

# Steps the run makes before its cost is projected (the median needs a few intervals).
CHECK_AFTER_STEPS = 20


@dataclass
class RunBudget:
    # The run this caps.
    run_id: str
    # The budget in USD.
    usd: float
    # The whole cluster's USD per hour while it runs (the backend's prices in use).
    rate: float
    # When the run started (epoch seconds): its spending counts from here.
    started: float
    # The chief's step events.
    clock: StepClock = field(default_factory=StepClock)
    # Epochs of the run, from the trainer's epoch_begin events (None: not reported).
    epochs: int | None = None
    # Total steps of a script's run, from its progress events' "total" (None: not reported).
    total: int | None = None
    # Whether the projection was made (once per launcher).
    checked: bool = False
    # The one-line refusal once the projection is over the budget (None: within it, or not yet known).
    refusal: str | None = None
    # Whether the chief reports step backups ("backup" events): an over-budget run then stops after its next.
    backs_up: bool = False
    # The refusal waiting for that next backup (None: none waiting).
    waiting: str | None = None

    @property
    def end_time(self) -> float:
        """When the budget runs out if the cluster runs from the run's start (epoch seconds)."""
        return self.started + self.usd / self.rate * 3600

    def total_steps(self) -> int | None:
        if self.total:
            return self.total
        per_epoch = self.clock.steps_per_epoch
        return self.epochs * per_epoch if self.epochs and per_epoch else None

    def observe(self, event: dict, now: float | None = None) -> str | None:
        """Take one of the chief's events; returns a note to show when the run cannot be projected."""
        self.clock.observe(event)
        if event.get("event") == "backup":
            self.backs_up = True
            if self.waiting:  # Backed up: now it stops.
                self.refusal, self.waiting = self.waiting, None
        if event.get("event") == "epoch_begin" and event.get("epochs"):
            self.epochs = int(event["epochs"])
        if event.get("event") == "progress" and event.get("total"):
            self.total = int(event["total"])
        samples, median = self.clock.samples, self.clock.median_step_seconds
        if self.checked or not samples or median is None or samples[-1][1] - samples[0][1] < CHECK_AFTER_STEPS:
            return None
        self.checked = True
        total, done = self.total_steps(), samples[-1][1]
        if total is None:
            return (f"--budget: the run reports no total steps, so its cost cannot be projected; the budget's "
                    f"end time ({time.strftime('%H:%M', time.localtime(self.end_time))}) still halts the cluster")
        now = time.time() if now is None else now
        spent = max(0.0, now - self.started) * self.rate / 3600
        left = max(0, total - done)
        projected = spent + median * left * self.rate / 3600
        if projected <= self.usd:
            return None
        fit = done + max(0, math.floor((self.usd - spent) * 3600 / (median * self.rate)))
        per_epoch = self.clock.steps_per_epoch
        epochs = f" (--epochs {fit // per_epoch})" if per_epoch and not self.total else ""
        stop = "after its next backup" if self.backs_up else "and its last backup kept"
        line = (f"run {self.run_id} projected at {usd(projected)} at step {done} (median step {median:.3g} s × "
                f"{left} steps left × ${self.rate:.2f}/h + {usd(spent)} spent) is over --budget {usd(self.usd)}; the "
                f"largest run that fits is {fit} steps{epochs}; the run is stopped {stop}: `invoke train --resume "
                f"{self.run_id}` continues it")
        if self.backs_up:
            self.waiting = line
        else:
            self.refusal = line
        return None
