"""Helpers every command shares: the console, the backend of a cluster, a run's workers and state."""

from __future__ import annotations

from tfcluster import container, launch, ui
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
        raise ClusterError(f"no cluster '{store.cluster_name}' is up; run: invoke up")
    return cluster


def active_run(store: StateStore, cluster: ClusterState,
               backend: Backend | None = None) -> tuple[RunRecord, list] | None:
    run = store.latest_run()
    if run is None or run.outcome is not None or run.attempts == 0:
        return None
    plans = plans_for(store, cluster, run, backend=backend)
    statuses = [launch.worker_status(plan, attempt_of(run, plan)) for plan in plans]
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


def run_statuses(store, cluster, run,
                 backend: Backend | None = None) -> list[tuple[launch.WorkerPlan, launch.WorkerStatus]]:
    plans = plans_for(store, cluster, run, backend=backend)
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
