"""What the watchdog reads of the machine. Each probe returns True (busy), False (idle) or None
(not applicable here, e.g. no GPU); run_ended reads whether a `--then stop` run is over."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable

from tfcluster_watchdog.settings import Settings


def run_ended(then: dict) -> str | None:
    """How the run of ``then`` ended on this machine, once its wrapper recorded it; None before.
    The newest attempt's exit file decides: 0 ends the run, and so does any code on the last
    attempt (no retry follows it); a failure with retries left waits for the next attempt."""
    exits = {}
    for path in Path(then["folder"]).glob("*/*.attempt*.exit"):
        attempt = path.name.rsplit(".attempt", 1)[1].removesuffix(".exit")
        if attempt.isdigit():
            exits[int(attempt)] = path
    if not exits:
        return None
    attempt = max(exits)
    try:
        code = int(exits[attempt].read_text().strip())
    except (OSError, ValueError):
        return None  # Being written.
    if code == 0 or attempt >= int(then["last_attempt"]):
        return f"run {then['run']} ended here (attempt {attempt} exited {code})"
    return None


def job_processes(proc: Path = Path("/proc")) -> list[Path]:
    """Every process that carries TFCLUSTER_RUN_ID in its environment (a tfcluster worker)."""
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if any(item.startswith(b"TFCLUSTER_RUN_ID=") for item in (entry / "environ").read_bytes().split(b"\0")):
                found.append(entry)
        except OSError:
            continue  # Gone, or not ours to read.
    return found


def probe_jobs(proc: Path = Path("/proc"), settings: Settings | None = None,
               clock: Callable[[], float] = time.time, stalled: list[str] | None = None) -> bool:
    """A tfcluster worker runs and makes progress (within the stall limit). ``stalled`` collects a
    line for each job found stalled."""
    logs, busy = set(), False
    for entry in job_processes(proc):
        try:
            target = os.readlink(entry / "fd" / "1")
        except OSError:
            target = ""
        if not target.endswith(".log") or not os.path.isfile(target):
            busy = True  # A job whose progress cannot be read (its output goes elsewhere) is busy.
            continue
        logs.add(target)
    for log in sorted(logs):
        quiet, limit = job_quiet(Path(log), settings or Settings(), clock)
        if limit is None or quiet <= limit:
            busy = True
        elif stalled is not None:
            stalled.append(f"{log}: no progress for {quiet:.0f}s (stall limit {limit:.0f}s)")
    return busy


# The launcher's stall rule (tfcluster/stall.py), for a job read from its log.
STARTUP_MINUTES, STEP_FLOOR_MINUTES, STEP_FACTOR = 30.0, 10.0, 20.0
PROGRESS_EVENTS = ("first_step", "step", "progress", "val_step", "backup", "epoch_begin", "epoch_end",
                   "export", "done")
STEP_EVENTS = ("first_step", "step", "progress")
EVENT_PREFIX = "TFCLUSTER_EVENT "
TAIL_BYTES = 1 << 20


def job_quiet(log: Path, settings: Settings, clock: Callable[[], float] = time.time) -> tuple[float, float | None]:
    """(seconds since the job's last progress, its stall limit in seconds or None when off)."""
    if settings.stall_minutes == 0:
        return 0.0, None
    with open(log, "rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        handle.seek(max(0, size - TAIL_BYTES))
        text = handle.read().decode(errors="replace")
        written = os.fstat(handle.fileno()).st_mtime
    last, samples = None, []  # samples: (time, global step) of step events, this attempt only
    for line in text.splitlines():
        start = line.find(EVENT_PREFIX)
        if start < 0:
            if "=== tfcluster:" in line:
                last, samples = None, []  # A new attempt starts in this log.
            continue
        try:
            event = json.loads(line[start + len(EVENT_PREFIX):])
            kind, at = event.get("event"), float(event["time"])
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        if kind not in PROGRESS_EVENTS:
            continue
        last = at
        if kind in STEP_EVENTS and "step" in event:
            steps = int(event.get("steps") or 0)
            step = int(event["step"]) + (max(int(event.get("epoch") or 1), 1) - 1) * steps \
                if kind != "progress" else int(event["step"])
            samples.append((at, step))
    if not samples:  # Before the first step, or a script that reports none: the start-up limit.
        return clock() - written, max(STARTUP_MINUTES, settings.stall_minutes or 0) * 60
    rates = [(b[0] - a[0]) / (b[1] - a[1]) for a, b in zip(samples, samples[1:]) if b[1] > a[1]]
    median = sorted(rates)[len(rates) // 2] if rates else 0.0
    floor = (STEP_FLOOR_MINUTES if settings.stall_minutes is None else settings.stall_minutes) * 60
    return clock() - max(last, samples[-1][0]), max(floor, STEP_FACTOR * median)


def _stat(entry: Path) -> list[str] | None:
    try:
        raw = (entry / "stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2:].split()


def probe_ssh(proc: Path = Path("/proc")) -> bool:
    """An interactive SSH session is open: a process on a pts whose parent is sshd."""
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat(entry)
        if not fields:
            continue
        ppid, tty_nr = fields[1], int(fields[4])
        major = (tty_nr >> 8) & 0xFFF
        if not 136 <= major <= 143:  # Unix98 pseudo-terminals (pts).
            continue
        try:
            parent = (proc / ppid / "comm").read_text().strip()
        except OSError:
            continue
        if parent.startswith("sshd"):  # sshd, or sshd-session on OpenSSH >= 9.8.
            return True
    return False


def probe_boot(marker: Path | None, grace_seconds: float, clock: Callable[[], float] = time.time) -> bool | None:
    """The boot script is still working (its marker exists) and started less than the grace ago;
    None where no marker is watched (own hosts)."""
    if marker is None:
        return None
    try:
        started = marker.stat().st_mtime
    except FileNotFoundError:
        return False
    return clock() - started < grace_seconds


def probe_gpu(threshold: float, nvidia_smi: str | None = None) -> bool | None:
    """GPU utilisation above ``threshold`` percent on any GPU; None where there is no GPU."""
    binary = nvidia_smi or shutil.which("nvidia-smi")
    if not binary:
        return None
    out = subprocess.run([binary, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=20, check=True).stdout
    values = [float(line) for line in out.split() if line.strip()]
    return any(value > threshold for value in values)
