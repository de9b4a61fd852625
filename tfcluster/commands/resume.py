"""`train --resume RUN`: a run brought back (after a preemption while no launcher ran, or a stop):
what is left of it stopped, its stopped or announced VMs started again (moved zones: restaged), and
the same run resumed from its backup as its next attempt, under a launcher lease like any run."""

from __future__ import annotations

import json
import time

from tfcluster import container, holds, launch, stall
from tfcluster.commands import requirements as script_requirements, restage
from tfcluster.commands.attempts import clock, run_attempts
from tfcluster.commands.common import active_run, backend_for_cluster, console, plans_for, require_up_cluster, stop_processes
from tfcluster.commands.train import LAUNCH_FILE, stall_limit
from tfcluster.config import Settings, parse_int
from tfcluster.errors import ClusterError, ConfigError
from tfcluster.state import ClusterState, RunRecord, StateStore


def resume(settings: Settings, run_id: str, retries: int | None = None, verbose: bool = False,
           stall_minutes: int | None = None) -> RunRecord:
    """`train --resume RUN`: stop what is left of the run, start its preempted VMs again and
    resume the same run from its backup, as the next attempt."""
    limit = stall_limit(stall_minutes)
    store = StateStore(settings)
    cluster = require_up_cluster(store)
    run = store.load_run(run_id)
    if run is None:
        raise ConfigError(f"no run {run_id} on cluster '{cluster.name}'; see the run ids with `invoke status`")
    if run.outcome == "succeeded":
        raise ConfigError(f"run {run_id} already succeeded; start a new one with `invoke train`")
    launch_file = store.run_dir(run_id) / LAUNCH_FILE
    if not launch_file.exists():
        raise ConfigError(f"run {run_id} was started by an older tfcluster and cannot be resumed; start a "
                          "new one with `invoke train`")
    backend = backend_for_cluster(store, cluster)
    taken = backend.preemptions(cluster, run.started_at)
    active = active_run(store, cluster, backend)
    if active is not None and not taken:
        raise ClusterError(f"run {active[0].run_id} is still running; follow it with `invoke logs --follow`")
    with holds.LauncherLease(store, run_id, "`invoke train --resume`"):
        holds.clear_stop_request(store, run_id)  # A run stopped before is resumed on purpose.
        return _resume(settings, store, backend, cluster, run, taken, retries, verbose, limit)


def _resume(settings: Settings, store: StateStore, backend, cluster: ClusterState, run: RunRecord, taken: list,
            retries: int | None, verbose: bool, limit: stall.StallLimit) -> RunRecord:
    run_id = run.run_id
    launch_file = store.run_dir(run_id) / LAUNCH_FILE
    with console.status(f"Stopping what is left of run {run_id}..."):
        stop_processes(plans_for(store, cluster, run, backend=backend), run, settings.stop_grace_seconds)
    noticed, zone, made = time.time(), cluster.zone, cluster.vms_made_at
    for item in taken:
        console.print(f"[yellow]{item.worker} ({item.address}) was preempted by Google at "
                      f"{clock(item.at)}; starting its VM again[/]", soft_wrap=True)
    if taken:
        backend.restart_preempted(cluster, settings)
        store.save_cluster(cluster)
    # Host maintenance announced while no launcher ran: the workers exited 143; resuming on the same
    # hosts would end the same way, so those VMs move first (tfcluster/commands/maintenance.py).
    announced = backend.maintenance_notices(cluster, backend.hosts(cluster)[: run.workers])
    for index, event in sorted(announced.items()):
        console.print(f"[yellow]{cluster.hosts[index].name}: Google announced host maintenance ({event}); "
                      "stopping and starting its VM[/]", soft_wrap=True)
    if announced:
        backend.restart_for_maintenance(cluster, settings, sorted(announced))
        store.save_cluster(cluster)
    if cluster.zone != zone or cluster.vms_made_at != made:  # New VMs (a zone move, --capacity auto): code again.
        restage.restage(store, backend, cluster, run)
    launched = json.loads(launch_file.read_text())
    wanted = script_requirements.from_saved(launched.get("requirements"))
    if wanted is not None:  # Each host's marker makes this nothing but on VMs made anew.
        for line in script_requirements.install(wanted, backend.hosts(cluster)[: run.workers],
                                                launched["payload"]["python"], str(store.root),
                                                shared_interpreter=cluster.backend == "local"):
            console.print(f"Requirements on {line}", soft_wrap=True, markup=False)
    env = launched["env"]
    image = container.ContainerSpec(run.image, run.mounts) if run.image else None
    plans = launch.build_plans(backend.hosts(cluster)[: run.workers], run.run_id, run.command, env, image)
    more = settings.retries if retries is None else parse_int("retries", retries, 0)
    first = run.attempts + 1
    run.retries, run.outcome, run.ended_at = run.attempts + more, None, None
    backend.set_stall_minutes(cluster, limit.minutes)
    console.print(f"Resuming run {run_id} as attempt {first}, from its backup.")
    earlier = list(run.summary.get("preemptions", []))
    for item in taken:
        if not any(e["instance"] == item.instance and abs(e["at"] - item.at) < 1 for e in earlier):
            earlier.append({"worker": item.worker, "instance": item.instance, "address": item.address,
                            "at": item.at, "attempt": run.attempts, "noticed_at": noticed,
                            "restarted_at": time.time()})
    return run_attempts(settings, store, backend, run, plans, verbose=verbose, first_attempt=first,
                        earlier=earlier, stall_limit=limit)
