"""What the watchdog is told (instance metadata or a JSON file), read afresh on every poll; a bad
value is refused with a message that names it."""

from __future__ import annotations

import json
from dataclasses import dataclass

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
