"""The written interface between the commands, the shared launcher and a backend.

``WorkerHost`` is all the launcher sees of a machine (backends/host.py, re-exported here); ``Backend`` is
what the commands need.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tfcluster import ledger
from tfcluster.backends import docker
from tfcluster.backends.host import CommandResult, JobFiles, WorkerHost  # noqa: F401 - part of the written interface
from tfcluster.config import Settings
from tfcluster.errors import ClusterError
from tfcluster.state import ClusterState


@dataclass
class JobSpec:
    """What an attempt runs, for a backend whose attempts are cloud jobs (Backend.cloud_job)."""

    # argv every worker runs, as Staged.argv (no "{run_root}": the cloud job has no host folder).
    argv: list[str]
    # The workers' environment beyond what the cloud sets itself (TF_CONFIG, the AIP_* folders).
    env: dict[str, str]
    # Workers: the chief and workers - 1 others.
    workers: int
    # The image every worker runs in.
    image: str


@dataclass
class JobReport:
    """One look at an attempt that runs as one cloud job."""

    # STARTING (queued, being provisioned), RUNNING, SUCCEEDED, FAILED or STOPPED (cancelled).
    state: str
    # The cloud's own name for it (JOB_STATE_RUNNING), as `status` shows it.
    cloud_state: str = ""
    # On FAILED: the worker the cloud names and its exit code (None when it names none), and its words.
    failed_worker: int | None = None
    exit_code: int | None = None
    message: str = ""
    # How often the service has started the job's workers again so far (a Spot preemption restarts the job).
    restarts: int = 0
    # The cloud's own lines about the job since the last look ("Job is running."), oldest first.
    notes: list[str] = field(default_factory=list)
    # The service's name for the job ("" when none was submitted).
    job: str = ""


class CloudJob(Protocol):
    """An attempt as one job of a managed service (Vertex AI): the service starts, restarts and
    stops the workers; the launcher submits, looks and cancels. Each worker's lines arrive in its
    local log (the run folder's worker-I.log), where the launcher follows them."""

    def submit(self, attempt: int) -> None:
        """Start attempt ``attempt``: one new job."""

    def poll(self) -> JobReport:
        """The job now, with its new lines appended to the workers' local logs."""

    def look(self) -> JobReport:
        """The job now, its state only (another shell's `status`: the launcher mirrors the lines)."""

    def cancel(self) -> None:
        """Cancel the job; return once the service says it ended and nothing of it runs."""


@dataclass(frozen=True)
class Finding:
    """One prerequisite `invoke check` looked at."""

    subject: str  # What was checked: "credentials", "APIs", "constraints/compute.requireOsLogin"...
    holds: bool | None  # True ✓; False ✗ (it fails: detail names the fix); None ? (it could not be told).
    detail: str  # What was found, and the fix or what to ask for.

    def line(self) -> str:
        return f"{ {True: '✓', False: '✗', None: '?'}[self.holds]} {self.subject}: {self.detail}"


class Backend:
    """What the commands need from a backend.

    The first group is required of every backend. The second group are optional
    capabilities: each has a default here that says "not applicable" (an empty result or a
    ClusterError naming the backend), and a backend overrides only what applies to it. The
    commands call them unconditionally; nothing is discovered with hasattr.
    """

    name: str = "?"
    # Whether the machines stay after `down` (your own hosts): then what tfcluster left on a host
    # that cannot be reached stays there, and `down` must say so instead of claiming it clean.
    hosts_outlive_cluster: bool = False
    # Whether tfcluster may halt the machines (cloud VMs): `train --then stop`, and each machine
    # halting itself at the run's end when the launcher is gone (arm_then_stop, stop_machines).
    can_halt_machines: bool = False
    # Whether a machine whose GPUs fail the host check can be replaced by a new one (replace_machines).
    can_replace_machines: bool = False
    # Whether `train --requirements` goes with the staged payload, installed by the job itself (a cloud
    # job's bootstrap), instead of on each host before the run (commands/requirements.py).
    installs_requirements_in_job: bool = False
    # Why `invoke tune` cannot run on this backend, with what to use instead ("" when it can).
    tune_unsupported: str = ""
    # The run folder's TensorBoard folder in a cloud bucket (Vertex AI names it logs/: AIP_TENSORBOARD_LOG_DIR).
    tensorboard_folder: str = "tensorboard"

    def confirm(self, question: str) -> bool:
        """Asked by `up` before it creates what bills (the question says what it costs an hour). The
        commands replace it on a terminal (`up --yes` does not); the default, without one, is yes."""
        return True

    def replicas_per_machine(self, settings: Settings) -> int:
        """The replicas one worker's machine adds to the run, as the launcher knows them (what
        TFCLUSTER_REPLICAS counts): one, unless the backend knows the machine's GPUs."""
        return 1

    # ------------------------------------------------------------ required

    def up(self, settings: Settings, existing: ClusterState | None) -> ClusterState:
        """Create the cluster (or return ``existing`` unchanged when it already matches)."""
        raise NotImplementedError

    def hosts(self, cluster: ClusterState) -> list[WorkerHost]:
        """One WorkerHost per worker slot, in TF_CONFIG order."""
        raise NotImplementedError

    def preflight(self, cluster: ClusterState, hosts: list[WorkerHost], need_tensorflow: bool,
                  image: str = "") -> None:
        """Check every host before anything starts; raise one error naming every failure.
        ``need_tensorflow``: also tf_keras, because tf.keras resolves to it (TF_USE_LEGACY_KERAS=1).
        With ``image``, Python and TensorFlow are checked inside that image instead."""
        raise NotImplementedError

    def stage(self, cluster: ClusterState, hosts: list[WorkerHost], run_id: str, payload: "Payload") -> "Staged":
        """Make code and data available on the hosts; return the argv and environment."""
        raise NotImplementedError

    def before_retry(self, hosts: list[WorkerHost], run_id: str) -> None:
        """Make the chief's checkpoint readable by every worker before a restart."""
        raise NotImplementedError

    def collect(self, hosts: list[WorkerHost], run_id: str, local_run_dir: Path, succeeded: bool) -> str | None:
        """Bring logs (and, on success, the chief's outputs) to the local run folder.
        Returns the local model folder when one was fetched."""
        raise NotImplementedError

    def leftover_processes(self, cluster: ClusterState) -> list[str]:
        """Descriptions of any process still carrying this cluster's id (should be none)."""
        raise NotImplementedError

    def kill_leftovers(self, cluster: ClusterState) -> None:
        """SIGKILL every process still carrying this cluster's id."""
        raise NotImplementedError

    def teardown(self, cluster: ClusterState, keep: bool, delete_bucket: bool = False) -> None:
        """Remove what the cluster created (remote folders, machines) unless ``keep``; a cloud
        bucket of results only with ``delete_bucket``."""
        raise NotImplementedError

    # ------------------------------------------------------------ optional capabilities

    def leftover_containers(self, cluster: ClusterState) -> dict[str, list[str]]:
        """Per machine: containers labelled with this cluster's id (`train --image`); should be
        none after `stop`. Default: asks Docker on every host (none where Docker is absent)."""
        return docker.cluster_containers(self.hosts(cluster), cluster.cluster_id)

    def remove_containers(self, cluster: ClusterState) -> None:
        """`docker rm --force` every container labelled with this cluster's id."""
        docker.remove_cluster_containers(self.hosts(cluster), cluster.cluster_id)

    def pre_pull(self, cluster: ClusterState, image: str) -> list[str]:
        """`up` with an image: pull it on every machine at once ("present"/"pulled" per machine)."""
        return docker.pre_pull(self.hosts(cluster), image)

    def check(self, settings: Settings) -> list[Finding]:
        """`invoke check`: what the account and project must offer before `up` creates anything.
        Default: nothing to check (no account, no cloud)."""
        return []

    def refresh(self, cluster: ClusterState, settings: Settings) -> None:
        """`up` on a cluster that exists: bring stopped machines back and restore the configured
        idle settings. Default: nothing can have stopped, so nothing to do."""

    def reachability(self, cluster: ClusterState) -> dict[str, str | None]:
        """Per worker name: None when its machine answers, else why not (within a short deadline).
        Default: empty, the machines are this one."""
        return {}

    def vm_rows(self, cluster: ClusterState, settings: Settings) -> list[VmRow]:
        """One row per cloud VM with its state and cost so far. Default: no VMs that bill."""
        return []

    def spend_sync(self, cluster: ClusterState, settings: Settings, book: ledger.Ledger, own: str = "",
                   run: str = "") -> list[str]:
        """Append to ``book`` (tfcluster/ledger.py) the machines' starts and stops it lacks, and the
        prices in use; return where it disagrees with the cloud's own record (one line each). ``own``:
        what tfcluster itself just did (ledger.START at `up`, ledger.DELETE at `down`); ``run``: the run
        active. Default (own hosts, this machine): each host counts from `up` to `down`, on this
        machine's clock, with no prices."""
        if own in (ledger.START, ledger.DELETE):
            now = time.time()
            running = {name for name, _, _, still in ledger.spells_of(book.events(), now) if still}
            book.append([ledger.Event(now, host.name, own, ledger.OWN, run, f"invoke {'up' if own == ledger.START else 'down'}")
                         for host in cluster.hosts if (own == ledger.START) != (host.name in running)])
        return []

    def set_idle(self, cluster: ClusterState, idle_minutes: int, action: str) -> None:
        """Change the idle watchdog's settings on every machine."""
        raise ClusterError(f"the {self.name} backend has no idle watchdog (workers run on this machine)")

    def set_stall_minutes(self, cluster: ClusterState, stall_minutes: float | None) -> None:
        """Hand a run's --stall-minutes (None: tfcluster/stall.py's default rule) to every machine's
        watchdog, which counts a run stalled past that limit as idle, so the limit holds with the
        laptop gone. Default: nothing to tell, these machines have no watchdog."""

    def hourly_rate(self, cluster: ClusterState, settings) -> float | None:
        """The whole cluster's USD per hour while it runs, for `train --budget`; None: this backend
        has no prices (its machines are not billed by the hour through tfcluster)."""
        return None

    def set_budget_end(self, cluster: ClusterState, end: float | None) -> None:
        """Hand a run's budget end time (epoch seconds; None: no budget) to every machine's watchdog,
        which halts its machine then, laptop or not. Default: nothing to tell (no prices, no watchdog)."""

    def watchdog_status(self, cluster: ClusterState) -> dict[str, dict | None]:
        """Per worker name: the watchdog's last status, None where none is installed.
        Default: empty, meaning this backend has no watchdog at all."""
        return {}

    def hypervisor_deadlines(self, cluster: ClusterState) -> dict[str, float | None]:
        """Per worker name: when the hypervisor stops the machine (epoch seconds), None if never.
        Default: empty, no machine has one."""
        return {}

    def require_modules(self, cluster: ClusterState, hosts: list[WorkerHost], modules: list[str]) -> None:
        """Check that the hosts' interpreter imports ``modules``; one error naming every host that
        cannot. Default: the workers run this machine's interpreter, which has the project's
        dependencies."""

    def preemptions(self, cluster: ClusterState, since: float) -> list[Preemption]:
        """Workers whose machine the cloud took back (a Spot preemption) at or after ``since``
        (epoch seconds) and that are not running now. Default: none, machines are never preempted."""
        return []

    def restart_preempted(self, cluster: ClusterState, settings: Settings) -> None:
        """Start the preempted machines again (waiting while the zone has no capacity) and update
        ``cluster``'s host records (addresses, host keys). Default: nothing can be preempted."""
        raise ClusterError(f"the {self.name} backend has no machines the cloud can preempt")

    def replace_machines(self, cluster: ClusterState, settings: Settings, workers: list[str]) -> None:
        """Replace the named workers' machines with new ones (new hardware) and update ``cluster``'s host
        records. Default: the machines are not tfcluster's to replace."""
        raise ClusterError(f"the {self.name} backend's machines are not tfcluster's to replace")

    def arm_then_stop(self, cluster: ClusterState, run_id: str, last_attempt: int) -> None:
        """Have every machine halt itself once ``run_id``'s end is recorded on it (its watchdog's
        then_stop), so `train --then stop|down` holds with the laptop gone. Default: not applicable."""
        raise ClusterError(f"the {self.name} backend's machines are not tfcluster's to halt")

    def stop_machines(self, cluster: ClusterState) -> list[str]:
        """Halt every machine now (disks stay) and clear what arm_then_stop set; the names stopped.
        Default: not applicable."""
        raise ClusterError(f"the {self.name} backend's machines are not tfcluster's to halt")

    def maintenance_notices(self, cluster: ClusterState, hosts: list[WorkerHost]) -> dict[int, str]:
        """Workers whose machine announces host maintenance now: worker index -> the event as the
        machine words it (TERMINATE_ON_HOST_MAINTENANCE). Default: none, only a cloud VM has a host."""
        return {}

    def restart_for_maintenance(self, cluster: ClusterState, settings: Settings, workers: list[int]) -> None:
        """Stop the announced workers' machines and start them again (on another host), updating
        ``cluster``'s host records. Default: no machine here has host maintenance."""
        raise ClusterError(f"the {self.name} backend has no machines with host maintenance")

    def cloud_job(self, cluster: ClusterState, run_id: str, spec: JobSpec) -> CloudJob | None:
        """The run's attempts as jobs of a managed service (Vertex AI), one job each. Default: None,
        the workers are processes the launcher starts on the hosts."""
        return None

    def cloud_job_of(self, cluster: ClusterState, run_id: str, attempt: int) -> CloudJob | None:
        """The job a run's attempt was submitted as, to look at or cancel from any shell. Default: None,
        the workers are processes whose status files tell."""
        return None

    def gather(self, hosts: list[WorkerHost], run_id: str, folder: str, local_run_dir: Path) -> None:
        """Merge ``folder`` (relative to each host's run folder) from every host into the local
        run folder, hosts[0] last (its files win). Default: the hosts' run folder is the local one."""


@dataclass
class Preemption:
    """A worker's machine that the cloud stopped (Spot preemption)."""

    # Worker name (worker-2) and its cloud instance name.
    worker: str
    instance: str
    # The worker's internal address, as the console shows it.
    address: str
    # When the cloud preempted it (epoch seconds, from the cloud's own record).
    at: float


@dataclass
class VmRow:
    """One cloud VM as `status` shows it."""

    # Instance name.
    name: str
    # Compute Engine status, e.g. RUNNING, TERMINATED.
    status: str
    # Seconds since its last start (0 when not running).
    uptime_seconds: float
    # Estimated USD billed since its last start.
    cost_so_far: float
    # How it got its capacity: its provisioning model and any reservation it consumes ("" when not told).
    capacity: str = ""


@dataclass
class Payload:
    # Interpreter on the workers.
    python: str
    # A user's script; None runs the bundled trainer (python -m trainer.task).
    script: Path | None
    # Folder shipped with the script (it must contain the script); None ships the script alone.
    project: Path | None
    # Local TFRecord folder to make available to the workers; None when the data is remote.
    data_dir: Path | None
    # Arguments for the trainer or script.
    args: list[str]
    # `train --requirements`' bytes, for a backend that installs them in its job (installs_requirements_in_job).
    requirements: bytes | None = None


@dataclass
class Staged:
    # argv every worker runs; "{run_root}" is replaced by the worker's run folder.
    argv: list[str]
    # Backend-specific environment; values may contain "{run_root}".
    env: dict[str, str]
    # Per worker name: whether code or data had to be uploaded (False: content hash matched).
    uploaded: dict[str, bool]
    # Host folders (code, data) a container must see at the same path (`train --image`);
    # "{remote_root}" stands for each host's HostRecord.remote_root.
    mounts: list[str] = field(default_factory=list)
