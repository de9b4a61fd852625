"""terraform/ planned by the real terraform binary with the provider stand-ins, read as JSON.

For tests that need what terraform itself makes of the module (planned values, the metadata a
VM gets) without applying it: `init`, `plan -out`, `show -json` (developer.hashicorp.com/terraform/
internals/json-format: planned_values, resource_changes with after_unknown).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from tests.world.provider import mirror

MODULE = Path(__file__).resolve().parents[3] / "terraform"


def terraform(env: dict, workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([mirror.TERRAFORM, f"-chdir={workdir}", *args, "-no-color"], env=env,
                          capture_output=True, text=True, timeout=300)


def plan(env: dict, workdir: Path, variables: dict, module: Path = MODULE) -> dict:
    """`terraform show -json` of a plan of a copy of ``module`` at ``workdir`` with ``variables``."""
    shutil.copytree(module, workdir)
    (workdir / "terraform.tfvars.json").write_text(json.dumps(variables))
    init = terraform(env, workdir, "init", "-input=false")
    assert init.returncode == 0, init.stdout + init.stderr
    planned = terraform(env, workdir, "plan", "-input=false", "-refresh=false", "-out=plan.bin")
    assert planned.returncode == 0, planned.stdout + planned.stderr
    shown = terraform(env, workdir, "show", "-json", "plan.bin")
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)


def planned_values(shown: dict, address: str) -> dict:
    """The planned values of one resource instance (e.g. "google_compute_instance.worker[0]")."""
    [found] = [r for r in shown["planned_values"]["root_module"]["resources"] if r["address"] == address]
    return found["values"]


def after_unknown(shown: dict, address: str) -> dict:
    """Which of its values terraform knows only after apply (true leaves), as `show -json` marks them."""
    [change] = [r for r in shown["resource_changes"] if r["address"] == address]
    return change["change"]["after_unknown"]
