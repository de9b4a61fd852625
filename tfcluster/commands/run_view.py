"""What the console shows of a run's workers, the same live (`train`) and after (`logs`): each line
with its worker's prefix, TensorFlow's start-up noise folded into one dim line per worker (all of it
with ``verbose``), the chief's events as lines of their own (the strategy, each epoch's end with its
metrics, speed and ETA), and no other event. A script's Keras progress bar (tf_keras redraws it with backspaces and carriage
returns, so a log holds one squashed line per epoch, from every worker) is shown as its final state, the
chief's only; the live line holds each worker's step. `logs --raw` prints the log as it is instead."""

from __future__ import annotations

import re

from tfcluster import launch, tflog, ui
from tfcluster.commands.common import console
from tfcluster.pace import Pace

# The chief's events that say where training is (tfcluster/pace.py).
STEP_EVENTS = ("first_step", "step", "progress")


# tf_keras's Progbar: "  3/13 [=====>....] - ETA: 1s - loss: 1.2" (tf_keras/src/utils/generic_utils.py).
_BAR = re.compile(r"^\s*(\d+/\d+) \[[=>.]*\]")


def keras_bar(line: str) -> str | None:
    """The final state of a Keras progress bar line (its redraws joined by backspaces and carriage
    returns), or None when ``line`` is no bar."""
    if "\r" not in line and "\b" not in line and not _BAR.match(line):
        return None
    drawn = [part.replace("\b", "").strip() for part in line.split("\r")]
    drawn = [part for part in drawn if part]
    return drawn[-1] if drawn and _BAR.match(drawn[-1]) else None


class RunView:
    def __init__(self, plans: list[launch.WorkerPlan], verbose: bool = False, meter=None):
        """``meter``: the run's throughput.ThroughputMeter, given each worker's finished Keras bars (a
        script's only speed report)."""
        self.verbose = verbose
        self.meter = meter
        self.folds = {plan.index: tflog.StartupFold() for plan in plans}
        # Each worker's last Keras bar (a script's progress), for the live line.
        self.bars: dict[int, str] = {}

    def bars_line(self) -> str:
        """"Keras: w0 4/13 · w1 4/13 · w2 3/13" from the workers' last bars ("" before any)."""
        steps = [f"w{index} {match.group(1)}" for index, bar in sorted(self.bars.items())
                 if (match := _BAR.match(bar))]
        return "Keras: " + " · ".join(steps) if steps else ""

    def announce(self, plan: launch.WorkerPlan) -> None:
        """The worker's folded start-up noise as one dim line, once, before its first real output."""
        fold = self.folds[plan.index]
        if fold.hidden and not fold.announced:
            fold.announced = True
            console.print(ui.prefixed(plan.index, plan.name, fold.summary()), style="dim", soft_wrap=True)

    def line(self, plan: launch.WorkerPlan, line: str) -> None:
        if not self.verbose and self.folds[plan.index].hides(line):
            return
        bar = keras_bar(line)
        if self.meter is not None:  # verbose=2 prints an epoch's end as a line of its own.
            self.meter.observe_bar(plan.index, line if bar is None else bar)
        if bar is not None and not self.verbose:  # The chief's stands for all; each worker's step: the live line.
            self.bars[plan.index] = bar
            if plan.index != 0:
                return
            line = bar
        self.announce(plan)
        console.print(ui.prefixed(plan.index, plan.name, line), soft_wrap=True)

    def event(self, plan: launch.WorkerPlan, event: dict, pace: Pace) -> None:
        """``pace``: the chief's, already fed with this event."""
        self.announce(plan)
        if plan.index != 0:
            return
        kind = event["event"]
        if kind == "strategy":
            rate = f", learning rate {event['learning_rate']['text']}" if event.get("learning_rate") else ""
            console.print(ui.prefixed(0, plan.name, f"MultiWorkerMirroredStrategy: "
                                      f"{event.get('replicas_in_sync')} replicas in sync, global batch "
                                      f"{event.get('global_batch')}, shard policy {event.get('shard_policy')}{rate}",
                                      ), style="bold", soft_wrap=True)
        elif kind == "epoch_end":  # Without a terminal, these lines are the progress: one per epoch.
            console.print(ui.prefixed(0, plan.name, f"epoch {event.get('epoch')}/{event.get('epochs')}  "
                                      + ui.format_metrics(event.get("metrics", {})) + pace_after_epoch(pace)),
                          style="bold", soft_wrap=True)

    def finish(self, plans: list[launch.WorkerPlan]) -> None:
        for plan in plans:
            self.announce(plan)  # Workers that printed nothing but noise.


def pace_after_epoch(pace: Pace) -> str:
    """"  · 812 images/s · ETA 1m20s" after an epoch's line, with what is known."""
    rate, eta = pace.images_per_second(), pace.eta_seconds()
    return "".join([f"  · {rate:,.0f} images/s" if rate else "", f" · ETA {ui.duration(eta)}" if eta is not None else ""])
