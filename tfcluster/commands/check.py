"""`invoke check`: what the account, project and this machine must offer before `up` creates
anything, one line each, printed by the backend's own checks (Backend.check)."""

from __future__ import annotations

from tfcluster.commands.common import backend_named, console
from tfcluster.config import Settings
from tfcluster.errors import ConfigError
from tfcluster.state import StateStore


def check(settings: Settings) -> None:
    """Print one line per prerequisite; raise (exit 2) when any definitely fails (✗)."""
    findings = backend_named(settings.backend, StateStore(settings)).check(settings)
    if not findings:
        console.print(f"Nothing to check for the {settings.backend} backend: it needs no account or project.")
        return
    for finding in findings:
        console.print(finding.line(), markup=False, highlight=False, soft_wrap=True)
    failed = [finding.subject for finding in findings if finding.holds is False]
    unknown = sum(finding.holds is None for finding in findings)
    if failed:
        raise ConfigError(f"{len(failed)} of {len(findings)} checks fail ({', '.join(failed)}); fix what their ✗ "
                          "lines name, then run invoke check again")
    console.print(f"{len(findings) - unknown} of {len(findings)} checks hold"
                  + (f"; {unknown} could not be made (?): `up` may still fail there" if unknown else
                     "; `invoke up` may go ahead"), markup=False, highlight=False)
