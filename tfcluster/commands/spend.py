"""Spend: the cost ledger (tfcluster/ledger.py) brought up to date and shown by `status`, `down` and
the run summary, and `invoke costs`, which lists every cluster and run, up or gone."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tfcluster import ledger, ui
from tfcluster.commands.common import console
from tfcluster.errors import TfClusterError
from tfcluster.state import ClusterState, RunRecord, StateStore


def sync(store: StateStore, backend, cluster: ClusterState, settings, own: str = "", run: str = "") -> list[str]:
    """Record what the backend shows that the ledger lacks; the disagreements with the cloud's record.
    A cloud that cannot be read is one yellow line: the command's own work stands."""
    try:
        book = ledger.Ledger(store.root, cluster.name)
        book.note_cluster(cluster.created_at)  # A later cluster of this name starts its own figures.
        return backend.spend_sync(cluster, settings, book, own, run)
    except TfClusterError as error:
        console.print(f"[yellow]Cost ledger not brought up to date: {error}[/]", soft_wrap=True)
        return []


def _runs(state_dir: Path, cluster: str) -> list[RunRecord]:
    folder = Path(state_dir) / "runs" / cluster
    runs = []
    for path in sorted(folder.glob("*/run.json")) if folder.is_dir() else []:
        try:
            runs.append(RunRecord(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue
    return sorted(runs, key=lambda run: run.started_at)


def cluster_figures(state_dir: Path, cluster: str, now: float | None = None,
                    since: float | None = None, until: float | None = None) -> ledger.Figures:
    """The cluster's figures since its first `up` (``since``: its creation, which leaves out an
    earlier cluster of the same name; ``until``: a later one's creation), with the work its runs redid
    after preemptions."""
    redone = sum(float(run.summary.get("redone_seconds") or 0.0) for run in _runs(state_dir, cluster)
                 if (since is None or run.started_at >= since) and (until is None or run.started_at < until))
    return ledger.Ledger(state_dir, cluster).figures(start=since, end=until, now=now, redone_seconds=redone)


def print_status(store: StateStore, backend, cluster: ClusterState, settings) -> None:
    """`status`: the cluster's spend so far, which a restart does not reset, and any disagreement."""
    latest = store.latest_run()
    disagree = sync(store, backend, cluster, settings, run=latest.run_id if latest and latest.outcome is None else "")
    figures = cluster_figures(store.root, cluster.name, since=cluster.created_at)
    console.print(f"spent so far (since the first `up`, across restarts): {figures.words()}", soft_wrap=True,
                  markup=False)
    if figures.prices:
        console.print(figures.source(), soft_wrap=True, markup=False)
    for line in disagree:
        console.print(f"[yellow]! ledger and Compute disagree: {line}; the figures above count the ledger's "
                      "(`invoke costs` lists its events' sources)[/]", soft_wrap=True)


def print_final(store: StateStore, backend, cluster: ClusterState, settings) -> None:
    """`down`: the deletions recorded, then the cluster's final cost."""
    sync(store, backend, cluster, settings, own=ledger.DELETE)
    figures = cluster_figures(store.root, cluster.name, since=cluster.created_at)
    console.print(f"final cost of cluster {cluster.name}: {figures.words()}", soft_wrap=True, markup=False)
    if figures.prices:
        console.print(figures.source(), soft_wrap=True, markup=False)


def run_cost(store: StateStore, backend, settings, run: RunRecord) -> str | None:
    """The run summary's cost: the cluster's machines over the run's time, after a last sync."""
    cluster = store.load_cluster()
    if cluster is None:
        return None
    sync(store, backend, cluster, settings, run=run.run_id)
    figures = ledger.run_figures(store.root, cluster.name, run)
    return figures.words() + (f"; {figures.source()}" if figures.prices else "")


def generations(book: ledger.Ledger) -> list[tuple[float | None, float | None]]:
    """(from, to) of each cluster that had this name: from its creation to the next one's."""
    starts = book.generations()
    if not starts:
        return [(None, None)]
    return [(start, starts[i + 1] if i + 1 < len(starts) else None) for i, start in enumerate(starts)]


def costs(settings) -> list[dict]:
    """`invoke costs`: every cluster with a ledger (up or gone), one row for each cluster that had
    the name (a later one never changes an earlier one's figures), and each of its runs."""
    root = settings.state_path
    books = ledger.ledgers(root)
    if not books:
        console.print(f"No cost ledger under {root / 'ledger'} yet: `invoke up` starts one.")
        return []
    now = time.time()
    table = ui.table("Clusters (from the ledger; kept after `down`)",
                     ["cluster", "state", "first up", "spent", "events"])
    listed = []
    for book in books:
        events = book.events()
        spans = generations(book)
        for index, (since, until) in enumerate(spans):
            figures = cluster_figures(root, book.cluster, now, since, until)
            mine = [e for e in events if (since is None or e.at >= since) and (until is None or e.at < until)]
            up = index == len(spans) - 1 and (root / "clusters" / f"{book.cluster}.json").exists()
            state = "up" if up else "down"
            first = ui.when(mine[0].at) if mine else "-"
            table.add_row(book.cluster, state, first, figures.words(), str(len(mine)))
            listed.append({"cluster": book.cluster, "state": state, "since": since, "until": until,
                           "cost_usd": figures.cost_usd, "vm_hours": figures.vm_hours, "runs": []})
    ui.show(table)
    for book in books:
        runs = _runs(root, book.cluster)
        prices = book.prices()
        if prices:
            console.print(f"{book.cluster}: prices of {prices.date}: {prices.source}", soft_wrap=True, markup=False)
        if not runs:
            continue
        table = ui.table(f"Runs of {book.cluster}", ["run", "outcome", "started", "spent"])
        for run in runs:
            figures = ledger.run_figures(root, book.cluster, run, now)
            table.add_row(run.run_id, run.outcome or "running", ui.when(run.started_at), figures.words())
            entry = next(e for e in listed if e["cluster"] == book.cluster
                         and (e["since"] is None or run.started_at >= e["since"])
                         and (e["until"] is None or run.started_at < e["until"]))
            entry["runs"].append({"run": run.run_id, "cost_usd": figures.cost_usd, "vm_hours": figures.vm_hours})
        ui.show(table)
    return listed
