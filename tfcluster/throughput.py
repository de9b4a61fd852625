"""A run's speed, for its summary and TensorBoard: images per second, step time, GPU use, scaling.

Two rates, side by side:

- at the **median step**: the global batch over the median step time of ``tfcluster/steptime.py``
  (the one shared measure), what a step costs once the run is going;
- by **wall clock**: the images trained over the seconds from each attempt's first step to its
  last epoch's end, validation, backups and callbacks included (the first step, which traces and
  compiles, is not counted). A run that spends time outside its steps shows it here.

Every worker's figures come from its own events: one ``StepClock`` per worker fed with its step
events, and its own epoch ends. A worker's share of each step is its replicas over the replicas in
sync (every worker of a run has the same machine, so that is 1/workers). In synchronous training
every worker steps at the pace of the slowest, so the per-worker figures agree unless a worker
spends time outside the steps (its own wall clock) or starts late; the slow worker itself shows in
its GPU utilisation (sampled from ``nvidia-smi`` during each epoch, trainer/gpu.py) and in its
input waits (trainer/input_watch.py). The scaling efficiency compares a run of N workers with the
last successful 1-worker run of the same configuration, at the median step: N-worker images/s /
(N x 1-worker images/s).
"""

from __future__ import annotations

import os
import re
import socket
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

from tfcluster.state import RunRecord, StateStore
from tfcluster.steptime import StepClock
# TFRecord framing and protobuf's varint and length-delimited fields, as the data shards use them.
from trainer.records import RecordWriter, _field, _varint

# What must match for two runs' speeds to be compared (the trainer's strategy event gives the first
# six, the cluster the backend and machine type). "args" is the trainer's hash of every flag that
# can change a step's cost (all but --epochs, --steps-per-epoch, the folders, the seed...:
# trainer/flags.py), so a narrower or shallower model, another optimizer or precision is not
# compared with the default.
CONFIG_KEYS = ("model", "image_size", "batch_size", "data", "args", "gpus", "backend", "machine_type")


@dataclass
class ThroughputMeter:
    """Step events of every worker in, per-epoch and whole-run figures out."""

    # Worker index -> its StepClock.
    clocks: dict[int, StepClock] = field(default_factory=dict)
    # Images per step (the global batch), from the step events (a script's: read from its code,
    # tfcluster/commands/script_facts.py).
    global_batch: int | None = None
    # A script's (no step events): worker index -> seconds per step of each epoch, as its Keras
    # progress bar ends the epoch ("20/20 [====] - 3s 150ms/step", tf_keras's Progbar).
    bar_epochs: dict[int, list[float]] = field(default_factory=dict)
    # Worker index -> replicas on that worker, from its strategy event.
    local_replicas: dict[int, int] = field(default_factory=dict)
    # Replicas in sync (all workers), from the strategy events.
    replicas_in_sync: int | None = None
    # Epoch -> worker index -> that epoch's GPU sample summary (trainer/gpu.py take_epoch()).
    gpu: dict[int, dict[int, dict]] = field(default_factory=dict)
    # Worker index -> its wall-clock marks, in order: (kind, time, global step, epoch), kind "start" at
    # each attempt's first step and "end" at each epoch's end.
    marks: dict[int, list[tuple[str, float, int, int]]] = field(default_factory=dict)

    def observe(self, worker: int, event: dict) -> None:
        kind = event.get("event")
        if kind == "strategy":
            self.replicas_in_sync = event.get("replicas_in_sync") or self.replicas_in_sync
            if event.get("local_replicas"):
                self.local_replicas[worker] = int(event["local_replicas"])
        elif kind in ("first_step", "step"):
            if event.get("batch"):
                self.global_batch = int(event["batch"])
            clock = self.clocks.setdefault(worker, StepClock())
            clock.observe(event)
            if kind == "first_step" and "time" in event and clock.steps_per_epoch:
                epoch = max(int(event.get("epoch") or 1), 1)
                step = (epoch - 1) * clock.steps_per_epoch + int(event["step"])
                self.marks.setdefault(worker, []).append(("start", float(event["time"]), step, epoch))
        elif kind == "epoch_end":
            if event.get("gpu"):
                self.gpu.setdefault(int(event.get("epoch") or 0), {})[worker] = event["gpu"]
            clock = self.clocks.get(worker)
            if clock and clock.steps_per_epoch and "time" in event and self.marks.get(worker):
                epoch = int(event.get("epoch") or 0)
                self.marks[worker].append(("end", float(event["time"]), epoch * clock.steps_per_epoch, epoch))

    def observe_bar(self, worker: int, bar: str) -> None:
        """A worker's line, a Keras bar in its final state (tfcluster/commands/run_view.py keras_bar) or
        any other: an epoch's time per step once a bar is complete."""
        match = _BAR_END.match(bar)
        if match and match.group(1) == match.group(2):
            self.bar_epochs.setdefault(worker, []).append(float(match.group(3)) * _UNIT[match.group(4)])

    def _bar_rates(self, seconds: dict[int, float]) -> dict:
        """The figures of one epoch (or the run) from each worker's Keras seconds per step."""
        chief = seconds.get(0)
        share = lambda worker: self._share(worker) if self.clocks else 1 / max(1, len(self.bar_epochs))  # noqa: E731
        batch = self.global_batch
        return {"median_step_seconds": round(chief, 5) if chief else None,
                "global_images_per_second": round(batch / chief, 1) if batch and chief else None,
                "per_worker_images_per_second": {str(w): round(batch * share(w) / s, 1)
                                                 for w, s in sorted(seconds.items()) if batch and s},
                "steps_per_second": round(1 / chief, 2) if chief else None, "source": "keras"}

    def _bar_summary(self) -> dict:
        """A script's run, from the Keras bars: the median over epochs, then each epoch (no wall clock:
        Keras prints an epoch's seconds rounded to the second)."""
        medians = {w: sorted(s)[len(s) // 2] for w, s in self.bar_epochs.items() if s}
        epochs = [{"epoch": number + 1, "wall_images_per_second": None, "per_worker_wall_images_per_second": {},
                   **self._bar_rates({w: s[number] for w, s in self.bar_epochs.items() if len(s) > number})}
                  for number in range(len(self.bar_epochs.get(0, [])))]
        return {"global_batch": self.global_batch, "wall_images_per_second": None,
                "per_worker_wall_images_per_second": {}, **self._bar_rates(medians), "epochs": epochs}

    def _wall_spans(self, worker: int) -> list[tuple[float, int, int]]:
        """(seconds, steps, epoch) from each mark to the next epoch end of the same attempt."""
        spans, last = [], None
        for kind, when, step, epoch in self.marks.get(worker, []):
            if kind == "end" and last is not None and step > last[1] and when > last[0]:
                spans.append((when - last[0], step - last[1], epoch))
            last = (when, step)
        return spans

    def _wall_rate(self, worker: int, epoch: int | None = None) -> float | None:
        """Images/s of ``worker``'s share by wall clock, over the run or one epoch."""
        spans = [span for span in self._wall_spans(worker) if epoch is None or span[2] == epoch]
        seconds = sum(span[0] for span in spans)
        if not spans or not seconds or not self.global_batch:
            return None
        return sum(span[1] for span in spans) * self.global_batch * self._share(worker) / seconds

    def _share(self, worker: int) -> float:
        """The fraction of each global batch this worker computes."""
        replicas = self.replicas_in_sync or len(self.clocks) or 1
        return self.local_replicas.get(worker, replicas / max(1, len(self.clocks))) / replicas

    def _rates(self, seconds_of) -> tuple[float | None, float | None, dict[str, float]]:
        """(median step seconds, global images/s, worker -> images/s) for one step-time reader."""
        if not self.global_batch:
            return None, None, {}
        chief = self.clocks.get(0)
        median = seconds_of(chief) if chief else None
        per_worker = {}
        for worker, clock in sorted(self.clocks.items()):
            seconds = seconds_of(clock)
            if seconds:
                per_worker[str(worker)] = round(self.global_batch * self._share(worker) / seconds, 1)
        return (round(median, 5) if median else None,
                round(self.global_batch / median, 1) if median else None, per_worker)

    def _wall_rates(self, epoch: int | None = None) -> tuple[float | None, dict[str, float]]:
        """(all workers' images/s by the chief's wall clock, worker -> its own) over the run or one epoch."""
        chief = self._wall_rate(0, epoch)
        per_worker = {str(worker): round(rate, 1) for worker in sorted(self.marks)
                      if (rate := self._wall_rate(worker, epoch)) is not None}
        return (round(chief / self._share(0), 1) if chief else None), per_worker

    def epochs(self) -> list[dict]:
        """One record per epoch the chief timed."""
        chief = self.clocks.get(0)
        records = []
        for epoch in sorted(chief.epoch_intervals) if chief else []:
            median, global_rate, per_worker = self._rates(lambda c, e=epoch: c.epoch_median_step_seconds(e))
            wall, wall_per_worker = self._wall_rates(epoch)
            record = {"epoch": epoch, "median_step_seconds": median, "global_images_per_second": global_rate,
                      "per_worker_images_per_second": per_worker, "wall_images_per_second": wall,
                      "per_worker_wall_images_per_second": wall_per_worker}
            gpu = self.gpu.get(epoch)
            if gpu:
                record["gpu_utilization"] = {str(w): g.get("utilization") for w, g in sorted(gpu.items())}
            records.append(record)
        return records

    def summary(self) -> dict:
        """The whole run: medians over every interval, and each epoch."""
        if not self.clocks and self.bar_epochs.get(0):
            return self._bar_summary()
        median, global_rate, per_worker = self._rates(lambda c: c.median_step_seconds)
        wall, wall_per_worker = self._wall_rates()
        return {"global_batch": self.global_batch, "median_step_seconds": median,
                "global_images_per_second": global_rate, "per_worker_images_per_second": per_worker,
                "wall_images_per_second": wall, "per_worker_wall_images_per_second": wall_per_worker,
                "epochs": self.epochs()}


# The end of tf_keras's Progbar line for an epoch: "20/20 [==========] - 3s 150ms/step - loss: 2.3"
# (verbose=1), "6/6 - 0s - loss: 0.69 - 1s/epoch - 12ms/step" (verbose=2): tf_keras/src/utils/
# generic_utils.py, Progbar.update and _format_time (" %.0fs/step", " %.0fms/step" or " %.0fus/step").
_BAR_END = re.compile(r"^\s*(\d+)/(\d+) (?:\[[=>.]*\] )?- .*?(\d+(?:\.\d+)?)(s|ms|us)/step")
_UNIT = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


def run_config(strategy: dict, backend: str, machine_type: str) -> dict:
    """The configuration a speed belongs to, from the chief's strategy event and the cluster."""
    gpus = strategy.get("gpus") or []
    return {"model": strategy.get("model"), "image_size": strategy.get("image_size"),
            "batch_size": strategy.get("batch_size"), "data": strategy.get("data"), "args": strategy.get("args"),
            "gpus": f"{len(gpus)} x {sorted(set(gpus))[0]}" if gpus else "none",
            "backend": backend, "machine_type": machine_type}


def reference_run(store: StateStore, config: dict, exclude: str) -> RunRecord | None:
    """The last successful 1-worker training run of the same configuration, with a throughput."""
    if not store.runs_dir.is_dir() or not all(config.get(key) is not None for key in CONFIG_KEYS[:5]):
        return None
    found = []
    for path in store.runs_dir.iterdir():
        run = store.load_run(path.name) if path.is_dir() and path.name != exclude else None
        if (run is not None and run.kind == "train" and run.workers == 1 and run.outcome == "succeeded"
                and run.summary.get("config") == config
                and (run.summary.get("throughput") or {}).get("global_images_per_second")):
            found.append(run)
    return max(found, key=lambda run: run.started_at, default=None)


def scaling(workers: int, throughput: dict, reference: RunRecord | None) -> dict | None:
    """N-worker images/s over N x the reference's, or None without both figures (or with 1 worker)."""
    rate = throughput.get("global_images_per_second")
    if workers < 2 or reference is None or not rate:
        return None
    one = reference.summary["throughput"]["global_images_per_second"]
    return {"workers": workers, "efficiency": round(rate / (workers * one), 3), "speedup": round(rate / one, 3),
            "reference_run": reference.run_id, "reference_images_per_second": one}


def tensorboard_scalars(throughput: dict, scaling_figures: dict | None) -> list[tuple[str, int, float]]:
    """(tag, epoch, value) of every figure, as the summary has them."""
    scalars = []
    for record in throughput.get("epochs", []):
        epoch = record["epoch"]
        for name in ("global_images_per_second", "wall_images_per_second", "median_step_seconds"):
            if record.get(name) is not None:
                scalars.append((f"throughput/{name}", epoch, record[name]))
        for worker, rate in record.get("per_worker_images_per_second", {}).items():
            scalars.append((f"throughput/worker_{worker}_images_per_second", epoch, rate))
        for worker, utilization in (record.get("gpu_utilization") or {}).items():
            if utilization is not None:
                scalars.append((f"gpu/worker_{worker}_utilization_percent", epoch, utilization))
        if scaling_figures and record.get("global_images_per_second"):
            one = scaling_figures["reference_images_per_second"] * scaling_figures["workers"]
            scalars.append(("throughput/scaling_efficiency", epoch,
                            round(record["global_images_per_second"] / one, 3)))
    return scalars


def write_tensorboard(logdir: Path, scalars: list[tuple[str, int, float]]) -> Path | None:
    """An event file of ``scalars`` in ``logdir``, as TensorBoard's EventFileWriter names and writes one,
    encoded here: TensorBoard's writer imports TensorFlow whenever it is installed, and the launcher
    never does (its start-up prints TensorFlow's C++ lines, and costs seconds)."""
    if not scalars:
        return None
    logdir.mkdir(parents=True, exist_ok=True)
    now = time.time()
    # tensorboard/summary/writer/event_file_writer.py: events.out.tfevents.<time>.<host>.<pid>.<uid>
    path = logdir / f"events.out.tfevents.{int(now):010d}.{socket.gethostname()}.{os.getpid()}.0"
    with RecordWriter(path) as writer:
        writer.write(_event(now, 0, _field(3, b"brain.Event:2")))  # Event.file_version, first in every file.
        for tag, step, value in scalars:
            value_proto = _field(1, tag.encode()) + _float(2, float(value))  # Summary.Value: tag, simple_value.
            writer.write(_event(now, step, _field(5, _field(1, value_proto))))  # Event.summary; Summary.value.
    return logdir


# Protocol buffers' wire format (protobuf.dev/programming-guides/encoding) for the few fields an event
# of scalars has: tensorflow/core/util/event.proto (Event: wall_time 1 double, step 2 int64, file_version
# 3 string, summary 5) and tensorflow/core/framework/summary.proto (Summary.value 1; Value: tag 1 string,
# simple_value 2 float), with trainer/records.py's field encoding and TFRecord framing (length, CRC32C).


def _float(number: int, value: float) -> bytes:
    return _varint(number << 3 | 5) + struct.pack("<f", value)


def _event(wall_time: float, step: int, what: bytes) -> bytes:
    """An Event: its wall time (a double, field 1), its step (field 2, omitted at 0 as protobuf does)."""
    step_field = _varint(2 << 3) + _varint(step) if step else b""
    return _varint(1 << 3 | 1) + struct.pack("<d", wall_time) + step_field + what
