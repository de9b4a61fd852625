"""Cluster lifecycle: up, status (with VMs and the idle watchdog), idle, down."""

from __future__ import annotations

import dataclasses
import shlex
import sys
import time

from rich.prompt import Confirm

from tfcluster import holds, launch, ledger, tfconfig, ui
from tfcluster.backends import Backend
from tfcluster.commands.common import (backend_for_cluster, backend_named, console, end_launchers,
                                       require_cluster, run_state, run_statuses)
from tfcluster.commands import overview, run_status, spend
from tfcluster.commands.runs import report_preemptions, stop_active_run
from tfcluster.commands.tune_plans import read_book
from tfcluster.config import Settings, parse_int
from tfcluster.errors import ClusterError, ConfigError, TfClusterError
from tfcluster.holds import ClusterHold
from tfcluster.state import ClusterState, StateStore


def up(settings: Settings, yes: bool = False) -> ClusterState:
    """``yes``: create without asking. On a terminal a backend whose machines bill asks first
    (the gcp backend, with the hourly cost); without one nothing is asked. One `up` or `down` of a
    cluster at a time (tfcluster/holds.py CommandHold): a second says in one line who holds it."""
    store = StateStore(settings)
    hold = holds.CommandHold(store, "`invoke up`")
    holder = hold.try_acquire()
    if holder is not None:
        raise ClusterError(_held_for_up(store, holder))
    try:
        return _up(settings, store, yes)
    finally:
        hold.release()


def _held_for_up(store: StateStore, holder: holds.Holder) -> str:
    name = store.cluster_name
    if "down" in holder.command:
        return f"cluster '{name}' is being taken down by {holder.describe()}; run `invoke up` again once it is down"
    cluster = store.load_cluster()
    if cluster is not None and cluster.waiting:
        return (f"cluster '{name}' is being made by {holder.describe()}, which waits for "
                f"{cluster.waiting.get('what')}; let it wait, or end it there (Ctrl-C) or with `invoke down`")
    return (f"cluster '{name}' is being made by {holder.describe()}; wait for it to finish (`invoke status` shows "
            "the cluster then)")


def _up(settings: Settings, store: StateStore, yes: bool) -> ClusterState:
    existing = store.load_cluster()
    if existing is not None and existing.status != "up":
        console.print(f"Resuming the unfinished `up` of cluster '{existing.name}'...")
        existing = None
    if existing is not None:
        if existing.backend != settings.backend or existing.workers != settings.workers:
            raise ClusterError(
                f"cluster '{existing.name}' is already up with {existing.workers} {existing.backend} "
                f"workers; run `invoke down` first to recreate it with {settings.workers} "
                f"{settings.backend} workers")
        backend = backend_named(existing.backend, store)
        backend.refresh(existing, settings)
        store.save_cluster(existing)  # Addresses and host keys may have changed.
        spend.sync(store, backend, existing, settings, own=ledger.START)
        console.print(f"Cluster [bold]{existing.name}[/] is already up: {existing.workers} "
                      f"{existing.backend} workers. Nothing re-created.")
        _pre_pull(store, backend, existing, settings.image)
        return existing
    with console.status(f"Creating {settings.backend} cluster '{settings.cluster}' "
                        f"with {settings.workers} workers...") as creating:
        backend = backend_named(settings.backend, store)
        if not yes and sys.stdin.isatty() and console.is_terminal:
            backend.confirm = lambda question: _ask(creating, question)
        cluster = backend.up(settings, None)
        store.save_cluster(cluster)
        spend.sync(store, backend_named(cluster.backend, store), cluster, settings, own=ledger.START)
    console.print(f"[green]✓[/] Cluster [bold]{cluster.name}[/] is up: {cluster.workers} "
                  f"{cluster.backend} workers ({', '.join(h.endpoint for h in cluster.hosts)}).")
    _pre_pull(store, backend_named(cluster.backend, store), cluster, settings.image)
    console.print("  Next: invoke train --workers N   (state: "
                  f"{store.cluster_file})")
    return cluster


def _ask(spinner, question: str) -> bool:
    """A yes/no on the terminal, the spinner paused while it waits."""
    spinner.stop()
    try:
        return Confirm.ask(question, console=console, default=False)
    finally:
        spinner.start()


def _pre_pull(store: StateStore, backend: Backend, cluster: ClusterState, image: str) -> None:
    """With an image configured, pull it on every host now, so the first `train` does not wait."""
    if not image:
        return
    with console.status(f"Pulling {image} on every host..."):
        outcomes = backend.pre_pull(cluster, image)
    cluster.image = image
    store.save_cluster(cluster)
    console.print(f"[green]✓[/] Image {image}: pulled on {outcomes.count('pulled')} host(s), "
                  f"already present on {outcomes.count('present')}.")


def status(settings: Settings, every: bool = False) -> dict | list:
    """The cluster, its workers and its current or last run; ``every``: one row per cluster instead."""
    if every:
        return overview.status_all(settings)
    store = StateStore(settings)
    cluster = require_cluster(store)
    backend = backend_for_cluster(store, cluster)
    # Probed first and all at once: a host that does not answer is then known to be gone, and
    # every later look at it this command makes fails at once instead of waiting again.
    reachable = backend.reachability(cluster) if cluster.status == "up" else {}
    table = ui.table(f"Cluster {cluster.name} ({cluster.backend}), up since {ui.when(cluster.created_at)}",
                     ["worker", "task", "TF endpoint"] + (["host"] if reachable else []))
    for index, host in enumerate(cluster.hosts):
        task_type, task_index = tfconfig.task_of(index)
        answer = [f"[red]{reachable[host.name]}[/]" if reachable.get(host.name) else "ok"] if reachable else []
        table.add_row(f"[{ui.worker_colour(index)}]{host.name}[/]", f"{task_type}:{task_index}", host.endpoint,
                      *answer)
    ui.show(table)
    if cluster.waiting:  # An `up` waiting for capacity (tfcluster/backends/gcp/zones/capacity.py).
        console.print(overview.waiting_line(cluster.waiting))
    holder = holds.cluster_holder(store)
    if holder is not None and holder.command in ("`invoke up`", "`invoke down`"):  # A run's launcher shows below.
        console.print(f"Held by {holder.describe()}: other `up` and `down` of this cluster wait or say so.",
                      highlight=False)
    rows = backend.vm_rows(cluster, settings) if cluster.status == "up" else []
    if rows:
        vms = ui.table("VMs", ["VM", "state", "capacity", "uptime", "cost so far"])
        for row in rows:
            vms.add_row(row.name, row.status, row.capacity or "-", ui.duration(row.uptime_seconds),
                        f"${row.cost_so_far:.2f}")
        ui.show(vms)
    if cluster.status == "up":
        spend.print_status(store, backend, cluster, settings)
    _print_watchdog(backend, cluster)
    run = store.latest_run()
    if run is None:
        console.print("No run yet. Start one with: invoke train")
        return {"cluster": cluster.name, "run": None}
    return run_status.print_run(store, cluster, backend, run, rows)


def _print_watchdog(backend: Backend, cluster: ClusterState) -> None:
    """Per host: busy or idle, idle for how long, when the watchdog acts, the hypervisor deadline."""
    try:
        statuses = backend.watchdog_status(cluster)
        if not statuses:
            return  # This backend has no watchdog.
        deadlines = backend.hypervisor_deadlines(cluster)
    except TfClusterError as error:
        console.print(f"[yellow]Watchdog status unavailable: {error}[/]")
        return
    table = ui.table("Idle shutdown", ["worker", "now", "idle for", "watchdog acts", "hypervisor deadline"])
    now = time.time()
    for record in cluster.hosts:
        status = statuses.get(record.name)
        deadline = deadlines.get(record.name)
        deadline_text = "none (own host)" if deadline is None and cluster.backend == "ssh" else (
            f"{ui.when(deadline)} (in {ui.duration(deadline - now)})" if deadline else "-")
        if status is None:
            table.add_row(record.name, "no watchdog", "-", "-", deadline_text)
            continue
        state = "busy" if status.get("busy") else "idle"
        if not status.get("idle_minutes"):
            acts = "off (`invoke idle --minutes N` turns it on)"
        elif status.get("acts_at"):
            acts = f"{status.get('action')} at {ui.when(status['acts_at'])} (in {ui.duration(status['acts_at'] - now)})"
        else:
            acts = f"{status.get('action')} after {status.get('idle_minutes'):g} idle min"
        table.add_row(record.name, state, ui.duration(status.get("idle_seconds", 0)), acts, deadline_text)
    ui.show(table)
    for record in cluster.hosts:
        refused = (statuses.get(record.name) or {}).get("refused")
        if refused:  # The VM halted instead of deleting itself: its disk still bills until `down`.
            console.print(f"[yellow]![/] {record.name}: the watchdog's {refused}; its disk bills until "
                          "`invoke down`", markup=True, highlight=False, soft_wrap=True)


def idle(settings: Settings, minutes: int | None, off: bool) -> int:
    """Change the idle watchdog on a live cluster; returns the new idle minutes (0 = off)."""
    if off == (minutes is not None):
        raise ConfigError("give exactly one of --minutes N or --off")
    value = 0 if off else parse_int("minutes", minutes, 1)
    if value > 1440:
        raise ConfigError(f"minutes must be between 1 and 1440 (got {value})")
    store = StateStore(settings)
    cluster = require_cluster(store)
    backend = backend_for_cluster(store, cluster)
    backend.set_idle(cluster, value, settings.idle_action)
    if value:
        console.print(f"[green]✓[/] The watchdog now {settings.idle_action}s each machine after {value} idle "
                      "minutes (from its next poll, within 60 s).")
    else:
        console.print("[yellow]Idle watchdog off[/] until the next `invoke up`; the hypervisor deadline "
                      "(gcp) and `invoke down` still stop the spending.")
    return value


def down(settings: Settings, keep: bool = False, delete_bucket: bool = False, force: bool = False) -> None:
    """Stop the run, end every process of the cluster, remove what it created. An own host that cannot
    be reached keeps the cluster's record (exit 2: run it again when the host is back); ``force``
    forgets the cluster anyway, naming what stays on each such host."""
    store = StateStore(settings)
    cluster = store.load_cluster()
    if cluster is None and holds.command_holder(store) is None:  # No record, and no `up` making one.
        others = overview.named(settings)
        if others:  # A typo, or a cluster made under another name: never "nothing to do" while others bill.
            raise ClusterError(f"no cluster '{settings.cluster}' in {store.root}; the clusters there are {others}: "
                               "take one down with --cluster NAME")
        console.print(f"Cluster '{settings.cluster}' is not up. Nothing to do.")
        return
    command = holds.CommandHold(store, "`invoke down`")
    _hold_for_down(store, command)
    try:
        cluster = store.load_cluster()
        if cluster is None:  # The `up` this one waited for failed before it recorded anything.
            console.print(f"Cluster '{settings.cluster}' is not up. Nothing to do.")
            return
        _down_held(settings, store, cluster, keep, delete_bucket, force)
    finally:
        command.release()


def _hold_for_down(store: StateStore, command: holds.CommandHold) -> None:
    """Take the cluster from any `up` of it: one waiting for capacity is asked to stop at once
    (holds.end_waiting_up), another is waited for; a second `down` says who is at it already."""
    announced = False
    while (holder := command.try_acquire()) is not None:
        if "down" in holder.command:
            raise ClusterError(f"cluster '{store.cluster_name}' is already being taken down by {holder.describe()}; "
                               "it finishes the job (`invoke status` says when the cluster is gone)")
        current = store.load_cluster()
        if current is not None and current.waiting and holds.end_waiting_up(store, current.waiting, "`invoke down`"):
            console.print("Cancelled the `invoke up` that waited for capacity.")
            continue
        if not announced:
            console.print(f"Waiting for {holder.describe()} to finish before taking cluster "
                          f"'{store.cluster_name}' down...", highlight=False)
            announced = True
        time.sleep(0.2)


def _down_held(settings: Settings, store: StateStore, cluster: ClusterState, keep: bool, delete_bucket: bool,
               force: bool) -> None:
    if holds.end_waiting_up(store, cluster.waiting, "`invoke down`"):  # It removed what it made, and left.
        console.print("Cancelled the `invoke up` that waited for capacity.")
        cluster = store.load_cluster() or cluster
    backend = backend_for_cluster(store, cluster)
    gone = {}
    if backend.hosts_outlive_cluster and cluster.hosts:
        gone = {name: why for name, why in backend.reachability(cluster).items() if why}
    stop_active_run(settings, store, cluster, backend, "`invoke down`")
    # No launcher of the cluster may start anything from here on: wait for every one to exit (a run
    # still staging sees the stop too), and hold the cluster until it is gone.
    hold = ClusterHold(store)
    try:
        end_launchers(store, hold.try_acquire, "`invoke down`")
        _tear_down(settings, store, cluster, backend, gone, keep, delete_bucket, force)
    finally:
        hold.release()


def _tear_down(settings: Settings, store: StateStore, cluster: ClusterState, backend: Backend, gone: dict,
               keep: bool, delete_bucket: bool, force: bool) -> None:
    reachable = dataclasses.replace(cluster, hosts=[h for h in cluster.hosts if h.name not in gone])
    leftovers = backend.leftover_processes(reachable)
    if leftovers:
        backend.kill_leftovers(reachable)
        deadline = time.monotonic() + 10
        while leftovers and time.monotonic() < deadline:
            time.sleep(0.1)
            leftovers = backend.leftover_processes(reachable)
    if leftovers:
        raise ClusterError(f"could not end {len(leftovers)} process(es) of cluster '{cluster.name}': "
                           f"{'; '.join(leftovers)}; kill them by hand, then run `invoke down` again")
    _remove_containers(backend, reachable)
    spend.sync(store, backend, cluster, settings)  # The last starts and stops, while Compute still lists the VMs.
    backend.teardown(reachable, keep, delete_bucket)
    for record in cluster.hosts:
        if record.name in gone:
            _print_left_on_host(cluster, record, gone[record.name])
    changed = [f"{record.name} ({record.address})" for record in cluster.hosts
               if "host key CHANGED" in gone.get(record.name, "")]  # tfcluster/backends/ssh/connection.py
    if changed and not force:  # Waiting cannot help: only the user can say the host was rebuilt.
        raise ClusterError(f"the host key of {', '.join(changed)} CHANGED since `invoke up` pinned it, so tfcluster "
                           f"will not connect there; the hosts it could verify are clean, and cluster '{cluster.name}' "
                           "is kept: if the host was rebuilt, run `invoke down --force` to forget the cluster (what "
                           "may be left on each host is named above)")
    if gone and not force:  # Never forgotten while something of it may run there.
        names = ", ".join(f"{record.name} ({record.address})" for record in cluster.hosts if record.name in gone)
        raise ClusterError(f"could not reach {names}; the hosts that answered are clean, and cluster '{cluster.name}' "
                           "is kept: run `invoke down` again when it answers, or `invoke down --force` to forget the "
                           "cluster (what stays on each host is named above)")
    store.remove_cluster()
    spend.print_final(store, backend, cluster, settings)
    checked = "verified that no worker process is left, nor any container" if not gone else (
        f"verified on the {len(reachable.hosts)} host(s) that answered; {len(gone)} could not be cleaned (above)")
    console.print(f"[green]✓[/] Cluster [bold]{cluster.name}[/] is down: {checked}. "
                  f"Run results stay in {store.runs_dir}.")


def _print_left_on_host(cluster: ClusterState, record, why: str) -> None:
    marker = f"TFCLUSTER_CLUSTER_ID={cluster.cluster_id}"
    cleanup = (f"grep -l -a -x -z {marker} /proc/[0-9]*/environ | cut -d/ -f3 | xargs -r kill -9; "
               f"rm -rf {shlex.quote(record.remote_root)}")
    console.print(f"[yellow]![/] could not clean {record.name} ({record.address}): {why}. Its run folder "
                  f"and any process of cluster '{cluster.name}' stay there; when it is back, run there: "
                  f"{cleanup}", soft_wrap=True)


def _remove_containers(backend: Backend, cluster: ClusterState) -> None:
    """`docker rm --force` any container labelled with the cluster id, then prove none is left."""
    if any(backend.leftover_containers(cluster).values()):
        backend.remove_containers(cluster)
    left = {host: names for host, names in backend.leftover_containers(cluster).items() if names}
    if left:
        listed = "; ".join(f"{host}: {', '.join(names)}" for host, names in left.items())
        raise ClusterError(f"containers of cluster '{cluster.name}' are still there ({listed}); remove "
                           "them with `docker rm --force NAME`, then run `invoke down` again")
