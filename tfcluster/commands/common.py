"""Helpers every command shares: the console, the backend of a cluster, a run's workers and state."""

from __future__ import annotations

import os
import signal
import socket
import time
from typing import Callable

from tfcluster import container, holds, launch, runners, state, ui
from tfcluster.backends import Backend, get_backend
from tfcluster.commands.tune_plans import attempt_of, build_tune_plans
from tfcluster.errors import ClusterError
from tfcluster.state import ClusterState, RunRecord, StateStore

console = ui.console


def backend_named(name: str, store: StateStore) -> Backend:
    # soft_wrap: an announced command stays on one line, copyable.
    return get_backend(name, store, announce=lambda text: console.print(f"[yellow]![/] {text}", soft_wrap=True))


def require_cluster(store: StateStore) -> ClusterState:
    cluster = store.load_cluster()
    if cluster is None:
        others = StateStore.cluster_names(store.root)
        listed = (f"; the clusters in {store.root} are {', '.join(others)}: pick one with --cluster NAME"
                  if others else "")
        raise ClusterError(f"no cluster '{store.cluster_name}' is up; run: invoke up{listed}")
    return cluster


def require_up_cluster(store: StateStore) -> ClusterState:
    """The cluster, for a command that starts workers: one whose `up` finished. An `up` that was killed
    or failed leaves the record "provisioning" (no hosts yet): say how to finish it, never start there."""
    cluster = require_cluster(store)
    if cluster.status != "up":
        raise ClusterError(f"cluster '{cluster.name}' is not up: its `invoke up` did not finish (killed or failed); "
                           "run `invoke up` again to finish it, or `invoke down` to remove what it made")
    return cluster


def active_run(store: StateStore, cluster: ClusterState,
               backend: Backend | None = None) -> tuple[RunRecord, list] | None:
    """The cluster's run that still runs: a launcher is attached to it (between attempts too, when no
    worker runs), or some worker of its current attempt runs."""
    run = store.latest_run()
    if run is None or run.outcome is not None:
        return None
    if run.started_at < cluster.created_at:  # A run of an earlier cluster of this name: `down` ended its machines.
        return None
    attached = holds.attached_launcher(store, run.run_id) is not None
    if run.attempts == 0 and not attached:
        return None
    plans = plans_for(store, cluster, run, backend=backend)
    if attached:
        return run, plans
    statuses = [status for _, status in run_statuses(store, cluster, run, backend, plans)]
    if any(status.state in (launch.RUNNING, launch.STARTING) for status in statuses):
        return run, plans
    return None


def plans_for(store: StateStore, cluster: ClusterState, run: RunRecord,
              env: dict[str, str] | None = None, backend: Backend | None = None) -> list[launch.WorkerPlan]:
    hosts = (backend or backend_for_cluster(store, cluster)).hosts(cluster)[: run.workers]
    if run.kind == "tune":  # Enough to find every process's files; env and ports only matter at start.
        return build_tune_plans(hosts, run.run_id, run.command, env or {}, run.oracle_port, "")
    image = container.ContainerSpec(run.image, run.mounts) if run.image else None
    return launch.build_plans(hosts, run.run_id, run.command, env or {}, image)


def backend_for_cluster(store: StateStore, cluster: ClusterState):
    return backend_named(cluster.backend, store)


def run_statuses(store, cluster, run, backend: Backend | None = None,
                 plans: list | None = None) -> list[tuple[launch.WorkerPlan, launch.WorkerStatus]]:
    """Each worker's state: its cloud job's (Vertex AI), else its status files."""
    backend = backend or backend_for_cluster(store, cluster)
    plans = plans if plans is not None else plans_for(store, cluster, run, backend=backend)
    from_job = runners.job_statuses(backend, cluster, run, plans)
    if from_job is not None:
        return list(zip(plans, from_job))
    return [(plan, launch.worker_status(plan, attempt_of(run, plan))) for plan in plans]


def stop_processes(plans: list[launch.WorkerPlan], run: RunRecord, grace_seconds: float) -> None:
    """stop_attempt for every process at its own attempt (tune restarts tuners one by one)."""
    by_attempt: dict[int, list[launch.WorkerPlan]] = {}
    for plan in plans:
        by_attempt.setdefault(attempt_of(run, plan), []).append(plan)
    for attempt, group in by_attempt.items():
        launch.stop_attempt(group, attempt, grace_seconds)


def run_state(run: RunRecord, statuses: list[launch.WorkerStatus]) -> str:
    """The run's state from its record and, if the launcher is gone, from the workers' files."""
    if run.outcome is not None:
        return run.outcome
    states = {status.state for status in statuses}
    if states & {launch.RUNNING, launch.STARTING}:
        return "running"
    if states == {launch.SUCCEEDED}:
        return "succeeded"
    return "failed"


def run_or_latest(store: StateStore, run_id: str | None) -> RunRecord:
    run = store.load_run(run_id) if run_id else store.latest_run()
    if run is None:
        raise ClusterError(f"no run {'named ' + run_id if run_id else 'yet'} for cluster "
                           f"'{store.cluster_name}'; start one with: invoke train")
    return run


# How long `stop` and `down` wait for an attached launcher to see the stop and exit on its own
# (it checks every half second, then stops its workers) before ending it.
LAUNCHER_EXIT_SECONDS = 60.0


def process_gone(pid: int) -> bool:
    """Whether ``pid`` no longer runs on this machine (a zombie counts as gone: it can start nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rpartition(")")[2].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def end_launchers(store: StateStore, settled: Callable[[], bool], by: str,
                  known: list[tuple[str, dict]] = ()) -> list[int]:
    """Wait until ``settled()`` (no launcher holds what the caller needs), asking each live launcher
    of the cluster to stop (``by``: who asks). A launcher that has not exited after
    LAUNCHER_EXIT_SECONDS is ended if it runs on this machine (SIGTERM, then SIGKILL); one elsewhere
    is an error naming it. ``known``: launchers seen before the caller asked them to stop (they may
    have let go already). Returns the pids of the launchers seen, each process gone by then."""
    here = socket.gethostname()
    seen = {int(info.get("pid") or 0): info.get("host", "") for _, info in known}
    deadline = time.monotonic() + LAUNCHER_EXIT_SECONDS
    signalled: dict[int, float] = {}
    waiting = None
    try:
        while not settled():
            for run_id, info in holds.live_launchers(store):
                holds.request_stop(store, run_id, by)
                seen[int(info.get("pid") or 0)] = info.get("host", "")
            if waiting is None:
                waiting = console.status(f"Waiting for the launcher of cluster '{store.cluster_name}' "
                                         f"(pid {', '.join(map(str, seen)) or '?'}) to stop its workers and exit...")
                waiting.start()
            now = time.monotonic()
            if now > deadline:
                elsewhere = [f"pid {pid} on {host}" for pid, host in seen.items() if host != here]
                if elsewhere:
                    raise ClusterError(f"the launcher of cluster '{store.cluster_name}' ({', '.join(elsewhere)}) "
                                       "did not stop within a minute; end it there (Ctrl-C), then run this again")
                for pid in seen:
                    if pid and pid != os.getpid():
                        late = now - signalled.setdefault(pid, now) > 10
                        _signal(pid, signal.SIGKILL if late else signal.SIGTERM)
            time.sleep(0.2)
    finally:
        if waiting is not None:
            waiting.stop()
    # The locks drop a moment before the process ends: wait for the end itself.
    gone_by = time.monotonic() + 10
    for pid, host in seen.items():
        while host == here and pid != os.getpid() and not process_gone(pid) and time.monotonic() < gone_by:
            time.sleep(0.05)
    return sorted(seen)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def adopt_project_state(settings) -> None:
    """Move a ``.tfcluster`` of the current folder into the per-user state folder, saying so in one line."""
    moved = state.adopt_project_state(settings)
    if moved:
        console.print(f"[yellow]![/] {moved}", soft_wrap=True)
