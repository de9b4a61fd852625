"""A run after it started: logs (re-attaching with --follow) and stop."""

from __future__ import annotations

import time
from types import SimpleNamespace

from tfcluster import holds, launch, runners, ui
from tfcluster.backends import Backend
from tfcluster.commands.common import (active_run, backend_for_cluster, console, end_launchers, plans_for,
                                       require_cluster, run_or_latest, run_state, stop_processes)
from tfcluster.commands import run_view
from tfcluster.commands.attempts import clock
from tfcluster.commands.tune_plans import attempt_of
from tfcluster.config import Settings, parse_int
from tfcluster.errors import ClusterError, ConfigError
from tfcluster.state import StateStore
from trainer import events


class _Printer:
    """A run's log lines on the console: as `train` shows them (commands/run_view.py), or, ``raw``, every
    line as the log has it (TensorFlow's noise and the events' JSON too)."""

    def __init__(self, plans: list, raw: bool):
        self.raw, self.view, self.progress = raw, run_view.RunView(plans), launch.Progress()

    def show(self, plan, line: str) -> None:
        event = None if self.raw else events.parse(line)
        if self.raw:
            console.print(ui.prefixed(plan.index, plan.name, line), soft_wrap=True, markup=False, highlight=False)
        elif event is None:
            self.view.line(plan, line)
        else:
            self.progress.update(plan.index, event, 1)
            self.view.event(plan, event, self.progress.pace)

    def poll(self, follower: launch.LogFollower, flush: bool = False) -> None:
        for plan, line in follower.poll(flush):
            self.show(plan, line)


def logs(settings: Settings, worker: int | None, follow: bool, run_id: str | None = None, raw: bool = False) -> str:
    """``raw``: every line as the logs hold it; else what `train` shows."""
    store = StateStore(settings)
    run = run_or_latest(store, run_id)
    selected = None
    if worker is not None:
        selected = parse_int("worker", worker, 0)
        if selected >= run.workers:
            raise ConfigError(f"worker must be between 0 and {run.workers - 1} for run {run.run_id} "
                              f"(got {selected})")
    cluster = store.load_cluster()
    if cluster is None:
        if follow:
            raise ClusterError(f"cluster '{settings.cluster}' is down; run `invoke logs` without --follow")
        # The cluster is gone but the run folder stays: read the local copies.
        workers = [SimpleNamespace(index=index, name=f"worker-{index}") for index in range(run.workers)
                   if selected is None or index == selected]
        printer = _Printer(workers, raw)
        for plan in workers:
            path = store.run_dir(run.run_id) / f"{plan.name}.log"
            for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
                printer.show(plan, line)
        printer.view.finish(workers)
        return run.outcome or "unknown"

    backend = backend_for_cluster(store, cluster)
    plans = plans_for(store, cluster, run, backend=backend)
    shown = [plan for plan in plans if selected is None or plan.index == selected]
    follower, printer = launch.LogFollower(shown), _Printer(shown, raw)
    attempt = max(run.attempts, 1)
    checked = 0.0
    while True:
        printer.poll(follower)
        current = store.load_run(run.run_id) or run
        statuses = [launch.worker_status(plan, attempt_of(current, plan)) for plan in plans]
        state = run_state(current, statuses)
        if follow and current.outcome is None and time.monotonic() - checked > PREEMPTION_CHECK_SECONDS and any(
                status.state == launch.LOST for status in statuses):
            # A worker's machine went away: if Google preempted it and no launcher took it in hand
            # (the launcher records each preemption at once), say so and how to resume.
            checked = time.monotonic()
            if report_preemptions(backend, cluster, current):
                return "preempted"
        if not follow or (state != "running" and current.attempts == attempt):
            printer.poll(follower, flush=True)
            printer.view.finish(shown)
            if follow:
                console.print(f"Run {run.run_id} {state}.")
            return state
        attempt = current.attempts  # A retry started: follow the new attempt.
        time.sleep(launch.POLL_SECONDS)


# `logs --follow` asks the Compute API at most this often while a worker is lost.
PREEMPTION_CHECK_SECONDS = 10.0


def report_preemptions(backend: Backend, cluster, run) -> bool:
    """Print each preemption of ``run`` that no launcher handles, with the resume command."""
    # A launcher still running the run has each preemption it handles in the record already.
    handled = {(p["instance"], round(p["at"])) for p in run.summary.get("preemptions", [])} \
        if run.outcome is None else set()
    taken = [p for p in backend.preemptions(cluster, run.started_at) if (p.instance, round(p.at)) not in handled]
    for item in taken:
        console.print(f"[bold yellow]{item.worker} ({item.address}) was preempted by Google at {clock(item.at)}; "
                      f"its VM is stopped (its disk bills until `invoke down`).[/]", soft_wrap=True)
    if taken:
        console.print(f"No launcher is restarting {'them' if len(taken) > 1 else 'it'}. Resume the same run "
                      f"with: invoke train --resume {run.run_id}", soft_wrap=True)
    return bool(taken)


def stop(settings: Settings) -> str | None:
    store = StateStore(settings)
    cluster = require_cluster(store)
    stopped = stop_active_run(settings, store, cluster, backend_for_cluster(store, cluster), "`invoke stop`")
    if stopped is None:
        console.print("No run is active.")
    return stopped


def stop_active_run(settings: Settings, store: StateStore, cluster, backend: Backend, by: str) -> str | None:
    """Stop the cluster's active run, if any, through ``backend`` (whose connections know which hosts
    are gone already), and return once its launcher, if one is attached, has exited: the stop is
    recorded first (``by``), so that launcher sees its workers end as a stop, never retries, and
    records the run as stopped."""
    active = active_run(store, cluster, backend)
    if active is None:
        return None
    run, plans = active
    attached = holds.live_launchers(store)  # Before the request: it lets go as soon as it sees it.
    holds.request_stop(store, run.run_id, by)
    with console.status(f"Stopping run {run.run_id}..."):
        if not runners.cancel_job(backend, cluster, run):  # A cloud job is cancelled; processes stopped.
            stop_processes(plans, run, settings.stop_grace_seconds)
    launchers = end_launchers(store, lambda: holds.attached_launcher(store, run.run_id) is None, by, attached)
    current = store.load_run(run.run_id) or run
    if current.outcome is None:  # No launcher recorded it.
        current.outcome, current.ended_at = "stopped", time.time()
        current.summary = {**current.summary, "stopped_by": by}
        store.save_run(current)
    exited = f"; its launcher (pid {', '.join(map(str, launchers))}) exited" if launchers else ""
    console.print(f"[green]✓[/] Run {run.run_id} stopped; no worker is left running{exited}.")
    return run.run_id
