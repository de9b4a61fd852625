"""Stalls (tfcluster/stall.py): the limit rule on a simulated clock, the stack dump's reading and
where each worker's stack is, a 3-worker local cluster where a script hangs in its own Python code on
one worker after reporting its step (caught, named by its stack, its frame shown, resumed from the
backup), and a 2-worker one where a worker is stopped with SIGSTOP (a failure, not a stall)."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

from tests.conftest import events_of, wait_for
from tfcluster.stall import StallLimit, StallWatch, counts_as_output, parse_dump
from trainer.input_watch import InputWatch

SCRIPTS = Path(__file__).resolve().parent / "scripts"
MINUTE = 60.0


# ---------------------------------------------------------------- the rule


def test_the_limit_rule_and_its_defaults():
    default, one, off = StallLimit(), StallLimit(minutes=1), StallLimit(minutes=0)
    # Before the first step: the start-up limit, 30 minutes.
    assert default.seconds(started=False, steps=True, median_step=None, longest_gap=0) == 30 * MINUTE
    assert one.seconds(started=False, steps=False, median_step=None, longest_gap=0) == 30 * MINUTE
    # Steps: max(10 min, 20 x median); --stall-minutes replaces the 10.
    assert default.seconds(True, True, 0.5, 0) == 10 * MINUTE
    assert default.seconds(True, True, 45.0, 0) == 20 * 45.0
    assert one.seconds(True, True, 0.5, 0) == MINUTE
    # Lines: max(30 min, 3 x longest gap); --stall-minutes replaces the 30.
    assert default.seconds(True, False, None, 90) == 30 * MINUTE
    assert default.seconds(True, False, None, 1200) == 3600
    assert one.seconds(True, False, None, 90) == 270
    assert off.seconds(True, True, 0.5, 0) is None and off.seconds(False, False, None, 0) is None


def _printer(watch: StallWatch, every: float, lines: int, until: float, start: float = 0.0):
    """Two workers print a line every ``every`` s (``lines`` in all); the launcher checks every 0.5 s
    until ``until``. Returns the first stall, or None."""
    printed = [start + 5 + i * every for i in range(lines)]
    t = start
    while t <= until:
        for at in printed:
            if t - 0.5 < at <= t:
                for worker in (0, 1):
                    watch.line(worker, f"epoch {printed.index(at) + 1} done", now=t)
        found = watch.check(now=t)
        if found:
            return found
        t += 0.5
    return None


def test_a_script_that_prints_every_90_s_is_not_killed_with_stall_minutes_1():
    """The gap between its first two lines is start-up; after it, 3 x 90 s > 1 min."""
    watch = StallWatch(StallLimit(minutes=1), [0, 1], now=0.0)
    assert _printer(watch, every=90, lines=20, until=20 * 90) is None
    # When it then falls silent, it is caught after 3 x 90 s, within a poll.
    found = _printer(watch, every=90, lines=0, until=20 * 90 + 400, start=20 * 90 + 0.5)
    assert found is not None and found.limit_seconds == 270 and 270 < found.quiet_seconds <= 271


def test_the_launchers_noise_does_not_count_and_steps_replace_lines():
    assert not counts_as_output("=== tfcluster: worker-0 (chief:0) attempt 1 on vm ===")
    assert not counts_as_output("I0000 00:00:1795357008.749365    9100 port.cc:153] oneDNN custom operations are on.")
    assert not counts_as_output('  File "/x/y.py", line 3 in wait')
    assert counts_as_output("epoch 1 loss 0.3")
    watch = StallWatch(StallLimit(minutes=1), [0, 1], now=0.0)
    for t in (10.0, 10.2):
        watch.event(0, {"event": "progress", "step": 1, "time": t}, now=t)
        watch.event(1, {"event": "progress", "step": 1, "time": t}, now=t)
    watch.line(0, "a line", now=65.0)  # A script that reports steps: its lines are not progress.
    found = watch.check(now=70.3)
    assert found is not None and found.started and found.limit_seconds == MINUTE


def test_the_worker_behind_is_named_and_the_median_comes_from_the_step_clock():
    watch = StallWatch(StallLimit(), [0, 1, 2], now=0.0)
    for step in range(1, 11):
        for worker in (2, 0, 1):
            if worker == 2 and step == 10:
                continue  # Worker 2 hangs before its step 10; the others finished it.
            # Worker 2's step 9 is read last (its log is polled after the others'): the newest line.
            now = 400.5 if (worker, step) == (2, 9) else step * 40.0
            watch.event(worker, {"event": "progress", "step": step, "time": 100.0 + step * 40}, now=now)
    assert watch.clock.median_step_seconds == 40.0
    assert watch.check(now=400.5 + 20 * 40) is None  # 20 x 40 s = 800 s > 10 min.
    found = watch.check(now=400.5 + 801)
    assert found is not None and found.worker == 2 and found.steps == {0: 10, 1: 10, 2: 9}


def test_a_worker_whose_input_waits_is_named_though_its_peers_stopped_at_the_same_step():
    """An input hang: every worker stops after the same step (the others wait in the all-reduce),
    so their last progress cannot tell; the trainer's input_wait event names the starved one."""
    watch = StallWatch(StallLimit(minutes=1), [0, 1, 2], now=0.0)
    for worker in (1, 0, 2):  # Worker 1's last step is read first: the oldest progress.
        watch.event(worker, {"event": "step", "epoch": 1, "step": 20, "steps": 100, "time": 5.0}, now=5.0 + worker)
    watch.event(2, {"event": "input_wait", "step": 21, "waited_seconds": 20.0}, now=27.0)
    found = watch.check(now=7.0 + 61)  # The newest progress: worker 2 at 7.
    assert found is not None and found.worker == 2 and found.waits_for_input == 21
    # An input wait is not progress, and progress since it clears it.
    assert found.quiet_seconds == 61.0
    watch.event(2, {"event": "step", "epoch": 1, "step": 22, "steps": 100, "time": 70.0}, now=70.0)
    assert watch.workers[2].waits_for_input is None


def test_of_several_workers_waiting_for_input_the_one_whose_buffer_ran_dry_is_named():
    """The chief, blocked in the all-reduce with a full buffer, can report an input wait at the same
    step as the starved worker (seen in the Spot world's input hang); its pipeline is further ahead."""
    watch = StallWatch(StallLimit(minutes=1), [0, 1], now=0.0)
    for worker in (0, 1):
        watch.event(worker, {"event": "step", "epoch": 1, "step": 80, "steps": 400, "time": 5.0}, now=5.0)
    watch.event(0, {"event": "input_wait", "step": 81, "waited_seconds": 20.3, "ahead": 2}, now=25.3)
    watch.event(1, {"event": "input_wait", "step": 81, "waited_seconds": 20.4, "ahead": -1}, now=25.4)
    found = watch.check(now=5.0 + 61)
    assert found is not None and found.worker == 1 and found.waits_for_input == 81


class _Keras:
    class callbacks:
        Callback = object


def test_the_input_watch_reports_a_step_with_no_batch_handed_on_once():
    watch = InputWatch(_Keras, wait_seconds=20.0)
    begin = watch.callback.on_train_batch_begin

    def hand_on() -> None:
        with watch._lock:
            watch.handed += 1

    hand_on()  # The first batch, then the first step (tracing, compiling: never reported).
    begin(0)
    assert watch.waiting(watch.began_at + 600) is None
    for batch in (1, 2):  # Healthy steps: a batch is handed on within each (taken, or refilled).
        begin(batch)
        hand_on()
        assert watch.waiting(watch.began_at + 600) is None
    begin(3)  # Nothing comes.
    assert watch.waiting(watch.began_at + 19) is None
    assert watch.waiting(watch.began_at + 21) == (4, 21, -1)  # 3 batches handed on, 4 steps begun: its buffer ran dry.
    assert watch.waiting(watch.began_at + 60) is None  # Once per step.

    # The epoch's validation, watched from its first batch: a healthy one, then one whose read hangs,
    # reported at the last training step.
    test_begin = watch.callback.on_test_batch_begin
    hand_on()
    test_begin(0)
    hand_on()
    assert watch.waiting(watch.began_at + 600) is None
    test_begin(1)  # Nothing comes.
    assert watch.waiting(watch.began_at + 21) == (4, 21, -1)


DUMP = """\
hanging at step 13
Thread 0x00007f33db6126c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f33dcc5bb80 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/usr/lib/python3.11/threading.py", line 629 in wait
  File "/home/me/train.py", line 62 in on_train_batch_end
  File "/venv/lib/python3.11/site-packages/tf_keras/src/callbacks.py", line 396 in _call_batch_hook_helper
  File "<frozen runpy>", line 88 in _run_code
I0000 00:00:1795357008.749365    9100 port.cc:153] after the dump
"""


def test_a_faulthandler_dump_is_read_and_its_blocking_frame_found():
    dump = parse_dump(DUMP)
    assert len(dump.threads) == 2 and len(dump.main) == 5
    assert dump.blocking_frame == 'File "/home/me/train.py", line 62 in on_train_batch_end'
    assert parse_dump("no dump here\n") is None
    # Waiting inside TensorFlow (a package beside the interpreter, not its library): that frame.
    inside = parse_dump(DUMP.replace('  File "/home/me/train.py", line 62 in on_train_batch_end\n', ""))
    assert inside.blocking_frame.startswith('File "/venv/lib/python3.11/site-packages/tf_keras/')


def _dump(*frames: str) -> "stall.StackDump":
    return parse_dump("Current thread 0x00007f33dcc5bb80 (most recent call first):\n"
                      + "".join(f"  {frame}\n" for frame in frames))


TF_WAIT = 'File "/venv/lib/python3.11/site-packages/tensorflow/python/eager/execute.py", line 53 in quick_execute'
OWN = 'File "/home/me/train.py", line 62 in on_train_batch_end'
TF_DATA = 'File "/venv/lib/python3.11/site-packages/tensorflow/python/data/ops/iterator_ops.py", line 777 in _next_internal'
STDLIB = 'File "/usr/lib/python3.11/threading.py", line 331 in wait'


def test_the_worker_in_its_own_code_holds_the_others_and_each_stack_says_where_it_is():
    from tfcluster import stall

    waiting, hung = _dump(TF_WAIT, 'File "/home/me/train.py", line 80 in <module>'), _dump(STDLIB, OWN, TF_WAIT)
    assert [stall.place(d) for d in (waiting, hung, _dump(STDLIB, TF_DATA, OWN))] == ["tensorflow", "own code", "input"]
    assert stall.place(parse_dump("Thread 0x00007f33dcc5bb80 (most recent call first):\n  <no Python frame>\n")) == \
        "tensorflow"
    tie = stall.Stall(worker=0, quiet_seconds=61, limit_seconds=60, started=True, steps={0: 13, 1: 13, 2: 13})
    assert stall.holder(tie, {0: waiting, 1: waiting, 2: hung}) == (
        2, "its main thread is in its own code, not in TensorFlow, while the others wait inside the collective")
    # No stack tells (every worker in TensorFlow, or a dump missing): the oldest progress, as before.
    assert stall.holder(tie, {0: waiting, 1: waiting, 2: None}) == (0, "its last progress is the oldest (step 13)")
    # The trainer's input wait comes first: its stack is a graph's, like its peers'.
    starved = stall.Stall(worker=1, quiet_seconds=61, limit_seconds=60, started=True, steps={0: 8, 1: 8},
                          waits_for_input=9)
    assert stall.holder(starved, {0: hung, 1: waiting})[0] == 1


def test_a_bad_stall_minutes_is_one_error_line(cli):
    result = cli.run("train", "--stall-minutes", "-1")
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "error: --stall-minutes must be a whole number of minutes from 1 to 10080, or 0 to turn stall "
        "detection off (got -1)"]


# ---------------------------------------------------------------- a real cluster

HANG_STEP, BACKUP_EVERY = 13, 5


def _progress_steps(log: str) -> list[tuple[int, int]]:
    """(attempt, step) of each progress event in a worker's log."""
    found, attempt = [], 0
    for line in log.splitlines():
        header = re.search(r"=== tfcluster: .* attempt (\d+) on ", line)
        if header:
            attempt = int(header.group(1))
        for event in events_of(line):
            if event["event"] == "progress":
                found.append((attempt, event["step"]))
    return found


def test_a_worker_hung_in_its_own_code_is_named_by_its_stack_and_the_run_resumes(cli):
    """3 workers; worker-2 (not the chief) reports step 13, then blocks in its own Python code: every
    worker's last progress is step 13 (the others wait for it in step 14's all-reduce), so only the
    stacks tell which one holds the others."""
    assert cli.run("up", "--workers", "3").returncode == 0
    script = str(SCRIPTS / "hung_at_step.py")
    result = cli.run("train", "--script", script, "--stall-minutes", "1", "--retries", "1", "--",
                     "--hang-step", str(HANG_STEP), "--hang-worker", "2", "--hang-after-report",
                     "--backup-every", str(BACKUP_EVERY), timeout=300)
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr[-2000:]
    run_dir, run = cli.latest_run()
    assert run["outcome"] == "succeeded" and run["attempts"] == 2
    logs = {worker: (run_dir / f"worker-{worker}.log").read_text() for worker in range(3)}
    last = {worker: max(step for attempt, step in _progress_steps(log) if attempt == 1) for worker, log in logs.items()}
    assert last == {0: HANG_STEP, 1: HANG_STEP, 2: HANG_STEP}, last  # A tie: progress alone cannot tell.
    [stalled] = run["summary"]["stalls"]
    # Detected within the limit: the launcher checks every half second.
    assert stalled["worker"] == "worker-2" and stalled["limit_seconds"] == 60
    # Caught past the limit (quiet > 60 s), recorded to 0.1 s: 60.04 s is written as 60.0.
    assert 60 <= stalled["quiet_seconds"] <= 62, stalled
    assert stalled["places"] == {"worker-0": "tensorflow", "worker-1": "tensorflow", "worker-2": "own code"}, stalled
    assert re.search(r"Stalled: no worker made progress for \d+ s \(limit 60 s\)\. worker-2 \(worker:1 on \S+\) "
                     r"holds the others: its main thread is in its own code, not in TensorFlow, while the others "
                     r"wait inside the collective\.", out), out[-4000:]
    # Each stack labelled by where it is; the hung one's blocking frame, from the dump in its log.
    assert re.search(r"worker-2 +│ main thread is in its own code, innermost first:", out), out[-4000:]
    for peer in ("worker-0", "worker-1"):
        assert re.search(rf"{peer} +│ main thread waits inside TensorFlow \(the collective, for its peers\)", out)
    assert re.search(r"worker-2 +│ blocking frame: File \".*hung_at_step\.py\", line \d+ in on_train_batch_end", out)
    assert stalled["frame"].endswith("in on_train_batch_end") and "hung_at_step.py" in stalled["frame"]
    assert re.search(r"worker-0 +│ +File \".*/tensorflow/python/eager/", out), out[-4000:]
    for worker, log in logs.items():
        assert "(most recent call first):" in log, worker
    assert "in on_train_batch_end" in logs[2]
    # Resumed from the backup: at most one backup interval redone.
    steps = _progress_steps(logs[0])
    resumed = min(step for attempt, step in steps if attempt == 2)
    assert HANG_STEP - (resumed - 1) <= BACKUP_EVERY, (HANG_STEP, resumed)
    assert max(step for attempt, step in steps if attempt == 2) == 40


def test_a_stopped_worker_is_a_failure_not_a_stall(cli):
    """worker-1 stopped (SIGSTOP, like a lost VM): its peer aborts on missed heartbeats (fail-fast),
    before a limit of 20 median steps (6 s) would pass, had the floor not been there."""
    assert cli.run("up", "--workers", "2").returncode == 0
    script = str(SCRIPTS / "hung_at_step.py")
    launcher = cli.popen("train", "--script", script, "--stall-minutes", "1", "--",
                         "--step-seconds", "0.3", "--epochs", "20")
    stopped = None
    try:
        run_dir = wait_for(lambda: cli.runs() and cli.runs()[-1], 30, what="the run folder")
        wait_for(lambda: '"progress"' in _read(run_dir / "worker-1.log"), 90, what="worker-1 training")
        stopped = int((run_dir / "worker-1.attempt1.pid").read_text())
        os.kill(stopped, signal.SIGSTOP)
        out, _ = launcher.communicate(timeout=90)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(timeout=10)
        if stopped is not None:
            _kill(stopped)
    assert launcher.returncode == 1, out[-4000:]
    assert "Stalled" not in out and "stalls" not in json.loads((run_dir / "run.json").read_text())["summary"]
    assert re.search(r"✗ worker-0 \(chief:0 on \S+\) (exited with code|was killed)", out), out[-4000:]
    assert "stopped sending heartbeats" in (run_dir / "worker-0.log").read_text()


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


