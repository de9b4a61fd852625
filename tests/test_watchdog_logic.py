"""The idle watchdog's decision rules, with an injected clock and probes."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

# The package as the VM runs it (python3 <folder>/tfcluster_watchdog): standard library only.
sys.path.insert(0, str(REPO / "startup"))
from tfcluster_watchdog import decision as watchdog_decision, loop as watchdog_loop  # noqa: E402
from tfcluster_watchdog import probes as watchdog_probes, settings as watchdog_settings  # noqa: E402


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


SETTINGS = watchdog_settings.Settings(idle_minutes=10, action="stop")
IDLE = {"jobs": False, "ssh": False}


def test_idle_then_acts_on_time():
    clock = Clock()
    tracker = watchdog_decision.IdleTracker(clock, boot_id="boot-1")
    first = tracker.observe(IDLE, SETTINGS, "boot-1")
    assert (first.busy, first.idle_seconds, first.act, first.acts_at) == (False, 0.0, False, 1000.0 + 600)
    clock.now += 599
    assert tracker.observe(IDLE, SETTINGS, "boot-1").act is False
    clock.now += 1
    decision = tracker.observe(IDLE, SETTINGS, "boot-1")
    assert decision.act is True and decision.idle_seconds == 600
    tracker.acted()
    assert tracker.observe(IDLE, SETTINGS, "boot-1").act is False  # No second action right away.


def test_activity_resets_the_clock():
    clock = Clock()
    tracker = watchdog_decision.IdleTracker(clock, boot_id="b")
    tracker.observe(IDLE, SETTINGS, "b")
    clock.now += 500
    busy = tracker.observe({"jobs": True, "ssh": False}, SETTINGS, "b")
    assert busy.busy and busy.acts_at is None and not busy.act
    clock.now += 1
    again = tracker.observe(IDLE, SETTINGS, "b")
    assert again.idle_seconds == 0 and again.acts_at == clock.now + 600
    clock.now += 599
    assert not tracker.observe(IDLE, SETTINGS, "b").act


def test_reboot_resets_the_clock_even_from_saved_state():
    clock = Clock(5000)
    # The state file says idle since long ago, but the boot id changed: a reboot.
    tracker = watchdog_decision.IdleTracker(clock, boot_id="old-boot", idle_since=0.0)
    decision = tracker.observe(IDLE, SETTINGS, "new-boot")
    assert decision.idle_seconds == 0 and not decision.act
    # Same boot: the saved idle time counts (a watchdog restart does not reset it).
    same = watchdog_decision.IdleTracker(clock, boot_id="b", idle_since=0.0)
    assert same.observe(IDLE, SETTINGS, "b").act is True


def test_failing_probe_neither_crashes_nor_counts_as_activity():
    clock = Clock()
    logged = []

    def broken():
        raise OSError("nvidia-smi: driver not loaded")

    settings = watchdog_settings.Settings(idle_minutes=1, probes=("jobs", "gpu"))
    readings = watchdog_decision.read_probes(settings, {"jobs": lambda: False, "gpu": broken}, logged.append)
    assert readings["gpu"].startswith("error: OSError: nvidia-smi: driver not loaded")
    assert logged and "probe gpu failed" in logged[0]
    tracker = watchdog_decision.IdleTracker(clock, boot_id="b")
    tracker.observe(readings, settings, "b")
    clock.now += 60
    assert tracker.observe(readings, settings, "b").act is True


def test_only_configured_probes_count():
    tracker = watchdog_decision.IdleTracker(Clock(), boot_id="b")
    jobs_only = watchdog_settings.Settings(idle_minutes=1, probes=("jobs",))
    assert not tracker.observe({"jobs": False, "ssh": True}, jobs_only, "b").busy
    assert tracker.observe({"jobs": False, "ssh": True}, SETTINGS, "b").busy


def test_disabled_means_no_action():
    clock = Clock()
    tracker = watchdog_decision.IdleTracker(clock, boot_id="b")
    off = watchdog_settings.Settings(idle_minutes=0)
    tracker.observe(IDLE, off, "b")
    clock.now += 10 ** 6
    decision = tracker.observe(IDLE, off, "b")
    assert decision.act is False and decision.acts_at is None and decision.idle_seconds == 10 ** 6


def test_settings_parsing_names_bad_values():
    parsed = watchdog_settings.parse_settings({"idle_minutes": "15", "action": "delete", "probes": "all"})
    assert (parsed.idle_minutes, parsed.action, parsed.probes) == (15.0, "delete", ("jobs", "ssh", "gpu"))
    assert watchdog_settings.parse_settings({"probes": "jobs,gpu"}).probes == ("jobs", "gpu")
    with pytest.raises(ValueError, match="action must be one of stop, delete"):
        watchdog_settings.parse_settings({"action": "hibernate"})
    with pytest.raises(ValueError, match="probes must be jobs_and_ssh, jobs, all or a list"):
        watchdog_settings.parse_settings({"probes": "cpu"})
    with pytest.raises(SystemExit):
        watchdog_loop.parse_args(["--config", "x", "--poll-seconds", "120"])  # Poll interval <= 60 s.


def test_gpu_probe_skips_without_nvidia_smi_and_reads_utilisation(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert watchdog_probes.probe_gpu(10) is None  # No GPU tooling: the probe is skipped.
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nprintf '3\\n47\\n'\n")
    fake.chmod(0o755)
    assert watchdog_probes.probe_gpu(10, str(fake)) is True
    assert watchdog_probes.probe_gpu(50, str(fake)) is False


def test_a_working_boot_script_counts_as_activity_for_a_bounded_time(tmp_path):
    """The watchdog runs before the install; a slow first boot is not idleness, a hung one is."""
    clock = Clock(5000.0)
    marker = tmp_path / "booting"
    marker.touch()
    os.utime(marker, (clock.now, clock.now))
    settings = watchdog_settings.Settings(idle_minutes=10, action="stop", boot_grace_minutes=45)
    tracker = watchdog_decision.IdleTracker(clock, boot_id="b")

    def observe():
        readings = {**IDLE, "boot": watchdog_probes.probe_boot(marker, settings.boot_grace_minutes * 60, clock)}
        return tracker.observe(readings, settings, "b")

    clock.now += 44 * 60
    assert observe().busy is True  # Still installing after 44 minutes: not idle.
    clock.now += 2 * 60
    assert observe().busy is False  # Past the grace: a hung install is idleness like any other...
    clock.now += 10 * 60
    assert observe().act is True  # ...and the VM is stopped 10 idle minutes later.
    marker.unlink()  # The boot script finished (or failed) and removed its marker.
    assert watchdog_probes.probe_boot(marker, 2700, clock) is False
    assert watchdog_probes.probe_boot(None, 2700, clock) is None  # Own hosts watch no marker.
    assert watchdog_settings.parse_settings({"boot_grace_minutes": "5"}).boot_grace_minutes == 5
    with pytest.raises(ValueError, match="boot_grace_minutes must be between 0 and 1440"):
        watchdog_settings.parse_settings({"boot_grace_minutes": "-1"})


def _event(kind: str, at: float, **fields) -> str:
    return "TFCLUSTER_EVENT " + json.dumps({"event": kind, "time": at, **fields})


def _fake_job(proc: Path, pid: int, log: Path, run_id: str = "r1") -> None:
    """A /proc entry for a worker: TFCLUSTER_RUN_ID in its environment, stdout on ``log``."""
    (proc / str(pid) / "fd").mkdir(parents=True)
    (proc / str(pid) / "environ").write_bytes(f"PATH=/bin\0TFCLUSTER_RUN_ID={run_id}\0".encode())
    (proc / str(pid) / "fd" / "1").symlink_to(log)


def test_a_job_whose_last_progress_is_older_than_the_stall_limit_is_idle(tmp_path):
    """The launcher's rule read from the job's own log: max(10 min, 20 x median step) after the first
    step; the start-up limit (30 min since the last write) before it."""
    proc, log = tmp_path / "proc", tmp_path / "worker-0.log"
    _fake_job(proc, 4242, log)
    clock = Clock(10_000.0)
    log.write_text("=== tfcluster: worker-0 (chief:0) attempt 1 on vm ===\nbuilding the model\n")
    os.utime(log, (clock.now, clock.now))
    default = watchdog_settings.Settings()
    clock.now += 29 * 60
    assert watchdog_probes.probe_jobs(proc, default, clock) is True  # Start-up: 30 minutes.
    clock.now += 2 * 60
    stalled = []
    assert watchdog_probes.probe_jobs(proc, default, clock, stalled) is False
    assert stalled == [f"{log}: no progress for 1860s (stall limit 1800s)"]

    # Steps of 45 s (the first one slow): 20 x 45 s = 15 min beats the 10-minute floor.
    start = clock.now
    lines = [_event("first_step", start, epoch=1, step=1, steps=100)]
    lines += [_event("step", start + 100 + 45 * i, epoch=1, step=2 + i, steps=100) for i in range(5)]
    # The epoch's end (after validation) is progress, though not a step; a strategy line is neither.
    lines += [_event("epoch_end", start + 100 + 45 * 4 + 10, epoch=1), _event("strategy", start + 900)]
    log.write_text("\n".join(lines) + "\n")
    last = start + 100 + 45 * 4 + 10
    clock.now = last + 15 * 60
    assert watchdog_probes.job_quiet(log, default, clock) == (15 * 60, 20 * 45.0)
    assert watchdog_probes.probe_jobs(proc, default, clock) is True
    clock.now += 1
    assert watchdog_probes.probe_jobs(proc, default, clock) is False
    # stall_minutes replaces the floor; 0 turns it off.
    assert watchdog_probes.job_quiet(log, watchdog_settings.Settings(stall_minutes=30), clock)[1] == 1800
    assert watchdog_probes.probe_jobs(proc, watchdog_settings.Settings(stall_minutes=0), clock) is True
    # A new attempt in the same log starts over with its own start-up limit.
    with log.open("a") as handle:
        handle.write("=== tfcluster: worker-0 (chief:0) attempt 2 on vm ===\n")
    os.utime(log, (clock.now, clock.now))
    assert watchdog_probes.job_quiet(log, default, clock) == (0, 1800)


def test_a_job_without_a_readable_log_stays_busy_and_progress_calls_count(tmp_path):
    proc = tmp_path / "proc"
    _fake_job(proc, 7, Path("/dev/null"))  # Output elsewhere: nothing to judge, so busy.
    assert watchdog_probes.probe_jobs(proc, watchdog_settings.Settings(stall_minutes=1), Clock(10 ** 9)) is True
    log = tmp_path / "w.log"
    log.write_text("\n".join(_event("progress", 100.0 + i, step=i) for i in range(1, 4)) + "\n")
    assert watchdog_probes.job_quiet(log, watchdog_settings.Settings(stall_minutes=1), Clock(200.0)) == (97.0, 60.0)
    assert watchdog_settings.parse_settings({"stall_minutes": "2.5"}).stall_minutes == 2.5
    with pytest.raises(ValueError, match="stall_minutes must be between 0 and 10080"):
        watchdog_settings.parse_settings({"stall_minutes": "-1"})


def _exit_file(folder: Path, attempt: int, code: int) -> None:
    worker = folder / "worker-1"
    worker.mkdir(parents=True, exist_ok=True)
    (worker / f"worker-1.attempt{attempt}.exit").write_text(f"{code}\n")


def test_then_stop_waits_for_the_runs_recorded_end(tmp_path):
    then = {"run": "r-1", "folder": str(tmp_path / "r-1"), "last_attempt": 2}
    assert watchdog_probes.run_ended(then) is None  # Nothing recorded yet (or the folder is not there).
    _exit_file(tmp_path / "r-1", 1, 143)
    assert watchdog_probes.run_ended(then) is None  # A failure with a retry left: the launcher may retry.
    _exit_file(tmp_path / "r-1", 2, 1)
    assert watchdog_probes.run_ended(then) == "run r-1 ended here (attempt 2 exited 1)"  # The last attempt.
    other = {"run": "r-2", "folder": str(tmp_path / "r-2"), "last_attempt": 3}
    _exit_file(tmp_path / "r-2", 1, 0)
    assert watchdog_probes.run_ended(other) == "run r-2 ended here (attempt 1 exited 0)"  # Success ends it.


@pytest.mark.parametrize("raw", ['{"run": "r"}', '{"run": "r", "folder": "/x", "last_attempt": 0}', "[1]"])
def test_then_stop_refuses_a_setting_without_run_folder_and_attempt(raw):
    with pytest.raises(ValueError, match="then_stop must name a run"):
        watchdog_settings.parse_settings({"then_stop": raw})
    assert watchdog_settings.parse_settings({"then_stop": '{"run": "r", "folder": "/x", "last_attempt": 1}'}).then_stop == \
        {"run": "r", "folder": "/x", "last_attempt": 1}


def test_budget_end_halts_the_machine_once_at_that_time(tmp_path, capsys):
    """`train --budget`: the run's budget end time (re-read each poll) halts the machine even while
    its job is busy, once: a machine started again later stays up."""
    config, acted = tmp_path / "config.json", tmp_path / "acted"
    config.write_text(json.dumps({"idle_minutes": 0, "probes": "jobs", "budget_end": 2000.0}))
    args = watchdog_loop.parse_args(["--config", str(config), "--state-dir", str(tmp_path / "state"),
                                "--action-command", f"echo $TFCLUSTER_IDLE_ACTION >> {acted}"])
    clock = Clock(1990.0)
    dog = watchdog_loop.Watchdog(args, clock)
    dog.poll_once()
    assert not acted.exists()  # Before the end time: nothing.
    clock.now = 2000.0
    dog.poll_once()
    assert acted.read_text() == "stop\n"
    assert "the run's --budget ran out at 1970-01-01T00:33:20Z: halting" in capsys.readouterr().out
    status = json.loads((tmp_path / "state" / "status.json").read_text())  # Published before the halt.
    assert status["budget_end"] == 2000.0 and status["budget_ran_out"] is True
    clock.now = 2030.0
    dog.poll_once()  # A poll while the halt is still under way (a slow shutdown): no second halt, still run out.
    status = json.loads((tmp_path / "state" / "status.json").read_text())
    assert acted.read_text() == "stop\n" and status["budget_ran_out"] is True
    clock.now = 2100.0
    watchdog_loop.Watchdog(args, clock).poll_once()  # Started again (state read back): once per end time.
    assert acted.read_text() == "stop\n"
    config.write_text(json.dumps({"idle_minutes": 0, "probes": "jobs", "budget_end": 2050.0}))
    dog.poll_once()  # A new run's budget, already over: halts again.
    assert acted.read_text() == "stop\nstop\n"
