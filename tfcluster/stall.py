"""Stalls: a run whose workers live but no longer make progress.

A worker that hangs in Python (a blocked read, a deadlock in a callback) keeps its heartbeats,
so its peers wait in the all-reduce without an error and fail-fast sees nothing. The launcher
therefore watches progress and ends an attempt that makes none for longer than the stall limit:

- progress is a step event of the bundled trainer (and its validation, backup and export events)
  or a ``tfcluster.progress(step)`` call in a script; a script that reports neither makes progress
  with each line it prints (TensorFlow's own log lines and the launcher's header do not count);
- before the first step a start-up limit applies (compilation and the first data fetch take
  minutes on a GPU); for a script without the helper the first step is its second line, since
  the gap between its first two lines includes the start-up;
- after it: max(10 min, 20 x the median step time) when steps are reported, max(30 min, 3 x the
  longest gap between two lines) otherwise; ``--stall-minutes N`` replaces the 10 or 30.

The median step time is the one of tfcluster/steptime.py. When the limit is passed, the launcher
sends SIGUSR1 to every worker: the ``sitecustomize`` it puts on the workers' PYTHONPATH
(tfcluster/workerpath/) registered faulthandler for it, so each worker writes every thread's
Python stack into its own log (py-spy needs ptrace rights that a VM login may lack).
"""

from __future__ import annotations

import re
import signal
import time
from dataclasses import dataclass, field

from tfcluster import tflog
from tfcluster.errors import HostUnreachable
from tfcluster.steptime import StepClock

STARTUP_MINUTES = 30.0
STEP_FLOOR_MINUTES = 10.0
LINE_FLOOR_MINUTES = 30.0
STEP_FACTOR = 20.0
GAP_FACTOR = 3.0
# Events that are progress: the trainer's steps, validation batches, backups, epoch ends and final
# export, and the script helper's calls (tfcluster.progress).
PROGRESS_EVENTS = ("first_step", "step", "progress", "val_step", "backup", "epoch_begin", "epoch_end",
                   "export", "done")
# Events that carry a training step: seeing one makes this a step-reporting run.
STEP_EVENTS = ("first_step", "step", "progress")
# The bundled trainer's word that a step has waited for its input for a while (trainer/input_watch.py):
# not progress, but it names the worker whose data stopped coming, when its peers stopped at the
# same step (they wait for it inside the all-reduce).
INPUT_WAIT_EVENT = "input_wait"
# The wrapper's header line in each worker's log (launch.render_wrapper).
WRAPPER_HEADER = "=== tfcluster:"


@dataclass
class StallLimit:
    """The rule: how long a run may go without progress."""

    # --stall-minutes: replaces the 10 (steps) or 30 (lines) minute floor; 0 turns stalls off;
    # None keeps the defaults.
    minutes: float | None = None
    # Allowed before the first step.
    startup_minutes: float = STARTUP_MINUTES

    @property
    def off(self) -> bool:
        return self.minutes == 0

    def seconds(self, started: bool, steps: bool, median_step: float | None, longest_gap: float) -> float | None:
        """The limit in seconds (None: off). ``started``: the first step was seen; ``steps``: the run
        reports steps (else lines count); ``median_step``: seconds per step; ``longest_gap``: the
        longest gap between two lines of one worker so far."""
        if self.off:
            return None
        if not started:
            return max(self.startup_minutes, self.minutes or 0) * 60
        if steps:
            floor = (STEP_FLOOR_MINUTES if self.minutes is None else self.minutes) * 60
            return max(floor, STEP_FACTOR * (median_step or 0))
        floor = (LINE_FLOOR_MINUTES if self.minutes is None else self.minutes) * 60
        return max(floor, GAP_FACTOR * longest_gap)


@dataclass
class WorkerProgress:
    # Launcher clock (time.monotonic) of the worker's last progress; its attempt's start before any.
    at: float
    # Global step of its last step event (-1 before any): the hung worker is the one behind.
    step: int = -1
    # Lines of progress it printed (a script without the helper).
    lines: int = 0
    # Longest gap between two of its lines, seconds.
    longest_gap: float = 0.0
    # Whether it reported anything at all.
    seen: bool = False
    # The step it said waits for its input (an input_wait event since its last progress), else None.
    waits_for_input: int | None = None
    # How far its input pipeline was ahead of its steps then (batches handed on minus steps begun):
    # a peer blocked in the all-reduce may report a wait too, but the starved worker is least ahead.
    input_ahead: int = 0


@dataclass
class Stall:
    """An attempt that stopped making progress."""

    # Index of the worker that holds the run up: one whose step waits for its input (of several, the
    # one whose pipeline is least ahead), else the one whose last progress is oldest (behind in steps,
    # then in time).
    worker: int
    # Seconds since the run's last progress, and the limit it passed.
    quiet_seconds: float
    limit_seconds: float
    # Whether the run had reached its first step (else: the start-up limit passed).
    started: bool
    # Each worker's last reported step (-1: none), by index.
    steps: dict[int, int] = field(default_factory=dict)
    # The step the named worker said waits for its input data (None: it did not say so).
    waits_for_input: int | None = None


class StallWatch:
    """Progress of one attempt, fed from the follow loop; ``check`` says when it stalled."""

    def __init__(self, limit: StallLimit, workers: list[int], now: float | None = None):
        start = time.monotonic() if now is None else now
        self.limit = limit
        self.workers = {index: WorkerProgress(at=start) for index in workers}
        # The chief's step events, for the median step time (the shared measure).
        self.clock = StepClock()
        self.started = False
        self.steps = False

    def event(self, index: int, event: dict, now: float | None = None) -> None:
        kind = event.get("event")
        if kind == INPUT_WAIT_EVENT and index in self.workers:
            self.workers[index].waits_for_input = int(event.get("step", 0))
            self.workers[index].input_ahead = int(event.get("ahead", 0))
            return
        if kind not in PROGRESS_EVENTS or index not in self.workers:
            return
        worker = self._progress(index, now)
        if kind in STEP_EVENTS:
            self.steps = self.started = True
            worker.step = _global_step(event, worker.step)
            if index == 0:
                self.clock.observe(event)

    def line(self, index: int, line: str, now: float | None = None) -> None:
        """An ordinary output line; progress only while the run reports no steps."""
        if self.steps or index not in self.workers or not counts_as_output(line):
            return
        worker = self.workers[index]
        at = time.monotonic() if now is None else now
        if worker.lines:
            worker.longest_gap = max(worker.longest_gap, at - worker.at)
            self.started = True  # Its second line: the first gap after start-up.
        worker.lines += 1
        self._progress(index, at)

    def _progress(self, index: int, now: float | None) -> WorkerProgress:
        worker = self.workers[index]
        worker.at, worker.seen = (time.monotonic() if now is None else now), True
        worker.waits_for_input = None
        return worker

    def limit_seconds(self) -> float | None:
        gap = max((w.longest_gap for w in self.workers.values()), default=0.0)
        return self.limit.seconds(self.started, self.steps, self.clock.median_step_seconds, gap)

    def check(self, now: float | None = None) -> Stall | None:
        """A Stall when no worker made progress for longer than the limit, else None."""
        limit = self.limit_seconds()
        if limit is None or not self.workers:
            return None
        at = time.monotonic() if now is None else now
        quiet = at - max(w.at for w in self.workers.values())
        if quiet <= limit:
            return None
        behind = min(self.workers, key=lambda i: (self.workers[i].waits_for_input is None, self.workers[i].input_ahead,
                                                  self.workers[i].step, self.workers[i].at, i))
        return Stall(worker=behind, quiet_seconds=quiet, limit_seconds=limit, started=self.started,
                     steps={i: w.step for i, w in self.workers.items()},
                     waits_for_input=self.workers[behind].waits_for_input)


def _global_step(event: dict, before: int) -> int:
    if event.get("event") == "progress":
        return int(event.get("step", before))
    steps = int(event.get("steps") or 0)
    epoch = max(int(event.get("epoch") or 1), 1)
    return int(event.get("step", 0)) + (epoch - 1) * steps


def counts_as_output(line: str) -> bool:
    """A line the program printed: not TensorFlow's own log lines, not the launcher's header,
    not a stack dump."""
    text = line.strip()
    return bool(text) and not (tflog.CPP_LINE.match(text) or text.startswith(tflog.ABSL_PREAMBLE)
                               or text.startswith(WRAPPER_HEADER) or DUMP_LINE.match(line))


# ---------------------------------------------------------------- stack dumps

# faulthandler's format (Python/traceback.c): a header per thread, then one line per frame,
# innermost first. The main thread comes last.
DUMP_HEADER = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):$")
DUMP_LINE = re.compile(r"^(?:(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):|  File \".*\", line \d+ in .*|  <no Python frame>)$")

# A frame in the interpreter's standard library (not a package installed beside it).
STDLIB_FRAME = re.compile(r'File "(<frozen [^>]+>|[^"]*/lib/python3\.\d+/(?!site-packages/|dist-packages/)[^"]*)"')


@dataclass
class StackDump:
    # The worker's threads, each a list of frame lines, innermost first; the main thread last.
    threads: list[list[str]]

    @property
    def main(self) -> list[str]:
        return self.threads[-1] if self.threads else []

    @property
    def blocking_frame(self) -> str | None:
        """The main thread's innermost frame outside Python's own library (threading, queue, socket):
        the program's line that waits."""
        return next((frame for frame in self.main if not STDLIB_FRAME.search(frame)),
                    self.main[0] if self.main else None)


# Where a worker's main thread is, from its dump: in its own code (a user's script, a callback: it holds
# its peers), in TensorFlow (a collective or a step's graph: waiting for its peers), or in tf.data.
OWN_CODE, IN_TENSORFLOW, IN_INPUT = "own code", "tensorflow", "input"
# A frame of TensorFlow or Keras (installed packages; the bundled trainer and a user's script are not).
TENSORFLOW_FRAME = re.compile(r'File "[^"]*/(?:site|dist)-packages/(?:tensorflow|tf_keras|keras|tensorflow_\w+)/')
INPUT_FRAME = re.compile(r'File "[^"]*/(?:site|dist)-packages/tensorflow/python/data/')


def place(dump: StackDump) -> str:
    """Where the main thread waits: OWN_CODE when its innermost frame outside Python's own library is
    not TensorFlow's or Keras's, IN_INPUT when it is tf.data's, else IN_TENSORFLOW."""
    frame = dump.blocking_frame
    if frame is None or not frame.startswith("File "):
        return IN_TENSORFLOW  # No Python frame: inside native code, which is TensorFlow's here.
    if INPUT_FRAME.search(frame):
        return IN_INPUT
    return IN_TENSORFLOW if TENSORFLOW_FRAME.search(frame) else OWN_CODE


def holder(found: Stall, dumps: dict[int, StackDump | None]) -> tuple[int, str]:
    """The worker that holds the others, and why, once every worker's stack is known: the one whose
    step waits for its input (the trainer says so), else the one whose main thread is in its own code
    while the others wait inside TensorFlow (of several, the one behind in steps), else the one whose
    last progress is the oldest (the progress alone cannot tell a tie: every worker then stopped at
    the same step, the others waiting for it in the all-reduce)."""
    if found.waits_for_input is not None:
        return found.worker, f"its step {found.waits_for_input} waits for its input data (a read that does not return?)"
    own = [index for index, dump in sorted(dumps.items()) if dump is not None and place(dump) == OWN_CODE]
    waiting = [index for index, dump in dumps.items() if dump is not None and place(dump) != OWN_CODE]
    if own and waiting:
        index = found.worker if found.worker in own else min(own, key=lambda i: (found.steps.get(i, -1), i))
        return index, (f"its main thread is in its own code, not in TensorFlow, while "
                       f"{'the others wait' if len(waiting) > 1 else 'its peer waits'} inside the collective")
    step = found.steps.get(found.worker, -1)
    return found.worker, "its last progress is the oldest" + (f" (step {step})" if step >= 0 else "")


def parse_dump(text: str) -> StackDump | None:
    """The faulthandler dump in ``text`` (other lines around it are skipped), or None."""
    threads: list[list[str]] = []
    current: list[str] | None = None
    for line in text.splitlines():
        if DUMP_HEADER.match(line):
            current = []
            threads.append(current)
        elif current is not None and DUMP_LINE.match(line):
            current.append(line.strip())
        else:
            current = None  # A blank line ends a thread's frames; anything else is the program's.
    return StackDump(threads) if threads else None


def request_dumps(plans: list, attempt: int, timeout: float = 10.0) -> dict[int, StackDump | None]:
    """``plans``: launch.WorkerPlan (this module sits below the launcher).
    SIGUSR1 to every worker's program, then each one's dump from its log (None if none came
    within ``timeout``: a worker whose Python never ran the sitecustomize, or a lost host)."""
    offsets: dict[int, int] = {}
    for plan in plans:
        try:
            offsets[plan.index] = plan.host.file_size(plan.log_path)
            raw = plan.host.read_file(plan.path(attempt, "pid"))
            if raw and raw.decode().strip().isdigit():
                plan.host.signal(int(raw.decode().strip()), signal.SIGUSR1)
        except HostUnreachable:
            offsets.pop(plan.index, None)
    dumps: dict[int, StackDump | None] = {plan.index: None for plan in plans}
    sizes: dict[int, int] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for plan in plans:
            if plan.index not in offsets:
                continue
            try:
                text = (plan.host.read_file(plan.log_path, offsets[plan.index]) or b"").decode(errors="replace")
            except HostUnreachable:
                continue
            # Complete once it stopped growing between two polls.
            if sizes.get(plan.index) == len(text):
                dumps[plan.index] = parse_dump(text)
            sizes[plan.index] = len(text)
        if all(dumps[index] is not None for index in offsets):
            break
        time.sleep(0.25)
    return dumps
