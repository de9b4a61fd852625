"""Idle time and when to act, with an injected clock so the rules are testable."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from tfcluster_watchdog.settings import Settings


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
