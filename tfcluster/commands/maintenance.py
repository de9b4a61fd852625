"""Host maintenance during a run: an attempt that ended because Google announced it is retried on
machines moved away from it, not reported as the program's failure.

On a GPU VM, Google announces maintenance up to an hour ahead in the metadata server's
instance/maintenance-event (TERMINATE_ON_HOST_MAINTENANCE), then terminates the VM. TensorFlow's
PreemptionCheckpointHandler (BackupAndRestore with save_before_preemption, which the trainer turns on
on GPUs) watches that key, has every worker back up, and exits 143
(tensorflow/python/distribute/failure_handling/failure_handling_util.py: _RESTARTABLE_EXIT_CODE = 143,
termination_watcher_function_gce). A script killed by SIGTERM when the VM goes down exits 143 too.
"""

from __future__ import annotations

import time
from typing import Callable

from tfcluster import launch
from tfcluster.commands.common import console
from tfcluster.config import Settings
from tfcluster.errors import TfClusterError, TrainingFailed
from tfcluster.state import RunRecord, StateStore

# The exit status of a worker that TensorFlow stopped for maintenance (128 + SIGTERM).
RESTARTABLE_EXIT_CODE = 143


def announced(backend, store: StateStore, failure: launch.AttemptResult, plans: list) -> dict[int, str]:
    """Worker index -> the announced event, when a failed worker exited 143 and some VM announces
    host maintenance; empty otherwise (with a note when the VMs cannot be asked)."""
    if not any(status.exit_code == RESTARTABLE_EXIT_CODE for _, status in failure.failures):
        return {}
    try:
        return backend.maintenance_notices(store.load_cluster(), [plan.host for plan in plans])
    except TfClusterError as error:
        console.print(f"[yellow]Could not ask the VMs for maintenance notices ({error}).[/]", soft_wrap=True)
        return {}


def report(settings: Settings, store: StateStore, run: RunRecord, plans: list, notices: dict[int, str],
           attempt: int, progress: launch.Progress, record_failed: Callable[[], None]) -> None:
    """Record and report the notices and stop every worker's process; the caller then moves the
    announced VMs. When no retry is left, ``record_failed()`` records the run and TrainingFailed is raised."""
    last = attempt == run.retries + 1
    for index, event in sorted(notices.items()):
        plan = plans[index]
        follow = "no retry is left" if last else \
            f"moving its VM to another host and resuming (attempt {attempt + 1} of {run.retries + 1})"
        console.print(f"[bold yellow]⚙ {plan.name} ({plan.host.record.address}): Google announced host maintenance "
                      f"({event}); the workers backed up and exited {RESTARTABLE_EXIT_CODE}; {follow}[/]",
                      soft_wrap=True)
        progress.maintenance.append({"worker": plan.name, "instance": plan.host.record.instance, "event": event,
                                     "attempt": attempt, "noticed_at": time.time()})
    run.summary = {**run.summary, "maintenance": list(progress.maintenance)}
    store.save_run(run)
    launch.stop_attempt(plans, attempt, settings.stop_grace_seconds)
    if last:
        record_failed()
        raise TrainingFailed(f"run {run.run_id} failed: Google announced host maintenance for "
                             f"{describe(notices, plans)} and no retry is left (--retries {run.retries} counts "
                             f"maintenance too); the workers backed up; resume it with "
                             f"`invoke train --resume {run.run_id}`")


def describe(notices: dict[int, str], plans: list) -> str:
    return ", ".join(f"{plans[index].name} ({event})" for index, event in sorted(notices.items()))

