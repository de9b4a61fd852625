"""How an attempt's workers run, behind one interface the attempt loop calls (start, look, follow,
stop):
- HostRunner: processes the launcher starts on the hosts (tfcluster/launch.py: a wrapper per worker,
  status files, signals): the local, ssh and gcp backends;
- JobRunner: one job of a managed service (a backend's CloudJob, tfcluster/backends/base.py: Vertex
  AI), which starts, restarts and stops the workers itself. The job's lines arrive in each worker's
  local log, so the same LogFollower reads them; its state becomes the workers' states here.

``runner_for`` picks one: a backend that runs attempts as cloud jobs says so by returning a job.
"""

from __future__ import annotations

from typing import Callable

from tfcluster import launch
from tfcluster.backends.base import CloudJob, JobReport, JobSpec

# What the service sets in each worker itself (Vertex AI: TF_CONFIG from its worker pools, the AIP_*
# folders from the job's base output directory), and the launcher's per-host values: not passed on.
SET_BY_THE_SERVICE = ("TF_CONFIG", "TFCLUSTER_WORKER_INDEX", "AIP_MODEL_DIR", "AIP_CHECKPOINT_DIR",
                      "AIP_TENSORBOARD_LOG_DIR")


class HostRunner:
    """An attempt as processes on the hosts (launch.py)."""

    def __init__(self, plans: list[launch.WorkerPlan]):
        self.plans = plans

    def follower(self) -> launch.LogFollower:
        return launch.LogFollower(self.plans, from_end=True)

    def start(self, attempt: int) -> None:
        launch.start_attempt(self.plans, attempt)

    def statuses(self, attempt: int) -> list[launch.WorkerStatus]:
        return [launch.worker_status(plan, attempt) for plan in self.plans]

    def stop(self, attempt: int, grace_seconds: float) -> None:
        launch.stop_attempt(self.plans, attempt, grace_seconds)


class JobRunner:
    """An attempt as one cloud job. ``note(text)`` shows what the service says about the job, after
    the workers' lines read with it (each look reads both; the follower prints the lines next)."""

    def __init__(self, job: CloudJob, plans: list[launch.WorkerPlan], note: Callable[[str], None]):
        self.job, self.plans, self.note = job, plans, note
        self.report: JobReport | None = None
        self.pending: list[str] = []
        self.restarts = 0  # The service's restarts of the job already told.

    def follower(self) -> "NotedFollower":
        return NotedFollower(launch.LogFollower(self.plans, from_end=True), self)

    def start(self, attempt: int) -> None:
        self.job.submit(attempt)

    def statuses(self, attempt: int) -> list[launch.WorkerStatus]:
        report = self.report = self.job.poll()
        self.pending += report.notes
        if report.restarts > self.restarts:
            self.restarts = report.restarts
            self.pending.append(f"the service started the job's workers again (restart {report.restarts}: a replaced "
                                "machine, such as a Spot preemption, restarts the whole job); they resume from the "
                                "last backup")
        return [self._status(report, plan.index) for plan in self.plans]

    @staticmethod
    def _status(report: JobReport, index: int) -> launch.WorkerStatus:
        if report.state == "STARTING":
            return launch.WorkerStatus(launch.STARTING)
        if report.state == "RUNNING":
            return launch.WorkerStatus(launch.RUNNING)
        if report.state == "SUCCEEDED":
            return launch.WorkerStatus(launch.SUCCEEDED, exit_code=0)
        if report.state == "STOPPED":
            return launch.WorkerStatus(launch.LOST, detail=f"was stopped with its job ({report.cloud_state})")
        if index != (report.failed_worker or 0):
            return launch.WorkerStatus(launch.RUNNING)  # The service stops the others with the job.
        exited = f"exited with code {report.exit_code}; " if report.exit_code is not None else ""
        return launch.WorkerStatus(launch.FAILED, exit_code=report.exit_code,
                                   detail=f"{exited}the job ended {report.cloud_state}: {report.message}")

    def stop(self, attempt: int, grace_seconds: float) -> None:
        """Cancel the job: the service stops every worker; returns once it says the job ended."""
        self.job.cancel()


class NotedFollower:
    """The workers' local logs, then what the service said with them."""

    def __init__(self, inner: launch.LogFollower, runner: JobRunner):
        self.inner, self.runner = inner, runner

    def poll(self, flush: bool = False):
        yield from self.inner.poll(flush)
        notes, self.runner.pending = self.runner.pending, []
        for text in notes:
            self.runner.note(text)


def job_statuses(backend, cluster, run, plans: list[launch.WorkerPlan]) -> list[launch.WorkerStatus] | None:
    """The workers' states from the cloud job of the run's current attempt; None when the
    backend runs processes (their status files tell)."""
    job = backend.cloud_job_of(cluster, run.run_id, max(run.attempts, 1))
    if job is None:
        return None
    report = job.look()
    return [JobRunner._status(report, plan.index) for plan in plans]


def cancel_job(backend, cluster, run) -> bool:
    """Cancel the cloud job of the run's current attempt and wait until it ended; False when the
    backend runs processes instead (the caller stops them)."""
    job = backend.cloud_job_of(cluster, run.run_id, max(run.attempts, 1))
    if job is None:
        return False
    job.cancel()
    return True


def runner_for(backend, cluster, run_id: str, plans: list[launch.WorkerPlan], image: str,
               note: Callable[[str], None]) -> HostRunner | JobRunner:
    """The cloud job's runner when the backend runs attempts as jobs, else the hosts' one."""
    env = {key: value for key, value in plans[0].env.items() if key not in SET_BY_THE_SERVICE}
    job = backend.cloud_job(cluster, run_id, JobSpec(list(plans[0].argv), env, len(plans), image))
    return HostRunner(plans) if job is None else JobRunner(job, plans, note)
