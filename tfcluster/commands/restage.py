"""A run's machines replaced mid-run: the cluster moved to another zone (backends/gcp/zones/failover.py
move_or_fail) and its VMs are new, with empty disks. Before the same run resumes on them, what
`train` put on the old ones goes on them again: the preflight (with an image, `docker login`), the
code and data (Backend.stage, from the payload kept in the run's launch.json), the stall limit and
`--then` for their watchdogs. Checkpoints, model and TensorBoard are in the bucket: nothing to copy.
"""

from __future__ import annotations

import json
from pathlib import Path

from tfcluster.backends.base import Payload
from tfcluster.errors import ClusterError
from tfcluster.state import ClusterState, RunRecord, StateStore

# The run's file that holds what `train` started it with (written by commands/train.py).
LAUNCH_FILE = "launch.json"


def saved(payload: Payload) -> dict:
    """The payload as launch.json keeps it (paths as text)."""
    def text(path: Path | None) -> str | None:
        return None if path is None else str(path)

    return {"python": payload.python, "script": text(payload.script), "project": text(payload.project),
            "data_dir": text(payload.data_dir), "args": list(payload.args)}


def restage(store: StateStore, backend, cluster: ClusterState, run: RunRecord) -> None:
    """Check and stage the run's new machines as `train` did the old ones."""
    launched = json.loads((store.run_dir(run.run_id) / LAUNCH_FILE).read_text())
    fields = launched.get("payload")
    if fields is None:
        raise ClusterError(f"run {run.run_id} was started by an older tfcluster, which kept no record of its code "
                           "to stage on the moved VMs; start a new run with `invoke train`")

    def path(key: str) -> Path | None:
        return None if fields[key] is None else Path(fields[key])

    payload = Payload(python=fields["python"], script=path("script"), project=path("project"),
                      data_dir=path("data_dir"), args=list(fields["args"]))
    hosts = backend.hosts(cluster)[: run.workers]
    backend.preflight(cluster, hosts, need_tensorflow=launched["env"].get("TF_USE_LEGACY_KERAS") == "1",
                      image=run.image)
    backend.stage(cluster, hosts, run.run_id, payload)
    backend.set_stall_minutes(cluster, launched.get("stall_minutes"))
    if run.summary.get("then") and backend.can_halt_machines:
        backend.arm_then_stop(cluster, run.run_id, last_attempt=run.retries + 1)
