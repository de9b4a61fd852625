"""Backends: where worker machines come from and how the launcher reaches them.

Rooms: base (the written interface: WorkerHost, Backend with its optional capabilities),
group (per-host parallel actions, one error naming every failure), local, ssh/, gcp/, vertex/.
Backends may import state, config, errors and tfconfig; never commands or launch.

A backend provisions (``up``/``down``), checks hosts (``preflight``), ships code and data
(``stage``) and hands out one ``WorkerHost`` per worker slot. Everything else (TF_CONFIG,
launch scripts, log following, fail-fast, retries) is shared code in tfcluster.launch
that only talks to ``WorkerHost``.
"""

from __future__ import annotations

from tfcluster.backends.base import Backend, Payload, Staged, VmRow, WorkerHost
from tfcluster.config import BACKENDS
from tfcluster.errors import ConfigError


def get_backend(name: str, store, announce=print) -> Backend:
    if name == "local":
        from tfcluster.backends.local import LocalBackend

        return LocalBackend(store)
    if name == "ssh":
        from tfcluster.backends.ssh import SshBackend

        return SshBackend(store, announce)
    if name == "gcp":
        from tfcluster.backends.gcp import GcpBackend

        return GcpBackend(store, announce)
    if name == "vertex":
        from tfcluster.backends.vertex import VertexBackend

        return VertexBackend(store, announce)
    raise ConfigError(f"backend must be one of {', '.join(BACKENDS)} (got {name!r})")


__all__ = ["Backend", "Payload", "Staged", "VmRow", "WorkerHost", "get_backend"]
