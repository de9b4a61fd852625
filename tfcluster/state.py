"""On-disk records: the cluster (removed by `down`) and its runs (kept, with their results).

    <state_dir>/clusters/<cluster>.json        ClusterState
    <state_dir>/runs/<cluster>/<run_id>/       run.json, worker scripts, logs, pid/exit files
    <state_dir>/runs/<cluster>/<run_id>/output model, checkpoints, tensorboard (chief's)
    <state_dir>/runs/<cluster>/<run_id>/stop.json, launcher.lock, <state_dir>/locks/  tfcluster/holds.py
    <state_dir>/data/synthetic/                the built-in demo TFRecords, made once
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfcluster.config import Settings
from tfcluster.errors import ConfigError


@dataclass
class HostRecord:
    # Display name used in logs and errors, e.g. "worker-0".
    name: str
    # Address the other workers use to reach this worker's TensorFlow server.
    address: str
    # TCP port of this worker's TensorFlow gRPC server.
    tf_port: int
    # sshd port (ssh/gcp backends).
    ssh_port: int = 22
    # Pinned host key, "type base64" (ssh/gcp backends); the only key accepted later.
    host_key: str = ""
    # Absolute folder on the host under which tfcluster writes everything it creates.
    remote_root: str = ""
    # Address the laptop uses for SSH when it differs from ``address`` (gcp: the external IP).
    ssh_address: str = ""
    # Compute Engine instance name (gcp).
    instance: str = ""

    @property
    def endpoint(self) -> str:
        return f"{self.address}:{self.tf_port}"


@dataclass
class ClusterState:
    # Cluster name (Settings.cluster).
    name: str
    # Backend that created it; later commands use the same one.
    backend: str
    # One record per worker slot, in TF_CONFIG order (index 0 is the chief).
    hosts: list[HostRecord]
    # Unix time `up` created it.
    created_at: float = field(default_factory=time.time)
    # Random id put into every worker's environment, to find stray processes.
    cluster_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # SSH login and private key (ssh/gcp backends).
    ssh_user: str = ""
    ssh_key: str = ""
    # Interpreter that runs the workers on the hosts.
    python: str = ""
    # "up", or "provisioning" while (or after a failed) `up` creates cloud resources:
    # then `up` resumes and `down` destroys what exists.
    status: str = "up"
    # gcp: project, zone and the cluster bucket.
    project: str = ""
    zone: str = ""
    bucket: str = ""
    # gcp: TFRecords uploaded by `invoke data` (gs://...), the default data of `train`.
    data_url: str = ""
    # Image `up --image` pre-pulled on every host; the default of `train --image`.
    image: str = ""
    # gcp: the cluster's Artifact Registry path (LOCATION-docker.pkg.dev/PROJECT/REPO).
    registry: str = ""
    # While `up` waits for capacity (status "provisioning"): {"what", "since", "until", "pid", "host"}
    # (tfcluster/backends/gcp/zones/capacity.py); `status` shows it, `down` ends that `up` first.
    waiting: dict = field(default_factory=dict)
    # gcp: when the cluster's VMs were last made anew (a zone move, --capacity auto bringing preempted
    # Spot VMs back by another model); 0 before. A run resuming on new VMs stages its code again.
    vms_made_at: float = 0.0

    @property
    def workers(self) -> int:
        return len(self.hosts)


@dataclass
class RunRecord:
    # Unique run name: <cluster>-<UTC time>-<random>.
    run_id: str
    # Cluster the run belongs to.
    cluster: str
    # Workers in the run (<= the cluster's).
    workers: int
    # argv every worker runs, before per-worker environment (e.g. python -m trainer.task ...).
    command: list[str]
    # Restarts allowed after a failed attempt.
    retries: int
    # Unix time the launcher started the first attempt.
    started_at: float = field(default_factory=time.time)
    # Attempts started so far (1 = no retry yet).
    attempts: int = 0
    # Final state written by the launcher: "succeeded", "failed" or "stopped"; None while it runs
    # (or if the launcher died, in which case the workers' exit files tell).
    outcome: str | None = None
    # Unix time the outcome was written.
    ended_at: float | None = None
    # Summary the launcher gathered from the workers' events.
    summary: dict[str, Any] = field(default_factory=dict)
    # "train" or "tune" (a hyperparameter search: an oracle beside the chief, one tuner per worker).
    kind: str = "train"
    # tune: the oracle's TCP port on the chief's machine.
    oracle_port: int = 0
    # Per process name, its current attempt where it differs from ``attempts`` (tune restarts
    # a dead tuner alone).
    attempt_of: dict[str, int] = field(default_factory=dict)
    # Container image the workers run in ("" = none), and host folders mounted into it.
    image: str = ""
    mounts: list[str] = field(default_factory=list)


def write_json(path: Path, payload: Any) -> None:
    """Atomic write: readers never see half a file, and a process killed at any moment (or a machine
    that loses power) leaves either the old file or the new one, whole. Written to a hidden temporary
    file beside it, flushed to the disk (fsync), renamed over it (rename is atomic within a folder,
    POSIX rename(2)), and the folder flushed too, so that the rename itself survives a power cut.
    A kill before the rename leaves only the hidden ``.<name>.*.tmp``, which no reader looks at."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, prefix=f".{path.name}.",
                                     suffix=".tmp") as tmp:
        try:
            json.dump(payload, tmp, indent=2, sort_keys=True)
            tmp.flush()
            os.fsync(tmp.fileno())
        except BaseException:
            os.unlink(tmp.name)
            raise
    os.replace(tmp.name, path)
    _fsync_folder(path.parent)


def _fsync_folder(folder: Path) -> None:
    """Flush a folder's entries (a rename into it) to the disk."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class StateStore:
    """Paths and records under the state directory for one cluster name."""

    def __init__(self, settings: Settings, cluster: str | None = None):
        """The records of ``cluster`` (default: the settings' cluster) under the settings' state folder."""
        self.root = settings.state_path
        self.cluster_name = cluster or settings.cluster

    @staticmethod
    def cluster_names(root: Path) -> list[str]:
        """Every cluster recorded under the state folder ``root``, sorted."""
        folder = root / "clusters"
        return sorted(path.stem for path in folder.glob("*.json")) if folder.is_dir() else []

    @property
    def cluster_file(self) -> Path:
        return self.root / "clusters" / f"{self.cluster_name}.json"

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs" / self.cluster_name

    @property
    def lock_file(self) -> Path:
        return self.root / "locks" / f"{self.cluster_name}.lock"

    @property
    def synthetic_data_dir(self) -> Path:
        return self.root / "data" / "synthetic"

    def data_dir_for(self, source: Path) -> Path:
        """Where `invoke data` converts an image folder by default: named after it."""
        return self.root / "data" / (source.name or "images")

    def remember_data(self, folder: Path) -> None:
        """The set `invoke data` made last: the bundled trainer's default data from then on."""
        write_json(self.root / "data" / "default.json", {"path": str(folder.resolve())})

    def default_data_dir(self) -> Path:
        """The set `invoke data` made last while it is there, else the synthetic one."""
        recorded = self.root / "data" / "default.json"
        if recorded.exists():
            folder = Path(json.loads(recorded.read_text())["path"])
            if (folder / "manifest.json").exists():
                return folder
        return self.synthetic_data_dir

    def load_cluster(self) -> ClusterState | None:
        if not self.cluster_file.exists():
            return None
        raw = json.loads(self.cluster_file.read_text())
        raw["hosts"] = [HostRecord(**host) for host in raw["hosts"]]
        return ClusterState(**raw)

    def save_cluster(self, cluster: ClusterState) -> None:
        write_json(self.cluster_file, dataclasses.asdict(cluster))

    def remove_cluster(self) -> None:
        self.cluster_file.unlink(missing_ok=True)

    def new_run_id(self) -> str:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        return f"{self.cluster_name}-{stamp}-{uuid.uuid4().hex[:4]}"

    def run_dir(self, run_id: str) -> Path:
        return self.runs_dir / run_id

    def save_run(self, run: RunRecord) -> None:
        write_json(self.run_dir(run.run_id) / "run.json", dataclasses.asdict(run))

    def load_run(self, run_id: str) -> RunRecord | None:
        path = self.run_dir(run_id) / "run.json"
        if not path.exists():
            return None
        return RunRecord(**json.loads(path.read_text()))

    def latest_run(self) -> RunRecord | None:
        """The most recently started run of this cluster, or None."""
        if not self.runs_dir.is_dir():
            return None
        runs = [self.load_run(path.name) for path in self.runs_dir.iterdir() if path.is_dir()]
        runs = [run for run in runs if run is not None]
        return max(runs, key=lambda run: run.started_at, default=None)


# Where state lived before the per-user folder: ``.tfcluster`` in the folder a command ran in.
PROJECT_STATE = ".tfcluster"
# Regenerated when missing (the built-in synthetic set): a copy in both places keeps the per-user one.
REMADE = ("data",)


def adopt_project_state(settings: Settings, folder: Path | None = None) -> str | None:
    """With the default (per-user) state folder, move a ``.tfcluster`` left in ``folder`` (the current
    one) into it, merging with what is there, and leave a link in its place: local workers that run
    now keep writing where their scripts say. Returns the one line that says so; None when there was
    nothing to move. A file that both hold (a cluster of the same name) stops it, named."""
    if settings.state_dir:
        return None  # A folder the user chose: theirs to keep.
    old = (folder or Path.cwd()) / PROJECT_STATE
    new = settings.state_path
    if old.is_symlink() or not old.is_dir() or old.resolve() == new.resolve():
        return None
    clashes = _clashes(old, new)
    if clashes:
        raise ConfigError(f"{old} and the per-user state folder {new} both hold {', '.join(clashes)}; keep using "
                          f"{old} with state_dir: {PROJECT_STATE} in invoke.yaml (or INVOKE_TFCLUSTER_STATE_DIR), "
                          "or move those files yourself")
    new.mkdir(parents=True, exist_ok=True)
    _merge(old, new)
    for record in [*new.glob("clusters/*.json"), *new.glob("runs/*/*/launch.json")]:
        text = record.read_text()  # Paths inside (a gcp cluster's key, a run's data) follow the move.
        if str(old) + "/" in text:
            record.write_text(text.replace(str(old) + "/", str(new) + "/"))
    old.symlink_to(new, target_is_directory=True)
    return (f"moved {old} to {new}, the per-user state folder that every folder now shares (a link stays "
            f"in its place); to keep a project's own folder, set state_dir: {PROJECT_STATE}")


def _clashes(old: Path, new: Path, relative: Path = Path()) -> list[str]:
    """Files under both ``old`` and ``new`` at the same place, but for locks and regenerated data."""
    found = []
    for child in sorted((old / relative).iterdir()):
        there = new / relative / child.name
        if not there.exists() or child.suffix == ".lock" or (relative / child.name).parts[0] in REMADE:
            continue
        if child.is_dir() and there.is_dir():
            found += _clashes(old, new, relative / child.name)
        else:
            found.append(str(relative / child.name))
    return found


def _merge(old: Path, new: Path) -> None:
    """Move everything under ``old`` into ``new``, then remove ``old`` (the clashes are known to be none)."""
    for child in list(old.iterdir()):
        there = new / child.name
        if not there.exists():
            shutil.move(str(child), str(there))
        elif child.is_dir() and there.is_dir() and child.name not in REMADE:
            _merge(child, there)
        elif child.is_dir():
            shutil.rmtree(child)  # Regenerated data the per-user folder has already.
        else:
            child.unlink()  # A lock file.
    old.rmdir()
