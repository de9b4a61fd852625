"""What a killed terraform leaves in a cluster's folder, mended before the next terraform runs there.

tfcluster keeps terraform's state locally, one folder a cluster (<state_dir>/gcp/<cluster>/). Terraform's
local state manager (internal/states/statemgr/filesystem.go) locks terraform.tfstate with an flock the
kernel drops with a killed process, leaving only `.terraform.tfstate.lock.info` behind; it copies the
previous state to terraform.tfstate.backup once, then truncates terraform.tfstate and writes it in
place, so a kill mid-write leaves it cut short. Before the next `up` or `down` runs terraform (never
while another terraform of the cluster still runs):
- the stale lock info goes;
- a state that does not parse is set aside (terraform.tfstate.cut) and the backup takes its place.
Each says so in one line. What a killed apply made in the project but never recorded is the
leftovers room's (tfcluster/backends/gcp/leftovers/unrecorded.py), which reads the names kept here.
"""


from __future__ import annotations

import json
from pathlib import Path

from tfcluster.errors import ClusterError

LOCK_INFO = ".terraform.tfstate.lock.info"
STATE, BACKUP = "terraform.tfstate", "terraform.tfstate.backup"
# The attributes by which a state names the project's objects (hashicorp/google resource schemas).
NAMING_ATTRIBUTES = ("name", "email", "role_id", "id", "self_link")


def terraform_running(workdir: Path) -> list[int]:
    """Pids of terraform processes (or their providers, started in the folder) working on ``workdir``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"-chdir={workdir}".encode() in argv:
            found.append(int(proc.name))
    return found


def mend_folder(workdir: Path, cluster: str) -> list[str]:
    """Mend what a killed terraform left in ``workdir``; one line for each thing mended. A terraform of
    the cluster that still runs is an error naming it: its work is its own to finish."""
    running = terraform_running(workdir)
    if running:
        raise ClusterError(f"terraform (pid {', '.join(map(str, running))}) still works on cluster '{cluster}'; wait for "
                           f"it to end, or end it (kill {' '.join(map(str, running))}), then run this again")
    lines = []
    info = workdir / LOCK_INFO
    if info.exists():
        info.unlink()
        lines.append(f"removed the lock info a killed terraform left ({info.name}); no terraform of '{cluster}' runs")
    state, backup = workdir / STATE, workdir / BACKUP
    if state.exists() and _cut(state):
        cut = workdir / f"{STATE}.cut"
        state.replace(cut)
        if backup.exists() and not _cut(backup):
            backup.replace(state)
            lines.append(f"terraform's state was cut short by a kill (kept as {cut.name}); took the one before it, "
                         f"{BACKUP}; resources made since are found by the cluster's labels")
        else:
            lines.append(f"terraform's state was cut short by a kill (kept as {cut.name}) and has no backup; the "
                         "cluster's resources are found by its labels")
    return lines


def _cut(path: Path) -> bool:
    """Whether a state file is not a whole state (terraform writes a JSON object with a `version`)."""
    try:
        return "version" not in json.loads(path.read_text() or "null")
    except (ValueError, TypeError):
        return True


def state_names(workdir: Path) -> set[str]:
    """Every name, email and id the state records (empty when there is no state)."""
    try:
        state = json.loads((workdir / STATE).read_text())
    except (OSError, ValueError):
        return set()
    names = set()
    for resource in state.get("resources", []):
        for instance in resource.get("instances", []):
            attributes = instance.get("attributes") or {}
            names.update(str(attributes[key]) for key in NAMING_ATTRIBUTES if attributes.get(key))
    return names
