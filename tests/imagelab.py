"""Real Docker for the --image tests: the daemon, and test images built locally (no registry).

No image registry is reachable here, so the images are built from scratch (shared/notes/
vm-in-a-container.md). Their base is the booted-VM tests' debootstrapped Debian 12 (python3,
systemd, curl; .ci/vm-cache.sh builds it once, so a cold run debootstraps once): imported as
it is, it is the "no TensorFlow" image; the same root filesystem plus the hash-pinned
tensorflow-cpu, tf-keras, tensorboard, numpy and pillow (installed from this side with
`pip --target`, so the image needs no pip) is the training image. Its root filesystem is cached
as a tar under $TFCLUSTER_CI_CACHE/image, keyed by the recipe, so a CI run only re-imports it.

`python -m tests.imagelab` builds (or imports) both images and prints the timings.
"""

from __future__ import annotations

import fcntl
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
# Hash-pinned (requirements/image.lock, from image.in; .ci/lock.sh regenerates it): the versions
# the launcher's own environment runs. The bundled trainer writes TensorBoard summaries, and
# tensorflow-cpu 2.21 no longer pulls tensorboard in.
LOCK = Path(__file__).resolve().parent.parent / "requirements" / "image.lock"
WHEELS = LOCK.read_text()
# What the workers never load, removed from the image (about half its size): TensorFlow's C++
# headers and the test folders packages ship.
SLIM = ["tensorflow/include", "*/tests"]
PYTHON_ABI = "3.11"  # Debian 12's python3.
SITE = "usr/local/lib/python3.11/dist-packages"  # On Debian's python3 sys.path.

def _key(*parts) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:12]


def tags(rootfs_key: str) -> tuple[str, str]:
    """(training image, Python-only image) for the base root filesystem with this key."""
    # Bytecode is compiled at build time (pip's default): workers run as the login's uid and cannot
    # write __pycache__ into the image, and compiling TensorFlow at every import costs ~30 s.
    recipe = _key(rootfs_key, WHEELS, SITE, "compiled", SLIM)
    return f"tfcluster-test/tf:{recipe}", f"tfcluster-test/python-only:{rootfs_key}"


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


def build(log=print) -> tuple[tuple[str, str], dict[str, float]]:
    """Both images present in the daemon: ((training tag, Python-only tag), seconds per step taken,
    empty when warm). One builder at a time per cache: two suites on one machine share it."""
    from tests.vmlab import ensure_cache  # The base root filesystem (and its own lock).

    base = ensure_cache()
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build(Path(base["ROOTFS_TAR"]), base["ROOTFS_KEY"], log)


def _build(base_tar: Path, rootfs_key: str, log) -> tuple[tuple[str, str], dict[str, float]]:
    timings: dict[str, float] = {}
    tf_image, python_image = tags(rootfs_key)
    tf_tar = CACHE / f"tf-{tf_image.rsplit(':', 1)[1]}.tar"
    if image_present(tf_image) and image_present(python_image):
        return (tf_image, python_image), timings
    if not tf_tar.exists():
        with tempfile.TemporaryDirectory(dir=CACHE) as work:
            root = Path(work) / "root"
            started = time.monotonic()
            root.mkdir()
            sh("tar", "--numeric-owner", "-C", str(root), "-xf", str(base_tar))
            timings["base rootfs"] = time.monotonic() - started
            started = time.monotonic()
            log(f"pip install -r {LOCK.name} ...")
            env = {**os.environ, "PIP_CACHE_DIR": str(CACHE / "pip"), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
            sh(sys.executable, "-m", "pip", "install", "-q", "--target", str(root / SITE), "--require-hashes",
               "--python-version", PYTHON_ABI, "--only-binary=:all:", "-r", str(LOCK), env=env)
            site = root / SITE
            for pattern in SLIM:
                for path in site.glob(pattern):
                    shutil.rmtree(path)
            timings["pip install"] = time.monotonic() - started
            started = time.monotonic()
            _tar(root, tf_tar)
            timings["tar tf"] = time.monotonic() - started
    started = time.monotonic()
    for tar, tag in ((base_tar, python_image), (tf_tar, tf_image)):
        if not image_present(tag):
            _import(tar, tag)
    timings["docker import"] = time.monotonic() - started
    return (tf_image, python_image), timings


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
    images, steps = build()
    total = time.monotonic() - started
    print(json.dumps({"images": list(images), "seconds_total": round(total, 1),
                      "steps": {k: round(v, 1) for k, v in steps.items()}}))
