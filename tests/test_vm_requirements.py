"""What startup/startup.sh installs on a VM resolves, as wheels only, for the default image's Python.

The default boot image (terraform/variables.tf `image`: common-cu129-ubuntu-2204-...) is Ubuntu
22.04, whose python3 is 3.10 and whose glibc is 2.35; the booted-VM tests run Debian 12 (3.11), and
requirements/vm.lock is resolved for 3.11. A requirement with no 3.10 wheel would fail on the
first real VM, at pip, after minutes of boot: here it fails CI. pip resolves without installing
(`--dry-run --report`, https://pip.pypa.io/en/stable/cli/pip_install/#cmdoption-dry-run), for a
foreign interpreter (`--python-version`, `--platform`, `--implementation`, which need
`--only-binary :all:` and `--target`), from the index this machine's pip is configured with.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# manylinux tags an Ubuntu 22.04 (glibc 2.35) x86_64 machine accepts (PEP 600: manylinux_2_Y for
# every Y up to the system's glibc; manylinux2014 is manylinux_2_17).
PLATFORMS = ["manylinux2014_x86_64", *(f"manylinux_2_{minor}_x86_64" for minor in range(17, 36))]


def startup_requirements(extra: str) -> list[str]:
    """startup.sh's own requirements() list (``extra`` "[and-cuda]" on a GPU VM), read by bash."""
    script = (REPO / "startup" / "startup.sh").read_text()
    version = next(line for line in script.splitlines() if line.startswith("TF_VERSION="))
    body = script[script.index("requirements() {"):]
    body = body[:body.index("\n}\n") + 3]
    out = subprocess.run(["bash", "-c", f'{version}\n{body}\nrequirements "$1"', "bash", extra],
                         capture_output=True, text=True, check=True).stdout
    return out.split()


def resolve(requirements: list[str], python: str, target: Path) -> subprocess.CompletedProcess:
    report = target / "report.json"
    return subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed", "--only-binary", ":all:",
         "--python-version", python, "--implementation", "cp", *(f"--platform={p}" for p in PLATFORMS),
         "--target", str(target / "site"), "--report", str(report), *requirements],
        capture_output=True, text=True, timeout=600, env={"PIP_DISABLE_PIP_VERSION_CHECK": "1",
                                                          **__import__("os").environ, "PIP_CONSTRAINT": ""})


def test_the_vm_requirements_have_wheels_for_the_default_images_python(tmp_path):
    wanted = startup_requirements("[and-cuda]")
    assert wanted[0].startswith("tensorflow[and-cuda]==") and "google-cloud-storage" in wanted
    resolved = resolve(wanted, "3.10", tmp_path)
    assert resolved.returncode == 0, resolved.stderr[-3000:]
    installs = json.loads((tmp_path / "report.json").read_text())["install"]
    wheels = {item["metadata"]["name"].lower(): item["download_info"]["url"].rsplit("/", 1)[1] for item in installs}
    assert "-cp310-" in wheels["tensorflow"] and wheels["tensorflow"].startswith("tensorflow-" + wanted[0].split("==")[1])
    assert all(name.endswith(".whl") for name in wheels.values())


def test_a_requirement_without_a_wheel_for_that_python_is_refused(tmp_path):
    # The check itself: TensorFlow 2.21 has no wheel for Python 3.8, so the same resolution fails.
    resolved = resolve(startup_requirements(""), "3.8", tmp_path)
    assert resolved.returncode != 0 and "tensorflow" in resolved.stderr.lower()
