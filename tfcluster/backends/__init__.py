"""Backends: where worker machines come from and how the launcher reaches them.

A backend provisions (``up``/``down``) and hands out one ``WorkerHost`` per worker
slot. Everything else (TF_CONFIG, launch scripts, log following, fail-fast, retries)
is shared code in tfcluster.launch that only talks to ``WorkerHost``.
"""

from __future__ import annotations

from tfcluster.backends.base import Backend, WorkerHost
from tfcluster.errors import ConfigError


def get_backend(name: str) -> Backend:
    if name == "local":
        from tfcluster.backends.local import LocalBackend

        return LocalBackend()
    raise ConfigError(f"backend must be one of local (got {name!r})")


__all__ = ["Backend", "WorkerHost", "get_backend"]
