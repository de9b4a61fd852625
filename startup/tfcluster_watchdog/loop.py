"""The poll loop: read the settings, run the probes, decide, act; keep the idle clock and the
status (status.json, and on Google Cloud the tfcluster/watchdog guest attribute) across restarts."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
import traceback
import urllib.error
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from tfcluster_watchdog import __doc__ as DESCRIPTION
from tfcluster_watchdog.decision import Decision, IdleTracker, read_probes
from tfcluster_watchdog.gce import DeleteFailed, Gce, google_message
from tfcluster_watchdog.probes import probe_boot, probe_gpu, probe_jobs, probe_ssh, run_ended
from tfcluster_watchdog.settings import Settings, parse_settings

MAX_POLL_SECONDS = 60


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
                why = f"{error.code}: {google_message(error)}" if isinstance(error, urllib.error.HTTPError) else error
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
    parser = argparse.ArgumentParser(description=DESCRIPTION.split("\n")[0])
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
