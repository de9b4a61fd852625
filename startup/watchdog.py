#!/usr/bin/env python3
"""tfcluster idle watchdog: stops (or deletes) a machine that nobody uses, so it stops billing.

Runs on the VM (systemd service from startup.sh) or on a bring-your-own host (started by
`invoke up --idle-minutes N`). Standard library only.

Every poll (at most 60 s apart) it reads its settings afresh, so a change from the laptop
(`invoke idle`) applies without recreating anything, runs each probe, and decides:

- busy while any enabled probe sees activity: a tfcluster training process that makes progress
  (see "stalls" below), an interactive
  SSH session (a pts whose parent is sshd), or GPU utilisation above a threshold; and, always,
  while the boot script is still working (its marker file exists), for at most
  ``boot_grace_minutes`` after it started, so a hung install cannot keep a VM billing;
- idle time starts when the machine stops being busy and resets on any activity and after a
  reboot (the kernel's boot id changes);
- after ``idle_minutes`` idle it logs the decision with the probe readings, then acts:
  ``stop`` halts the guest (the instance goes to TERMINATED; disks keep billing), ``delete``
  deletes the VM through the Compute API with the metadata server's token and waits on its
  operation. A refused delete (a missing role, the API off), or one whose operation ends in an
  error, halts the guest instead and says so in its status, so the VM stops billing for its GPU
  either way;
- a training run counts as idle once its last progress is older than the stall limit, so a
  stalled job cannot hold a VM past the limit plus the idle time. Progress is read from the job's
  own log (its stdout, /proc/PID/fd/1): the trainer's step events and ``tfcluster.progress``
  calls (``TFCLUSTER_EVENT`` lines with their time). The limit is the launcher's rule
  (tfcluster/stall.py): max(``stall_minutes`` or 10 min, 20 x the median step time) after the
  first step; before it, or for a script that reports no steps, 30 min (or ``stall_minutes`` if
  larger) since the log was last written. A job whose log cannot be found counts as busy;
- ``idle_minutes = 0`` disables it (the hypervisor deadline, max_run_duration, still applies);
- ``then_stop`` (`train --then stop|down`) halts the machine as soon as that run's end is recorded
  here, laptop or not: its newest attempt's exit file (the launcher's wrapper writes it) reads 0,
  or any code on the last attempt the launcher allows. Once per run: a restarted VM stays up;
- ``budget_end`` (`train --budget`) halts the machine at that Unix time, laptop or not. Once per
  end time, as ``then_stop``.

A failing probe is logged and read as "no activity seen": a broken probe must not keep a
forgotten VM billing forever. Nothing a probe or a settings source does can kill the loop.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

MAX_POLL_SECONDS = 60
# A delete's zone operation is read every few seconds; a VM delete takes well under a minute, so a
# machine still here after this long was not deleted.
DELETE_POLL_SECONDS = 2.0
DELETE_WAIT_SECONDS = 600.0
PROBE_SETS = {
    "jobs_and_ssh": ("jobs", "ssh"),  # The default, as SkyPilot's autostop does it.
    "jobs": ("jobs",),
    "all": ("jobs", "ssh", "gpu"),
}
ALL_PROBES = ("jobs", "ssh", "gpu")
ACTIONS = ("stop", "delete")


@dataclass
class Settings:
    # Minutes of idleness before acting; 0 disables the watchdog.
    idle_minutes: float = 30.0
    # "stop" or "delete".
    action: str = "stop"
    # Probes that count as activity.
    probes: tuple[str, ...] = PROBE_SETS["jobs_and_ssh"]
    # GPU utilisation (percent) above which the gpu probe reports busy.
    gpu_threshold: float = 10.0
    # The boot script counts as activity for at most this long after it started.
    boot_grace_minutes: float = 45.0
    # A job whose last progress is older than the stall limit is idle; this replaces the limit's
    # 10-minute floor (None: the defaults; 0: a live job is always busy).
    stall_minutes: float | None = None
    # `train --then stop|down`: {"run": id, "folder": the run's folder on this machine,
    # "last_attempt": N}; the machine halts when that run's end is recorded (None: no such run).
    then_stop: dict | None = None
    # `train --budget`: the Unix time the run's budget runs out; the machine halts then (None: none).
    budget_end: float | None = None


def parse_settings(raw: dict) -> Settings:
    """Settings from a flat dict of strings (metadata attributes or a JSON file); bad values raise."""
    settings = Settings()
    if raw.get("idle_minutes") not in (None, ""):
        settings.idle_minutes = float(raw["idle_minutes"])
        if not 0 <= settings.idle_minutes <= 10080:
            raise ValueError(f"idle_minutes must be between 0 and 10080 (got {raw['idle_minutes']})")
    if raw.get("action") not in (None, ""):
        if raw["action"] not in ACTIONS:
            raise ValueError(f"action must be one of {', '.join(ACTIONS)} (got {raw['action']!r})")
        settings.action = raw["action"]
    if raw.get("probes") not in (None, ""):
        text = str(raw["probes"])
        names = PROBE_SETS.get(text) or tuple(p.strip() for p in text.split(",") if p.strip())
        unknown = [name for name in names if name not in ALL_PROBES]
        if unknown or not names:
            raise ValueError(f"probes must be {', '.join(PROBE_SETS)} or a list of {', '.join(ALL_PROBES)} "
                             f"(got {text!r})")
        settings.probes = tuple(names)
    if raw.get("gpu_threshold") not in (None, ""):
        settings.gpu_threshold = float(raw["gpu_threshold"])
    if raw.get("boot_grace_minutes") not in (None, ""):
        settings.boot_grace_minutes = float(raw["boot_grace_minutes"])
        if not 0 <= settings.boot_grace_minutes <= 1440:
            raise ValueError(f"boot_grace_minutes must be between 0 and 1440 (got {raw['boot_grace_minutes']})")
    if raw.get("stall_minutes") not in (None, ""):
        settings.stall_minutes = float(raw["stall_minutes"])
        if not 0 <= settings.stall_minutes <= 10080:
            raise ValueError(f"stall_minutes must be between 0 and 10080 (got {raw['stall_minutes']})")
    if raw.get("then_stop") not in (None, ""):
        then = raw["then_stop"] if isinstance(raw["then_stop"], dict) else json.loads(raw["then_stop"])
        if not (isinstance(then, dict) and then.get("run") and then.get("folder")
                and int(then.get("last_attempt", 0)) >= 1):
            raise ValueError(f"then_stop must name a run, its folder and its last attempt (got {raw['then_stop']!r})")
        settings.then_stop = then
    if raw.get("budget_end") not in (None, ""):
        settings.budget_end = float(raw["budget_end"])
    return settings


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


# ---------------------------------------------------------------- probes
# Each returns True (busy), False (idle) or None (not applicable here, e.g. no GPU).


def _proc_entries():
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            yield entry


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


# ---------------------------------------------------------------- decision


@dataclass
class Decision:
    # Whether any probe saw activity.
    busy: bool
    # Seconds idle so far (0 while busy).
    idle_seconds: float
    # Whether the action is due now.
    act: bool
    # Unix time the action will fire if nothing changes (None: busy or disabled).
    acts_at: float | None
    # The readings: probe name -> True / False / None (skipped) / "error: ...".
    readings: dict = field(default_factory=dict)


class IdleTracker:
    """Idle-time bookkeeping with an injected clock, so the rules are testable."""

    def __init__(self, clock: Callable[[], float] = time.time, boot_id: str = "",
                 idle_since: float | None = None):
        self.clock = clock
        self.boot_id = boot_id
        self.idle_since = idle_since

    def observe(self, readings: dict, settings: Settings, boot_id: str = "") -> Decision:
        now = self.clock()
        if boot_id and boot_id != self.boot_id:
            # A reboot: idleness counts from now, whatever the state file said.
            self.boot_id, self.idle_since = boot_id, None
        # The boot script's reading counts whatever probes are configured: it is not a probe of
        # use but of a machine that is not ready yet.
        busy = any(readings.get(name) is True for name in (*settings.probes, "boot"))
        if busy:
            self.idle_since = None
            return Decision(True, 0.0, False, None, readings)
        if self.idle_since is None:
            self.idle_since = now
        idle = now - self.idle_since
        if settings.idle_minutes <= 0:
            return Decision(False, idle, False, None, readings)
        acts_at = self.idle_since + settings.idle_minutes * 60
        return Decision(False, idle, now >= acts_at, acts_at, readings)

    def acted(self) -> None:
        """After acting, idleness counts afresh (no second action on the very next poll)."""
        self.idle_since = self.clock()


def read_probes(settings: Settings, probes: dict[str, Callable[[], bool | None]],
                log: Callable[[str], None]) -> dict:
    readings = {}
    for name in settings.probes:
        try:
            readings[name] = probes[name]()
        except Exception as error:  # noqa: BLE001 - one failing probe never kills the watchdog
            readings[name] = f"error: {type(error).__name__}: {error}"
            log(f"probe {name} failed: {readings[name]} (read as no activity)")
    return readings


# ---------------------------------------------------------------- GCE metadata and Compute API


class Gce:
    """The metadata server (GCE_METADATA_HOST, as Google's own libraries read it) and the Compute API."""

    COMPUTE_API = "https://compute.googleapis.com"

    def __init__(self, metadata_host: str | None = None):
        self.metadata = f"http://{metadata_host or os.environ.get('GCE_METADATA_HOST', 'metadata.google.internal')}"

    def get(self, path: str, timeout: float = 5) -> str:
        request = urllib.request.Request(f"{self.metadata}/computeMetadata/v1/{path}",
                                         headers={"Metadata-Flavor": "Google"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.read().decode()

    def attribute(self, name: str) -> str | None:
        try:
            return self.get(f"instance/attributes/{name}")
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            raise

    def put_guest_attribute(self, key: str, value: str) -> None:
        request = urllib.request.Request(f"{self.metadata}/computeMetadata/v1/instance/guest-attributes/{key}",
                                         data=value.encode(), method="PUT", headers={"Metadata-Flavor": "Google"})
        urllib.request.urlopen(request, timeout=5).close()

    def settings(self) -> Settings:
        return parse_settings({
            "idle_minutes": self.attribute("tfcluster-idle-minutes"),
            "action": self.attribute("tfcluster-idle-action"),
            "probes": self.attribute("tfcluster-idle-probes"),
            "gpu_threshold": self.attribute("tfcluster-gpu-threshold"),
            "boot_grace_minutes": self.attribute("tfcluster-boot-grace-minutes"),
            "stall_minutes": self.attribute("tfcluster-stall-minutes"),
            "then_stop": self.attribute("tfcluster-then-stop"),
            "budget_end": self.attribute("tfcluster-budget-end"),
        })

    def token(self) -> str:
        """The VM's own service account's access token (the metadata server refreshes it)."""
        return json.loads(self.get("instance/service-accounts/default/token"))["access_token"]

    def delete_self(self, log: Callable[[str], None], wait_seconds: float = DELETE_WAIT_SECONDS,
                    clock: Callable[[], float] = time.monotonic) -> str:
        """DELETE this instance via the Compute API with the VM's own service account, then wait
        on its zone operation: Compute accepts the request and may still fail it, ending the
        operation DONE with `error` (https://cloud.google.com/compute/docs/reference/rest/v1/zoneOperations/get;
        google-api-core's ExtendedOperation raises from it). DeleteFailed says why, so the machine
        halts instead of billing on. Where the operation cannot be read (no
        compute.zoneOperations.get), the machine waits to be deleted: still here after
        ``wait_seconds``, the delete did not happen."""
        project = self.get("project/project-id")
        zone = self.get("instance/zone").rsplit("/", 1)[-1]
        name = self.get("instance/name")
        base = f"{self.COMPUTE_API}/compute/v1/projects/{project}/zones/{zone}"
        request = urllib.request.Request(f"{base}/instances/{name}", method="DELETE",
                                         headers={"Authorization": f"Bearer {self.token()}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            operation = json.loads(response.read().decode() or "{}")
        what = f"DELETE {project}/{zone}/{name}: operation {operation.get('name', '?')}"
        log(f"{what}; waiting for it")
        deadline, unreadable = clock() + wait_seconds, ""
        while operation.get("status") != "DONE":
            if clock() > deadline:
                raise DeleteFailed(f"{what} not done after {wait_seconds:g}s" + (f" ({unreadable})" if unreadable else ""))
            time.sleep(DELETE_POLL_SECONDS)
            if unreadable:
                continue  # Deleting this machine ends this process; until the deadline, wait for it.
            reading = urllib.request.Request(f"{base}/operations/{operation.get('name', '')}",
                                             headers={"Authorization": f"Bearer {self.token()}"})
            try:
                with urllib.request.urlopen(reading, timeout=30) as response:
                    operation = json.loads(response.read().decode() or "{}")
            except urllib.error.HTTPError as error:
                unreadable = f"its operation cannot be read: {error.code}: {_google_message(error)}"
                log(f"{what}: {unreadable}; waiting for the machine to go")
        errors = (operation.get("error") or {}).get("errors") or []
        if errors:
            raise DeleteFailed(f"{what} failed: " + "; ".join(
                f"{e.get('code', '?')}: {e.get('message', '')}" for e in errors))
        return f"{what} done"


class DeleteFailed(Exception):
    """Compute took the delete but did not carry it out."""


# ---------------------------------------------------------------- the loop


def _google_message(error: urllib.error.HTTPError) -> str:
    """The message of Google's JSON error body (https://cloud.google.com/apis/design/errors), else the reason."""
    try:
        return str(json.loads(error.read().decode())["error"]["message"])[:200]
    except Exception:  # noqa: BLE001 - any body at all
        return str(error.reason)


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


class Watchdog:
    def __init__(self, args: argparse.Namespace, clock: Callable[[], float] = time.time):
        self.args = args
        self.state_dir = Path(args.state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.gce = Gce() if args.gce else None
        saved = self._load_state()
        self.tracker = IdleTracker(clock, saved.get("boot_id", ""), saved.get("idle_since"))
        # The run whose end this machine already halted for (--then stop acts once per run).
        self.then_done: str | None = saved.get("then_done")
        self.budget_done: float | None = saved.get("budget_done")  # The budget end it halted for.
        self.settings = Settings()
        # Why the last delete was refused, shown by `invoke status` (None: no refusal).
        self.refused: str | None = None
        self.last_status: dict = {}

    def log(self, message: str) -> None:
        print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} tfcluster-watchdog: {message}", flush=True)

    def _load_state(self) -> dict:
        try:
            return json.loads((self.state_dir / "state.json").read_text())
        except (OSError, ValueError):
            return {}

    def _save(self, name: str, payload: dict) -> None:
        tmp = self.state_dir / f".{name}.tmp"
        tmp.write_text(json.dumps(payload, sort_keys=True))
        tmp.replace(self.state_dir / name)

    def read_settings(self) -> Settings:
        try:
            if self.gce is not None:
                return self.gce.settings()
            raw = json.loads(Path(self.args.config).read_text())
            return parse_settings({key: raw.get(key) for key in ("idle_minutes", "action", "probes", "gpu_threshold",
                                                                  "stall_minutes", "then_stop", "budget_end")})
        except Exception as error:  # noqa: BLE001 - keep the last good settings
            self.log(f"cannot read settings ({type(error).__name__}: {error}); keeping the last good ones")
            return self.settings

    def act(self, decision: Decision) -> None:
        action = self.settings.action
        self.log(f"idle for {decision.idle_seconds:.1f}s (limit {self.settings.idle_minutes:g} min); "
                 f"action {action}; probes {json.dumps(decision.readings, sort_keys=True)}")
        if action == "delete" and not self.args.action_command:
            if self.gce is None:
                raise RuntimeError("action delete needs --gce (the Compute API)")
            try:
                self.log(self.gce.delete_self(self.log))
            except (urllib.error.HTTPError, DeleteFailed) as error:
                why = f"{error.code}: {_google_message(error)}" if isinstance(error, urllib.error.HTTPError) else error
                verb = "refused by" if isinstance(error, urllib.error.HTTPError) else "failed in"
                self.refused = f"delete {verb} the Compute API ({why}); halted instead"
                self.log(self.refused)
                self._publish(self.last_status)  # Before the halt: nothing runs after it.
                self._power_off("stop")
        else:
            self._power_off(action)
        self.tracker.acted()

    def halt(self, why: str) -> None:
        """Halt the machine now (the instance goes to TERMINATED), whatever the idle action."""
        self.log(f"{why}: halting")
        self._power_off("stop")
        self.tracker.acted()

    def _power_off(self, action: str) -> None:
        """Halt the guest; tests and custom setups run --action-command instead (told the action)."""
        if self.args.action_command:
            subprocess.run(self.args.action_command, shell=True, check=True, timeout=120,
                           env={**os.environ, "TFCLUSTER_IDLE_ACTION": action})
        else:
            subprocess.run(["shutdown", "-h", "now"], check=True, timeout=60)

    def _publish(self, status: dict) -> None:
        """status.json, and on Google Cloud the tfcluster/watchdog guest attribute `invoke status` reads."""
        status = {**status, "refused": self.refused}
        self.last_status = status
        self._save("status.json", status)
        if self.gce is not None:
            try:
                self.gce.put_guest_attribute("tfcluster/watchdog", json.dumps(status, sort_keys=True))
            except Exception as error:  # noqa: BLE001 - status is a courtesy, never fatal
                self.log(f"cannot publish status: {error}")

    def poll_once(self) -> Decision:
        self.settings = self.read_settings()
        settings = self.settings
        stalled: list[str] = []
        probes = {
            "jobs": lambda: probe_jobs(settings=settings, clock=self.tracker.clock, stalled=stalled),
            "ssh": probe_ssh,
            "gpu": lambda: probe_gpu(settings.gpu_threshold, self.args.nvidia_smi),
        }
        readings = read_probes(settings, probes, self.log)
        if stalled:
            readings["stalled"] = stalled
        marker = Path(self.args.boot_marker) if self.args.boot_marker else None
        readings["boot"] = probe_boot(marker, settings.boot_grace_minutes * 60, self.tracker.clock)
        decision = self.tracker.observe(readings, settings, boot_id())
        then = settings.then_stop
        ended = run_ended(then) if then and then["run"] != self.then_done else None
        if ended:
            self.then_done = then["run"]
        end = settings.budget_end
        spent = end is not None and end != self.budget_done and self.tracker.clock() >= end
        if spent:
            self.budget_done = end
        self._save("state.json", {"boot_id": self.tracker.boot_id, "idle_since": self.tracker.idle_since,
                                  "then_done": self.then_done, "budget_done": self.budget_done})
        self._publish({**asdict(decision), "idle_minutes": settings.idle_minutes, "action": settings.action,
                       "probes": list(settings.probes), "updated_at": time.time(), "then_stop": ended,
                       # Once run out, it stays so: a poll during the halt (a slow shutdown) must not say otherwise.
                       "budget_end": end, "budget_ran_out": end is not None and end == self.budget_done})
        if ended:
            self.halt(f"{ended}; --then stop")
        elif spent:
            self.halt(f"the run's --budget ran out at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(end))}")
        elif decision.act:
            self.act(decision)
        return decision

    def run(self) -> None:
        poll = min(self.args.poll_seconds, MAX_POLL_SECONDS)
        self.log(f"started: poll every {poll:g}s, state in {self.state_dir}")
        while True:
            try:
                self.poll_once()
            except Exception:  # noqa: BLE001 - log and keep watching
                self.log("poll failed:\n" + traceback.format_exc())
            time.sleep(poll)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--gce", action="store_true", help="read settings from instance metadata")
    source.add_argument("--config", help="read settings from this JSON file on every poll")
    parser.add_argument("--state-dir", default="/var/lib/tfcluster", help="idle clock and status.json")
    parser.add_argument("--poll-seconds", type=float, default=30.0, help=f"at most {MAX_POLL_SECONDS}")
    parser.add_argument("--action-command", help="shell command to run instead of stop/delete")
    parser.add_argument("--nvidia-smi", help="path of nvidia-smi (default: from PATH)")
    parser.add_argument("--boot-marker", help="file the boot script holds while it works (counts as activity)")
    args = parser.parse_args(argv)
    if not 0 < args.poll_seconds <= MAX_POLL_SECONDS:
        parser.error(f"--poll-seconds must be in (0, {MAX_POLL_SECONDS}]")
    return args


def main(argv=None) -> int:
    Watchdog(parse_args(argv)).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
