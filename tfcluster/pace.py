"""Where a run is and when it ends: epoch, step of steps, images per second and the ETA, from the
chief's events (trainer/events.py: ``epoch_begin`` gives the epochs, ``first_step`` and ``step`` the
step of steps and the global batch; a script's ``tfcluster.progress(step, total)`` the step of its
total). The speed is the shared median step time (tfcluster/steptime.py), so the ETA follows the same
measure as the stall limit and the budget. The launcher's live line and `status` read it."""

from __future__ import annotations

from dataclasses import dataclass, field

import tfcluster.ui as ui
from tfcluster.steptime import StepClock


@dataclass
class Pace:
    # The run's epochs (None: not reported, a script) and the epoch now (1-based).
    epochs: int | None = None
    epoch: int | None = None
    # The step within the epoch and the steps per epoch (the trainer), or the global step and the
    # total (a script's progress events).
    step: int | None = None
    steps: int | None = None
    # Images per step (the global batch), when the events carry it.
    batch: int | None = None
    # When the last step event was written (epoch seconds, the worker's clock).
    last_at: float | None = None
    # The chief's step events, for the median step time.
    clock: StepClock = field(default_factory=StepClock)

    def observe(self, event: dict) -> None:
        kind = event.get("event")
        if kind == "epoch_begin":
            self.epochs = event.get("epochs") or self.epochs
            self.epoch = event.get("epoch") or self.epoch
        elif kind in ("first_step", "step"):
            self.epoch = event.get("epoch") or self.epoch
            self.step, self.steps = event.get("step"), event.get("steps") or self.steps
            self.batch = event.get("batch") or self.batch
        elif kind == "progress":
            self.step, self.steps = event.get("step"), event.get("total") or self.steps
        elif kind == "epoch_end" and self.steps:
            self.epoch, self.step = event.get("epoch") or self.epoch, self.steps  # Every step of it is done.
        if kind in ("first_step", "step", "progress"):
            self.last_at = event.get("time", self.last_at)
            self.clock.observe(event)

    @property
    def started(self) -> bool:
        return self.step is not None

    def images_per_second(self) -> float | None:
        median = self.clock.median_step_seconds
        return self.batch / median if self.batch and median else None

    def steps_left(self) -> int | None:
        if self.step is None or not self.steps:
            return None
        left = max(0, self.steps - self.step)
        if self.epochs and self.epoch:  # The trainer: steps count within an epoch.
            left += max(0, self.epochs - self.epoch) * self.steps
        elif self.epochs is not None or self.epoch is not None:
            return None  # Epochs but not how many: no end to count to.
        return left

    def eta_seconds(self) -> float | None:
        median, left = self.clock.median_step_seconds, self.steps_left()
        return median * left if median is not None and left is not None else None

    def position(self) -> str:
        """"epoch 2/5 · step 120/400" (a script: "step 120/400"), or "" before any step."""
        parts = []
        if self.epoch:
            parts.append(f"epoch {self.epoch}/{self.epochs or '?'}")
        if self.step is not None:
            parts.append(f"step {self.step}/{self.steps or '?'}")
        return " · ".join(parts)

    def line(self, eta: bool = True) -> str:
        """"epoch 2/5 · step 120/400 · 812 images/s · ETA 3m12s", with what is known (``eta``: with it)."""
        parts = [self.position()] if self.position() else []
        rate, left = self.images_per_second(), self.eta_seconds()
        if rate:
            parts.append(f"{rate:,.0f} images/s")
        elif self.clock.median_step_seconds:
            parts.append(f"{self.clock.median_step_seconds:.3g} s/step")
        if eta and left is not None:
            parts.append(f"ETA {ui.duration(left)}")
        return " · ".join(parts)


def of_events(events: list[dict]) -> Pace:
    pace = Pace()
    for event in events:
        pace.observe(event)
    return pace
