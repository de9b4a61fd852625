"""Where settings come from, before each key's own rule (tfcluster/config.py): the per-user state
folder, the INVOKE_TFCLUSTER_* variables (read as text here, never cast by invoke), and the kinds of
value no setting takes from YAML (a list, a mapping, a stray yes/no)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Mapping, MutableMapping

from tfcluster.errors import ConfigError


def user_state_dir() -> Path:
    """tfcluster's folder in the platform's per-user state folder: ``$XDG_STATE_HOME/tfcluster``, by
    default ``~/.local/state/tfcluster`` (the XDG Base Directory Specification, which ignores a
    relative ``XDG_STATE_HOME``), and ``~/Library/Application Support/tfcluster`` on macOS."""
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "tfcluster"
    base = os.environ.get("XDG_STATE_HOME", "")
    return (Path(base) if os.path.isabs(base) else Path.home() / ".local" / "state") / "tfcluster"


# The environment variables of the settings: INVOKE_TFCLUSTER_WORKERS=4 is workers: 4.
ENV_PREFIX = "INVOKE_TFCLUSTER_"


def take_environment(environ: MutableMapping[str, str]) -> dict[str, str]:
    """Every INVOKE_TFCLUSTER_<KEY> removed from ``environ``, as {key: text} (an unknown key stays in,
    for load to name)."""
    return {name[len(ENV_PREFIX):].lower(): environ.pop(name) for name in list(environ)
            if name.startswith(ENV_PREFIX)}


def flag_hint(key: str) -> str:
    return f"invoke.yaml (tfcluster.{key}), INVOKE_TFCLUSTER_{key.upper()} or --{key.replace('_', '-')}"


def check_kinds(values: Mapping[str, Any], defaults: Mapping[str, Any]) -> None:
    """What no setting takes, whatever its own rule: a list or a mapping (YAML gives them), or true or
    false where the setting is not a yes/no. Text, numbers and yes/no are each checked by their key."""
    for name, default in defaults.items():
        value = values[name]
        if name == "zones":
            fits = isinstance(value, str) or (isinstance(value, (list, tuple)) and all(
                isinstance(zone, str) for zone in value))
        else:
            fits = not isinstance(value, (list, tuple, dict, set)) and (
                not isinstance(value, bool) or isinstance(default, bool))
        if not fits:
            kind = {bool: "true or false", int: "a whole number", float: "a number"}.get(type(default), "text")
            if name == "zones":
                kind = "a list of zones, or zones separated by commas"
            raise ConfigError(f"{name} must be {kind} (got {value!r}); set it in {flag_hint(name)}")


# Flags that only some backends read: given on another, they would be ignored without a word (an
# `up --hosts a,b` that makes a local cluster). `--python` and the idle flags' defaults stay everywhere.
BACKEND_FLAGS = {
    "hosts": ("ssh",), "ssh_user": ("ssh",), "ssh_key": ("ssh",), "known_hosts": ("ssh",),
    "trust_new_hosts": ("ssh",), "tf_port": ("ssh", "gcp"), "oracle_port": ("ssh", "gcp"),
    "idle_minutes": ("ssh", "gcp"), "idle_action": ("ssh", "gcp"),
    **dict.fromkeys(("operator_cidr", "budget", "boot_image", "reservation", "capacity"), ("gcp",)),
    "ssh_identity": ("gcp",),
    **dict.fromkeys(("project", "zone", "gpu", "gpu_count", "machine_type", "spot", "max_run_hours", "provisioning",
                     "capacity_wait"), ("gcp", "vertex")),
    "region": ("vertex",),
}


def check_backend_flags(backend: str, given: Mapping[str, Any]) -> None:
    """One line naming every flag in ``given`` (name -> value; None or False: not given) that
    ``backend`` does not read, and the backend each needs."""
    wrong = [(name, BACKEND_FLAGS[name]) for name, value in given.items()
             if value not in (None, False) and name in BACKEND_FLAGS and backend not in BACKEND_FLAGS[name]]
    if wrong:
        flags = ", ".join(f"--{name.replace('_', '-')}" for name, _ in wrong)
        needs = sorted({" or ".join(f"--backend {b}" for b in backends) for _, backends in wrong})
        raise ConfigError(f"{flags} {'needs' if len(wrong) == 1 else 'need'} {' and '.join(needs)}, and the backend is "
                          f"{backend}; add the backend, or drop {'it' if len(wrong) == 1 else 'them'}")
