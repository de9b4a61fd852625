"""Code and data bundles: deterministic tars named by content hash, uploaded only where missing."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shlex
import tarfile
import threading
from pathlib import Path

from tfcluster.backends.ssh.host import SshHost
from tfcluster.errors import ClusterError


def deterministic_tar(root: Path, members: list[Path], arcroot: str) -> bytes:
    """A gzip tar whose bytes depend only on the files' paths, contents and exec bits."""
    buffer = io.BytesIO()
    # Level 1: shipping is bound by CPU here, and TFRecords of pixels barely compress anyway.
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0, compresslevel=1) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(members):
                relative = path.relative_to(root).as_posix()
                info = tarfile.TarInfo(f"{arcroot}/{relative}" if arcroot else relative)
                data = path.read_bytes()
                info.size = len(data)
                info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
                info.mtime = 0
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


IGNORE_DEFAULTS = ("__pycache__", "*.pyc", ".git", ".venv", "venv", ".tfcluster", "*.egg-info",
                   ".pytest_cache", ".ipynb_checkpoints")
IGNORE_FILE = ".tfclusterignore"


def collect_files(root: Path) -> list[Path]:
    """Files under ``root``, minus the default ignores and ``root/.tfclusterignore`` patterns."""
    import fnmatch

    patterns = list(IGNORE_DEFAULTS)
    ignore_file = root / IGNORE_FILE
    if ignore_file.exists():
        patterns += [line.strip() for line in ignore_file.read_text().splitlines()
                     if line.strip() and not line.startswith("#")]

    def ignored(relative: str) -> bool:
        parts = relative.split("/")
        return any(fnmatch.fnmatch(part, pattern) for part in parts for pattern in patterns) or any(
            fnmatch.fnmatch(relative, pattern) for pattern in patterns)

    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        dirnames[:] = [d for d in dirnames if not ignored(f"{rel_dir}/{d}".lstrip("./"))]
        for name in filenames:
            relative = f"{rel_dir}/{name}".lstrip("./") if rel_dir != "." else name
            if not ignored(relative):
                files.append(Path(dirpath) / name)
    return files


class Bundle:
    """Files to ship, named by a hash of their paths, contents and exec bits.

    The hash is computed from the files directly, so an unchanged re-dispatch costs a
    read of the files and no archive; the tar is built once, only if a host needs it.
    """

    def __init__(self, kind: str, root: Path, files: list[Path]):
        self.kind = kind
        self.root = root
        self.files = sorted(files)
        digest = hashlib.sha256()
        for path in self.files:
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(b"x" if os.access(path, os.X_OK) else b"-")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
        self.digest = digest.hexdigest()[:20]
        self._payload: bytes | None = None
        self._lock = threading.Lock()

    @property
    def payload(self) -> bytes:
        with self._lock:
            if self._payload is None:
                self._payload = deterministic_tar(self.root, self.files, "")
            return self._payload


def make_bundle(kind: str, root: Path, files: list[Path] | None = None) -> Bundle:
    return Bundle(kind, root, files if files is not None else collect_files(root))


def upload_bundle(host: SshHost, bundle: Bundle) -> tuple[str, bool]:
    """Extract ``bundle`` to <remote_root>/<kind>/<digest> unless it is there already.

    Returns (remote folder, uploaded?). Safe on shared filesystems: each worker extracts
    into its own temp folder and renames it into place; a loser of the race removes its copy.
    """
    target = f"{host.record.remote_root}/{bundle.kind}/{bundle.digest}"
    code, _ = host.connection.shell(shlex.join(["test", "-f", f"{target}/.complete"]))
    if code == 0:
        return target, False
    tmp = f"{target}.tmp-{host.record.name}-{os.getpid()}"
    host.write_file(f"{tmp}.tar.gz", bundle.payload, 0o600)
    q = shlex.quote
    command = (f"rm -rf {q(tmp)} && mkdir -p {q(tmp)} && tar -xzf {q(tmp + '.tar.gz')} -C {q(tmp)} && "
               f"touch {q(tmp + '/.complete')} && rm -f {q(tmp + '.tar.gz')} && "
               f"{{ mv -T {q(tmp)} {q(target)} 2>/dev/null || rm -rf {q(tmp)}; }}")
    code, out = host.connection.shell(command, timeout=120)
    if code != 0:
        raise ClusterError(f"{host.record.name}: unpacking the {bundle.kind} bundle failed: {out.strip()}")
    return target, True
