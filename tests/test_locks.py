"""The hash-pinned locks in requirements/ (.ci/lock.sh writes them) follow their sources.

pyproject.toml keeps ranges for users; CI installs only the locks, so a fresh machine resolves
exactly what the last green run did. These checks catch a lock that drifted from what it pins:
a range changed in pyproject.toml, or the boot script's package list changed, without
re-running .ci/lock.sh.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent
LOCKS = REPO / "requirements"


def pins(lock: Path) -> dict[str, str]:
    """name -> version of every `name==version` line, after checking each carries a hash."""
    text = lock.read_text()
    found = {}
    for block in re.split(r"\n(?=[a-z0-9])", text):
        match = re.match(r"([A-Za-z0-9_.-]+)==([^\s\\]+)", block)
        if match:
            assert "--hash=sha256:" in block, f"{lock.name}: {match[1]} has no hash"
            found[match[1].lower().replace("_", "-")] = match[2]
    return found


def satisfied(requirement: str, pinned: dict[str, str]) -> bool:
    parsed = Requirement(requirement)
    version = pinned.get(parsed.name.lower().replace("_", "-"))
    return version is not None and parsed.specifier.contains(version, prereleases=True)


def test_the_test_lock_satisfies_every_range_in_pyproject():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pinned = pins(LOCKS / "test.lock")
    extras = project["optional-dependencies"]
    wanted = [*project["dependencies"], *extras["test"], *extras["gcp"],
              *(LOCKS / "build.in").read_text().split()]
    assert [r for r in wanted if not satisfied(r, pinned)] == []


def test_the_vm_lock_is_the_boot_scripts_own_list():
    listed = subprocess.run(
        ["bash", "-c", "source <(sed -n -e '/^TF_VERSION=/p' -e '/^requirements() {/,/^}/p' startup/startup.sh);"
                       " requirements ''"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    assert (LOCKS / "vm.in").read_text().split() == [*listed, "pip"], "run bash .ci/lock.sh"
    pinned = pins(LOCKS / "vm.lock")
    assert [r for r in [*listed, "pip"] if not satisfied(r, pinned)] == []


def test_every_lock_pins_with_hashes_and_the_image_runs_the_launchers_tensorflow():
    for name in ("test.lock", "checkov.lock", "vm.lock", "image.lock", "provider.lock", "docs.lock"):
        assert pins(LOCKS / name), f"{name} pins nothing"
    assert pins(LOCKS / "image.lock")["tensorflow-cpu"] == pins(LOCKS / "test.lock")["tensorflow"]
