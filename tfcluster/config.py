"""The one typed configuration object, read through invoke's config system.

Precedence (lowest first): the defaults below, the project's ``invoke.yaml``
(key ``tfcluster``), ``INVOKE_TFCLUSTER_*`` environment variables, then flags.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

from tfcluster.errors import ConfigError

BACKENDS = ("local", "ssh")
CLUSTER_NAME = re.compile(r"^[a-z][a-z0-9-]{0,30}$")


@dataclass(frozen=True)
class Settings:
    # Cluster name; its state lives in <state_dir>/clusters/<cluster>.json.
    cluster: str = "default"
    # Where machines come from: "local" runs worker processes on this machine.
    backend: str = "local"
    # Workers `up` creates; `train --workers` may use fewer.
    workers: int = 3
    # Local folder for cluster state, run records, logs and fetched results.
    state_dir: str = ".tfcluster"
    # Interpreter that runs the workers; empty means the one running invoke.
    python: str = ""
    # TFRecord folder for the bundled trainer; empty means the built-in synthetic set.
    data_dir: str = ""
    # Restarts after a failed attempt; each resumes from the last checkpoint.
    retries: int = 0
    # Seconds a stopping worker gets between SIGTERM and SIGKILL.
    stop_grace_seconds: float = 5.0
    # ssh backend: comma-separated host or host:sshport, one worker per entry.
    hosts: str = ""
    # ssh backend: login user and private key file.
    ssh_user: str = "root"
    ssh_key: str = "~/.ssh/id_ed25519"
    # ssh backend: known_hosts file that vouches for the hosts' keys at `up`.
    known_hosts: str = "~/.ssh/known_hosts"
    # ssh backend: pin keys of hosts missing from known_hosts (fingerprints are printed).
    trust_new_hosts: bool = False
    # ssh backend: TensorFlow gRPC port on every host.
    tf_port: int = 23456
    # ssh backend: folder (relative to the login's home, or absolute) for runs, code and data.
    remote_dir: str = ".tfcluster-remote"

    @property
    def state_path(self) -> Path:
        return Path(self.state_dir).expanduser().resolve()


DEFAULTS: dict[str, Any] = dataclasses.asdict(Settings())


def _flag_hint(key: str) -> str:
    return f"invoke.yaml (tfcluster.{key}), INVOKE_TFCLUSTER_{key.upper()} or --{key.replace('_', '-')}"


def parse_int(key: str, value: Any, minimum: int) -> int:
    """An int >= minimum from a flag, YAML or env value, or a ConfigError naming the key."""
    if isinstance(value, bool):
        raise ConfigError(f"{key} must be a whole number >= {minimum} (got {value!r}); "
                          f"set it in {_flag_hint(key)}")
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ConfigError(f"{key} must be a whole number >= {minimum} (got {value!r}); "
                          f"set it in {_flag_hint(key)}") from None
    if number < minimum:
        raise ConfigError(f"{key} must be >= {minimum} (got {number}); set it in {_flag_hint(key)}")
    return number


def load(config: Mapping[str, Any] | None = None, **overrides: Any) -> Settings:
    """Settings from invoke's merged ``tfcluster`` config plus flag overrides (None = unset)."""
    known = {f.name for f in fields(Settings)}
    merged = dict(DEFAULTS)
    for key, value in dict(config or {}).items():
        if key not in known:
            raise ConfigError(f"unknown setting tfcluster.{key}; valid keys: {', '.join(sorted(known))}")
        merged[key] = value
    merged.update({key: value for key, value in overrides.items() if value is not None})
    return validate(merged)


def validate(values: Mapping[str, Any]) -> Settings:
    backend = str(values["backend"]).strip().lower()
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {', '.join(BACKENDS)} (got {values['backend']!r})")
    cluster = str(values["cluster"])
    if not CLUSTER_NAME.match(cluster):
        raise ConfigError(f"cluster must be lowercase letters, digits and dashes, starting with a "
                          f"letter, at most 31 characters (got {cluster!r})")
    try:
        grace = float(values["stop_grace_seconds"])
    except (TypeError, ValueError):
        grace = -1.0
    if not 0 < grace <= 300:
        raise ConfigError(f"stop_grace_seconds must be a number in (0, 300] (got {values['stop_grace_seconds']!r})")
    tf_port = parse_int("tf_port", values["tf_port"], 1)
    if tf_port > 65535:
        raise ConfigError(f"tf_port must be between 1 and 65535 (got {tf_port})")
    trust = values["trust_new_hosts"]
    if isinstance(trust, str):
        if trust.strip().lower() not in ("true", "false", "1", "0", "yes", "no", ""):
            raise ConfigError(f"trust_new_hosts must be true or false (got {trust!r})")
        trust = trust.strip().lower() in ("true", "1", "yes")
    return Settings(
        hosts=str(values["hosts"] or ""),
        ssh_user=str(values["ssh_user"] or ""),
        ssh_key=str(values["ssh_key"] or ""),
        known_hosts=str(values["known_hosts"] or ""),
        trust_new_hosts=bool(trust),
        tf_port=tf_port,
        remote_dir=str(values["remote_dir"] or ".tfcluster-remote"),
        cluster=cluster,
        backend=backend,
        workers=parse_int("workers", values["workers"], 1),
        state_dir=str(values["state_dir"]),
        python=str(values["python"] or ""),
        data_dir=str(values["data_dir"] or ""),
        retries=parse_int("retries", values["retries"], 0),
        stop_grace_seconds=grace,
    )
