"""Real Docker for the --image tests: the daemon, and test images built locally (no registry).

No image registry is reachable here, so the images are built from scratch (shared/notes/
vm-in-a-container.md): a debootstrapped Debian 12 minbase with python3 is imported as the
"no TensorFlow" image; the same root filesystem plus tensorflow-cpu, tf-keras, numpy and
pillow (wheels from the package index, installed from this side with `pip --target`, so the
image needs no pip) is the training image. Both root filesystems are cached as tar files
under $TFCLUSTER_CI_CACHE/image, keyed by the recipe, so a CI run only re-imports them.

`python -m tests.imagelab` builds (or imports) both images and prints the timings.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CACHE = Path(os.environ.get("TFCLUSTER_CI_CACHE", "/var/cache/tfcluster-ci")) / "image"
DATA_ROOT = "/var/lib/tfcluster-docker"
PIDFILE = "/var/run/tfcluster-dockerd.pid"
MIRROR = "http://deb.debian.org/debian"
DEBS = ["python3"]
# Pinned to what the launcher's own environment runs (pyproject.toml); the bundled trainer
# writes TensorBoard summaries, and tensorflow-cpu 2.21 no longer pulls tensorboard in.
WHEELS = ["tensorflow-cpu==2.21.0", "tf-keras==2.21.0", "tensorboard==2.21.0", "numpy==2.4.6", "pillow==13.0.0"]
PYTHON_ABI = "3.11"  # Debian 12's python3.
SITE = "usr/local/lib/python3.11/dist-packages"  # On Debian's python3 sys.path.

def _key(*parts) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:12]


# Bytecode is compiled at build time (pip's default): workers run as the login's uid and cannot
# write __pycache__ into the image, and compiling TensorFlow at every import costs ~30 s.
BASE_RECIPE = _key(DEBS, MIRROR)
RECIPE = _key(BASE_RECIPE, WHEELS, SITE, "compiled")
TF_IMAGE = f"tfcluster-test/tf:{RECIPE}"
PYTHON_IMAGE = f"tfcluster-test/python-only:{BASE_RECIPE}"


def sh(*argv: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), check=check, capture_output=True, text=True, **kwargs)


def docker_ready() -> bool:
    return shutil.which("docker") is not None and sh("docker", "info", check=False).returncode == 0


def ensure_dockerd(timeout: float = 60) -> str | None:
    """Use the running daemon, or start one (left running for the other suites). None when
    Docker is usable, else the reason the tests skip."""
    if docker_ready():
        return None
    if os.geteuid() != 0 or shutil.which("dockerd") is None:
        return "no Docker daemon and cannot start one (needs root and Debian's docker.io)"
    Path(DATA_ROOT).mkdir(parents=True, exist_ok=True)
    # --iptables=false: otherwise FORWARD turns DROP and breaks the network-namespace test hosts.
    subprocess.Popen(["dockerd", "--iptables=false", "--data-root", DATA_ROOT, "--pidfile", PIDFILE],
                     stdout=open("/var/log/tfcluster-dockerd.log", "ab"), stderr=subprocess.STDOUT,
                     stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if docker_ready():
            return None
        time.sleep(0.2)
    return "dockerd did not answer within 60 s (see /var/log/tfcluster-dockerd.log)"


def image_present(tag: str) -> bool:
    return sh("docker", "image", "inspect", tag, check=False).returncode == 0


def _import(tar: Path, tag: str) -> None:
    sh("docker", "import", "--change", "ENV LANG=C.UTF-8", str(tar), tag)


def _tar(root: Path, out: Path) -> None:
    tmp = out.with_suffix(".tmp")
    sh("tar", "--numeric-owner", "-C", str(root), "-cf", str(tmp), ".")
    os.replace(tmp, out)


def build(log=print) -> dict[str, float]:
    """Both images present in the daemon; returns seconds per step taken (empty when warm)."""
    timings: dict[str, float] = {}
    base_tar, tf_tar = CACHE / f"base-{BASE_RECIPE}.tar", CACHE / f"tf-{RECIPE}.tar"
    if image_present(TF_IMAGE) and image_present(PYTHON_IMAGE):
        return timings
    CACHE.mkdir(parents=True, exist_ok=True)
    if not (base_tar.exists() and tf_tar.exists()):
        with tempfile.TemporaryDirectory(dir=CACHE) as work:
            root = Path(work) / "root"
            started = time.monotonic()
            if base_tar.exists():
                root.mkdir()
                sh("tar", "--numeric-owner", "-C", str(root), "-xf", str(base_tar))
            else:
                log(f"debootstrap bookworm minbase + {DEBS} ...")
                sh("debootstrap", "--variant=minbase", f"--include={','.join(DEBS)}", "bookworm", str(root), MIRROR)
                sh("rm", "-rf", str(root / "var/cache/apt/archives"), str(root / "var/lib/apt/lists"))
                (root / "var/cache/apt/archives/partial").mkdir(parents=True)
                _tar(root, base_tar)
            timings["base rootfs"] = time.monotonic() - started
            started = time.monotonic()
            log(f"pip install {WHEELS} ...")
            env = {**os.environ, "PIP_CACHE_DIR": str(CACHE / "pip"), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
            sh(sys.executable, "-m", "pip", "install", "-q", "--target", str(root / SITE),
               "--python-version", PYTHON_ABI, "--only-binary=:all:", *WHEELS, env=env)
            timings["pip install"] = time.monotonic() - started
            started = time.monotonic()
            _tar(root, tf_tar)
            timings["tar tf"] = time.monotonic() - started
    started = time.monotonic()
    for tar, tag in ((base_tar, PYTHON_IMAGE), (tf_tar, TF_IMAGE)):
        if not image_present(tag):
            _import(tar, tag)
    timings["docker import"] = time.monotonic() - started
    return timings


def remove_containers(label: str) -> None:
    """Test hygiene: remove every container carrying ``label`` (key=value)."""
    ids = sh("docker", "ps", "-aq", "--filter", f"label={label}", check=False).stdout.split()
    if ids:
        sh("docker", "rm", "-f", *ids, check=False)


if __name__ == "__main__":
    reason = ensure_dockerd()
    if reason:
        sys.exit(reason)
    started = time.monotonic()
    steps = build()
    total = time.monotonic() - started
    print(json.dumps({"images": [TF_IMAGE, PYTHON_IMAGE], "seconds_total": round(total, 1),
                      "steps": {k: round(v, 1) for k, v in steps.items()}}))
