"""`train --requirements FILE`: a script's own dependencies, installed on every host before the run
into the interpreter the workers run (SkyPilot's `setup:`), without building an image.

Content-hashed and cached: each host keeps a marker named by the file's SHA-256, the interpreter and
the host, under its own tfcluster folder (`<remote root>/requirements/`; local: the state folder's),
so an unchanged file installs nothing and says so. A changed file installs again: pip installs what
is missing or differs, and leaves the rest. The hosts install side by side; a failure names every
host that failed with pip's last line (where pip puts its reason). Local workers share one
interpreter: it installs once. An image carries its own packages (refused with --image), and
Vertex AI's job installs it in its bootstrap, at each replica's start (backends/vertex/jobspec.py).

May import: tfcluster.errors and the backends' host interface (base).
"""

from __future__ import annotations

import hashlib
import posixpath
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tfcluster.backends.base import WorkerHost
from tfcluster.errors import ClusterError, ConfigError

# pip may build wheels and download for a while; a host that takes longer is named as failed.
INSTALL_SECONDS = 1800.0


@dataclass(frozen=True)
class Requirements:
    """The file the user gave, read once."""

    # The path as given (for messages) and its bytes.
    given: str
    content: bytes

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.content).hexdigest()[:16]


def read(given: str | None, in_job: bool, image: str) -> Requirements | None:
    """The --requirements file, or None without one; ConfigError for what cannot take it. ``in_job``: the
    backend's job installs it in the image it runs (Vertex AI's bootstrap), so an image is no refusal."""
    if not given:
        return None
    if image and not in_job:
        raise ConfigError("--requirements installs into the hosts' own Python, and the workers run in image "
                          f"{image}: add the packages to its Dockerfile (`invoke image build`), or drop --image")
    path = Path(given).expanduser()
    if not path.is_file():
        raise ConfigError(f"--requirements {given} does not exist or is not a file; give a pip requirements file")
    return Requirements(given, path.read_bytes())


def saved(requirements: Requirements | None) -> dict | None:
    """As launch.json keeps it, so that `train --resume` installs it on VMs made anew (a zone move)."""
    return None if requirements is None else {"given": requirements.given,
                                              "content": requirements.content.decode(errors="replace")}


def from_saved(fields: dict | None) -> Requirements | None:
    return None if not fields else Requirements(fields["given"], fields["content"].encode())


def install(requirements: Requirements, hosts: list[WorkerHost], python: str, local_root: str,
            shared_interpreter: bool) -> list[str]:
    """Install on every host (one for ``shared_interpreter``, the local backend); one line per host
    ("worker-0: installed" or "unchanged"). ClusterError naming each failed host."""
    targets = hosts[:1] if shared_interpreter else hosts
    with ThreadPoolExecutor(max_workers=max(1, len(targets))) as pool:
        outcomes = list(pool.map(lambda host: _on_host(requirements, host, python, local_root), targets))
    failed = [f"{host.record.name} ({host.record.address}): {reason}" for host, (ok, reason) in zip(targets, outcomes)
              if not ok]
    if failed:
        raise ClusterError(f"pip could not install --requirements {requirements.given} on {len(failed)} host(s): "
                           f"{'; '.join(failed)}; fix the file (or the host), then run train again")
    names = "all workers (one interpreter)" if shared_interpreter else None
    return [f"{names or host.record.name}: {reason}" for host, (_, reason) in zip(targets, outcomes)]


def _on_host(requirements: Requirements, host: WorkerHost, python: str, local_root: str) -> tuple[bool, str]:
    folder = posixpath.join(host.record.remote_root or local_root, "requirements")
    interpreter = hashlib.sha256(python.encode()).hexdigest()[:8]
    marker = posixpath.join(folder, f"{requirements.digest}-{interpreter}-{host.record.name}.installed")
    if host.read_file(marker) is not None:
        return True, f"unchanged (sha256 {requirements.digest}), nothing installed"
    copy = posixpath.join(folder, f"{requirements.digest}.txt")
    host.write_file(copy, requirements.content)
    # Hosts that share a filesystem may share the interpreter too: one pip at a time in it (flock, where
    # the host has it; util-linux's, on every Debian and Deep Learning VM image).
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "--quiet", "-r", copy]
    lock = posixpath.join(folder, ".pip.lock")
    result = host.run_command(["sh", "-c", 'if command -v flock >/dev/null; then exec flock "$0" "$@"; fi; '
                               'exec "$@"', lock, *pip], timeout=INSTALL_SECONDS)
    if result.code != 0:
        return False, result.last_line
    host.write_file(marker, f"{python}\n".encode())
    return True, f"installed (sha256 {requirements.digest})"
