"""Every cluster of the state folder at once: `status --all`, and the list that `down` or `status` of
an unknown name shows, so a cluster made from another folder is never out of sight."""

from __future__ import annotations

from tfcluster import ui
from tfcluster.backends import get_backend
from tfcluster.commands.common import console, run_state, run_statuses
from tfcluster.commands.spend import cluster_figures
from tfcluster.errors import TfClusterError
from tfcluster.state import ClusterState, StateStore


def clusters(settings) -> list[ClusterState]:
    """Every cluster recorded in the state folder, by name."""
    found = []
    for name in StateStore.cluster_names(settings.state_path):
        cluster = StateStore(settings, name).load_cluster()
        if cluster is not None:
            found.append(cluster)
    return found


def named(settings) -> str:
    """The clusters that exist, as an error line lists them: "a (gcp, 2 workers), b (local, 3 workers)"."""
    return ", ".join(f"{c.name} ({c.backend}, {c.workers} worker{'s' if c.workers != 1 else ''})"
                     for c in clusters(settings))


def status_all(settings) -> list[dict]:
    """One row per cluster: backend, workers, state, its latest run, what it costs now and so far."""
    listed = clusters(settings)
    if not listed:
        console.print(f"No cluster in {settings.state_path}. Create one with: invoke up")
        return []
    table = ui.table(f"Clusters in {settings.state_path}", ["cluster", "backend", "workers", "state", "latest run",
                                                           "costs now", "spent so far"])
    rows = []
    for cluster in listed:
        store = StateStore(settings, cluster.name)
        # Silent: `status CLUSTER` shows each cluster's own notes (prices' source, host warnings).
        backend = get_backend(cluster.backend, store, announce=lambda text: None)
        run = store.latest_run()
        latest = "-" if run is None else f"{run.run_id} {_state_of(store, cluster, run, backend)}"
        now = _costs_now(backend, cluster, settings)
        spent = cluster_figures(store.root, cluster.name, since=cluster.created_at)
        table.add_row(cluster.name, cluster.backend, str(cluster.workers), cluster.status, latest, now,
                      spent.words())
        rows.append({"cluster": cluster.name, "backend": cluster.backend, "workers": cluster.workers,
                     "state": cluster.status, "costs_now": now})
    ui.show(table)
    return rows


def _state_of(store: StateStore, cluster: ClusterState, run, backend) -> str:
    if run.outcome is not None:
        return run.outcome
    try:
        return run_state(run, [status for _, status in run_statuses(store, cluster, run, backend)])
    except TfClusterError:
        return "unknown (its hosts do not answer)"


def _costs_now(backend, cluster: ClusterState, settings) -> str:
    """The cluster's USD per hour as its machines are now (stopped VMs bill their disks only, left
    out), or "-" where tfcluster has no prices (this machine, own hosts)."""
    try:
        rate = backend.hourly_rate(cluster, settings)
        if rate is None:
            return "- (no prices: not billed by the hour through tfcluster)"
        rows = backend.vm_rows(cluster, settings)
    except TfClusterError as error:
        return f"? ({error})"
    running = sum(row.status == "RUNNING" for row in rows)
    return f"${rate * running / max(1, len(cluster.hosts)):.2f}/h ({running} of {len(cluster.hosts)} VMs running)"
