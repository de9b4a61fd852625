"""A package only a local index has, for `train --requirements` (tests/test_ssh_backend.py): a pure-Python
wheel written by hand (the wheel format is a zip with a dist-info folder, PEP 427), in a folder pip reads
with --find-links, and the requirements file that asks for it there and nowhere else (--no-index)."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

NAME, VERSION = "tfcluster_probe", "1.0"


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def local_index(folder: Path) -> Path:
    """The folder, holding tfcluster_probe-1.0-py3-none-any.whl."""
    folder.mkdir(parents=True, exist_ok=True)
    info = f"{NAME}-{VERSION}.dist-info"
    files = {
        f"{NAME}/__init__.py": f'VERSION = "{VERSION}"\n'.encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: tfcluster-probe\nVersion: {VERSION}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests.probe_package\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "\n".join([*(_record_line(path, data) for path, data in files.items()), f"{info}/RECORD,,"]) + "\n"
    with zipfile.ZipFile(folder / f"{NAME}-{VERSION}-py3-none-any.whl", "w") as wheel:
        for path, data in files.items():
            wheel.writestr(path, data)
        wheel.writestr(f"{info}/RECORD", record)
    return folder


def requirements_file(path: Path, index: Path, version: str = VERSION) -> Path:
    path.write_text(f"--no-index\n--find-links {index}\ntfcluster-probe=={version}\n")
    return path


# A --script that says which probe it imported: the workers see what --requirements installed.
SCRIPT = "import tfcluster_probe\nprint('probe', tfcluster_probe.VERSION, flush=True)\n"
