"""The run part of `status`: each worker's state and its last step with its age, the run's images/s,
ETA and cost so far (read from the workers' logs, launcher or not), then what the run left."""

from __future__ import annotations

import time

from tfcluster import launch, ledger, pace, ui
from tfcluster.commands.common import console, run_state, run_statuses
from tfcluster.commands.runs import report_preemptions
from tfcluster.commands.tune_plans import read_book
from tfcluster.errors import TfClusterError
from trainer import events as event_lines

# The end of a worker's log that `status` reads for its last steps (the trainer writes about ten step
# events an epoch, and TensorFlow's lines between them).
TAIL_BYTES = 256 * 1024


def print_run(store, cluster, backend, run, rows) -> dict:
    """``rows``: the cluster's VM rows (gcp), to tell a run its VMs halted at its end."""
    pairs = run_statuses(store, cluster, run, backend)
    state = run_state(run, [s for _, s in pairs])
    colour = {"running": "yellow", "succeeded": "green"}.get(state, "red")
    table = ui.table(f"Run {run.run_id}: [{colour}]{state}[/], attempt {run.attempts} of "
                     f"{run.retries + 1}, started {ui.when(run.started_at)}",
                     ["worker", "state", "pid", "exit code", "last step", "age"])
    now = time.time()
    recent = {plan.index: recent_events(plan) for plan, _ in pairs} if run.kind == "train" else {}
    for plan, worker in pairs:
        # A stopped run's workers were ended on purpose: not "lost", not "failed".
        shown = "stopped" if state == "stopped" and worker.state in (launch.LOST, launch.FAILED) else worker.state
        where = pace.of_events(recent.get(plan.index, []))
        table.add_row(f"[{ui.worker_colour(plan.index)}]{plan.name}[/]", shown,
                      str(worker.pid or "-"), "-" if worker.exit_code is None else str(worker.exit_code),
                      where.position() or "-", f"{ui.duration(now - where.last_at)} ago" if where.last_at else "-")
    ui.show(table)
    chief = pace.of_events(recent.get(0, []))
    if chief.started:
        running = state == "running"
        console.print(f"{'now' if running else 'last'}: {chief.line(eta=running)}", soft_wrap=True, markup=False)
    if cluster.status == "up":
        cost = ledger.run_figures(store.root, cluster.name, run).words()
        console.print(f"run cost{' so far' if state == 'running' else ''}: {cost}", soft_wrap=True, markup=False)
    if run.summary.get("stopped_by"):
        console.print(f"stopped by {run.summary['stopped_by']}", soft_wrap=True, markup=False)
    if state != "succeeded" and run.kind == "train":
        report_preemptions(backend, cluster, run)
    if run.outcome is None and run.summary.get("then") and rows and all(row.status == "TERMINATED" for row in rows):
        # The launcher was gone when the run ended: each VM's watchdog halted it (--then).
        follow = "remove the cluster with `invoke down`, as --then down asked" if run.summary["then"] == "down" \
            else "`invoke up` starts them again, `invoke down` removes the cluster"
        console.print(f"[yellow]Run {run.run_id} ended while no launcher ran; each VM halted itself "
                      f"(--then {run.summary['then']}): {follow}.[/]", soft_wrap=True)
    if run.kind == "tune":
        book = read_book([plan for plan, _ in pairs])
        console.print(f"trials: {book.progress()}" + (f" (of {book.max_trials})" if book.max_trials else ""))
    if run.summary.get("metrics"):
        console.print("final metrics: " + ui.format_metrics(run.summary["metrics"]))
    if run.summary.get("keras_path"):
        console.print(f"model: {run.summary['keras_path']}")
    return {"cluster": cluster.name, "run": run.run_id, "state": state,
            "workers": {plan.name: worker.state for plan, worker in pairs}}




def recent_events(plan: launch.WorkerPlan) -> list[dict]:
    """The events in the end of a worker's log ([] when it cannot be read: `status` goes on)."""
    try:
        size = plan.host.file_size(plan.log_path)
        raw = plan.host.read_file(plan.log_path, max(0, size - TAIL_BYTES)) or b""
    except TfClusterError:
        return []
    found = (event_lines.parse(line) for line in raw.decode(errors="replace").splitlines())
    return [event for event in found if event]
