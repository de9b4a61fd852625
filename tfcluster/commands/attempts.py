"""The attempt loop of a run: start, follow with a live console, fail fast, retry, summarise."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from rich.markup import escape
from rich.status import Status

from tfcluster import holds, launch, ledger, runners, stall, tflog, throughput, ui
from tfcluster.commands import maintenance, restage, run_summary, run_view, spend, stall_report
from tfcluster.commands.common import console
from tfcluster.config import Settings
from tfcluster.backends.base import Preemption
from tfcluster.errors import TfClusterError, TrainingFailed
from tfcluster.state import RunRecord, StateStore


def clock(at: float) -> str:
    """A time of day on this machine's clock, as the console shows a preemption."""
    return time.strftime("%H:%M", time.localtime(at))


def run_attempts(settings: Settings, store: StateStore, backend, run: RunRecord,
                 plans: list[launch.WorkerPlan], verbose: bool = False, first_attempt: int = 1,
                 earlier: list[dict] | None = None, stall_limit: stall.StallLimit | None = None,
                 budget=None) -> RunRecord:
    """``verbose`` prints every worker line; otherwise TensorFlow's known noise is folded.
    ``first_attempt`` > 1 continues a run (`train --resume`); ``earlier``: its preemptions so far.
    ``stall_limit``: when an attempt counts as stalled (tfcluster/stall.py; default: its defaults).
    ``budget``: the run's --budget (tfcluster/commands/budget.py RunBudget), or None."""
    stall_limit = stall_limit or stall.StallLimit()
    stalls: list[dict] = []  # Each stall handled, for run.json.
    progress = launch.Progress()
    cause: str | None = None  # A known failure's cause and fix, from the failed workers' logs.
    started = time.time()
    failure: launch.AttemptResult | None = None
    # Ctrl-C sets a flag that the follow loop checks each tick, instead of raising
    # KeyboardInterrupt wherever the main thread happens to be (a lock, a thread pool).
    interrupted = threading.Event()
    previous_handler = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.set())
    # Each preemption, for run.json and the summary (the same list as progress.preemptions).
    preempted = progress.preemptions = list(earlier or [])
    progress.maintenance = list(run.summary.get("maintenance", []))  # A resumed run's earlier notices.
    lost: Preemptions | None = None  # The last attempt's preemptions, when that is how it ended.
    # A stop the user asked for (`stop`, `down` from another shell; the budget's end time halting the
    # VMs): written before any worker is signalled, so a failure seen after it is that stop, never retried.
    stopped_by = lambda: user_stop(store, run, budget)  # noqa: E731
    runner = runners.HostRunner(plans)  # Each attempt's: processes on the hosts, or a cloud job.
    try:
        for attempt in range(first_attempt, run.retries + 2):
            if stopped_by():
                break
            run.attempts = attempt
            store.save_run(run)
            if attempt > 1:
                console.print(f"[yellow]↻ Retrying: attempt {attempt} of {run.retries + 1}, "
                              "resuming from the last checkpoint[/]")
                backend.before_retry([plan.host for plan in plans], run.run_id)
            attempt_started = time.time()
            runner = runners.runner_for(backend, store.load_cluster(), run.run_id, plans, run.image,
                                        lambda text: console.print(f"[dim]{backend.name}: {text}[/]", soft_wrap=True))
            try:
                failure = _one_attempt(settings, runner, plans, attempt, progress,
                                       lambda: interrupted.is_set() or bool(budget and budget.refusal)
                                       or stopped_by() is not None, verbose, stall_limit, budget)
            except TfClusterError:  # The attempt could not start (a cloud job refused): the run ends here.
                _finish(settings, store, run, "failed", progress, started)
                raise
            if failure is None or failure.interrupted or stopped_by():
                break
            if failure.stall is not None:
                stalls.append(stall_report.report(failure.stall, plans, attempt))
                run.summary = {**run.summary, "stalls": list(stalls)}
                runner.stop(attempt, settings.stop_grace_seconds)
                continue
            # A worker lost with its machine, or its peers failing because of it: ask the cloud
            # whether it took a machine back before treating this as the program's failure.
            lost = Preemptions(_preemptions(backend, store, attempt_started - CLOCK_SLACK_SECONDS))
            if lost.found:
                plans = _recover(settings, store, backend, run, plans, lost, attempt, preempted, started, progress)
                if plans is None:
                    break
                continue
            lost = None
            notices = maintenance.announced(backend, store, failure, plans)
            if notices:  # Retried on moved VMs, or TrainingFailed once the run is recorded as failed.
                maintenance.report(settings, store, run, plans, notices, attempt, progress,
                                   lambda: _finish(settings, store, run, "failed", progress, started))
                plans = _bring_back(settings, store, backend, run, plans, attempt, progress.maintenance, progress,
                                    started, lambda cluster: backend.restart_for_maintenance(cluster, settings,
                                                                                            sorted(notices)),
                                    "Stopping and starting the announced VMs...")
                continue
            cause = _report_failure(failure, plans, verbose)
            runner.stop(attempt, settings.stop_grace_seconds)
            if interrupted.is_set():
                break
        if budget is not None and budget.refusal and not interrupted.is_set():
            console.print("[yellow]Over --budget: stopping every worker (its backup stays)...[/]")
            runner.stop(run.attempts, settings.stop_grace_seconds)
            _finish(settings, store, run, "stopped", progress, started)
            raise TfClusterError(budget.refusal)  # Exit 2: the run is refused, not failed.
        if interrupted.is_set():
            console.print("\n[yellow]Interrupted: stopping every worker...[/]")
            runner.stop(run.attempts, settings.stop_grace_seconds)
            _finish(settings, store, run, "stopped", progress, started)
            raise TrainingFailed(f"run {run.run_id} stopped by Ctrl-C; no worker is left running")
        who = stopped_by()
        if who is not None:  # Its workers are being stopped by whoever asked; make sure, then say who.
            runner.stop(run.attempts, settings.stop_grace_seconds)
            run.summary = {**run.summary, "stopped_by": who}
            _finish(settings, store, run, "stopped", progress, started)
            raise TrainingFailed(f"run {run.run_id} was stopped by {who}; it is not retried, and no worker "
                                 "is left running")
    finally:
        signal.signal(signal.SIGINT, previous_handler)

    outcome = "succeeded" if failure is None else "failed"
    if lost is not None and lost.found and failure is not None:
        # Preempted on the last attempt allowed: say so, not the survivors' collective errors.
        _finish(settings, store, run, "failed", progress, started)
        raise TrainingFailed(f"run {run.run_id} failed: {lost.describe()} was preempted by Google and no retry "
                             f"is left (--retries {run.retries} counts preemptions too); no worker process is "
                             f"left running; the VM(s) stay stopped and their disks bill until `invoke down`; "
                             f"resume it with `invoke train --resume {run.run_id}`")
    with console.status("Collecting logs and results..."):
        local_model = backend.collect([plan.host for plan in plans], run.run_id,
                                      store.run_dir(run.run_id), failure is None)
    if local_model and progress.model_dir and progress.model_dir != local_model:
        # Fetched from the chief's host: point the summary at the local copy.
        for name in ("keras_path", "saved_model_path"):
            remote = getattr(progress, name)
            if remote:
                setattr(progress, name, remote.replace(progress.model_dir, local_model, 1))
        progress.model_dir = local_model
    if local_model and not (progress.keras_path or progress.saved_model_path):  # A script, which says nothing.
        progress.keras_path, progress.saved_model_path = run_summary.saved_in(Path(local_model))
    if progress.replicas_in_sync is None and plans:  # A script reports none: the layout its TF_CONFIG gave it.
        progress.replicas_in_sync = int(plans[0].env.get("TFCLUSTER_REPLICAS") or 0) or None
    _finish(settings, store, run, outcome, progress, started)
    if stalls:
        run.summary["stalls"] = stalls
        store.save_run(run)
    tensorboard = throughput.write_tensorboard(
        store.run_dir(run.run_id) / "output" / "tensorboard" / "throughput",
        throughput.tensorboard_scalars(run.summary["throughput"], run.summary["scaling"]))
    if tensorboard is not None:
        tensorboard = _publish_throughput(store, backend, run, tensorboard)
    run_summary.print_summary(run, progress, time.time() - started, tensorboard,
                              spend.run_cost(store, backend, settings, run))
    if failure is not None and failure.stall is not None:
        hung = plans[failure.stall.worker]
        raise TrainingFailed(f"run {run.run_id} failed: it stalled, {hung.name} ({hung.task}) made no progress "
                             f"for {failure.stall.quiet_seconds:.0f} s (limit {failure.stall.limit_seconds:.0f} s) "
                             f"after {run.attempts} attempt(s); every worker's Python stack is in its log, see "
                             f"`invoke logs --worker {hung.index}`; retry with --retries, or raise --stall-minutes "
                             "if it was only slow")
    if failure is not None:
        plan, status = failure.failures[0]
        raise TrainingFailed(f"run {run.run_id} failed: {plan.name} ({plan.task}) {status.describe()}"
                             f" after {run.attempts} attempt(s); "
                             + (f"{cause}; " if cause else "") + f"see `invoke logs --worker {plan.index}`")
    return run


# The cloud's clock and this machine's may differ by some seconds; a preemption recorded a little
# before the attempt's start on this clock still belongs to it.
CLOCK_SLACK_SECONDS = 60.0


def user_stop(store: StateStore, run: RunRecord, budget=None) -> str | None:
    """Who stopped the run, when the user did (None: nobody): `invoke stop` or `invoke down` from
    another shell (their request, tfcluster/state.py), or the run's --budget, whose end time halts
    every VM (each VM's watchdog, tfcluster/commands/budget.py)."""
    request = holds.stop_request(store, run.run_id)
    if request is not None:
        return request.describe()
    if budget is not None and time.time() >= budget.end_time - CLOCK_SLACK_SECONDS / 4:
        return (f"its --budget (${budget.usd:g}): the budget's end time, {clock(budget.end_time)}, came and each "
                "VM halted itself")
    return None


@dataclass
class Preemptions:
    """The preemptions that ended one attempt."""

    # Each preempted worker's machine, as the backend reports it.
    found: list[Preemption]

    def describe(self) -> str:
        return ", ".join(f"{p.worker} ({p.address})" for p in self.found)


def _preemptions(backend, store: StateStore, since: float) -> list[Preemption]:
    """The backend's preemptions since ``since``; none (with a note) when it cannot tell, so the
    failure is then reported as it is."""
    try:
        return backend.preemptions(store.load_cluster(), since)
    except TfClusterError as error:
        console.print(f"[yellow]Could not check for preemptions ({error}).[/]", soft_wrap=True)
        return []


def _recover(settings: Settings, store: StateStore, backend, run: RunRecord, plans: list, lost: Preemptions,
             attempt: int, preempted: list[dict], started: float, progress: launch.Progress) -> list | None:
    """After a preemption: stop the survivors' processes (their VMs stay), start the preempted VMs
    again and return the plans on the machines as they are now; None when no retry is left.
    Raises TrainingFailed, run recorded, when the machines cannot be started."""
    last = attempt == run.retries + 1
    for item in lost.found:
        when = clock(item.at)
        follow = "no retry is left" if last else f"restarting it (attempt {attempt + 1} of {run.retries + 1})"
        console.print(f"[bold yellow]⚡ {item.worker} ({item.address}) was preempted by Google at {when}; "
                      f"{follow}[/]", soft_wrap=True)
        preempted.append({"worker": item.worker, "instance": item.instance, "address": item.address,
                          "at": item.at, "attempt": attempt, "noticed_at": time.time()})
    # Recorded at once: `logs --follow` and `status` in another shell see that a launcher handles it.
    run.summary = {**run.summary, "preemptions": list(preempted)}
    store.save_run(run)
    console.print("[yellow]Stopping the other workers' processes (their VMs keep running)...[/]")
    launch.stop_attempt(plans, attempt, settings.stop_grace_seconds)
    if last:
        return None
    return _bring_back(settings, store, backend, run, plans, attempt, preempted, progress, started,
                       lambda cluster: backend.restart_preempted(cluster, settings))


def _bring_back(settings: Settings, store: StateStore, backend, run: RunRecord, plans: list, attempt: int,
                records: list[dict], progress: launch.Progress, started: float, restart, doing: str | None = None):
    """Start the machines again with ``restart(cluster)`` (preempted, or moved off maintenance),
    mark this attempt's ``records`` restarted, and return the plans on the machines as they are now.
    Raises TrainingFailed, run recorded, when they cannot be started."""
    cluster = store.load_cluster()
    zone, made = cluster.zone, cluster.vms_made_at
    try:
        with console.status(doing) if doing else contextlib.nullcontext():
            restart(cluster)
        store.save_cluster(cluster)  # New external addresses and host keys.
        if cluster.zone != zone or cluster.vms_made_at != made:  # New machines (a zone move, or another
            # provisioning model under --capacity auto): empty disks.
            restage.restage(store, backend, cluster, run)
    except TfClusterError as error:
        _finish(settings, store, run, "failed", progress, started)
        raise TrainingFailed(f"run {run.run_id} failed: {error}; no worker process is left running; resume "
                             f"it later with `invoke train --resume {run.run_id}`") from None
    spend.sync(store, backend, cluster, settings, own=ledger.START, run=run.run_id)  # The halts and starts.
    for item in records:
        if item["attempt"] == attempt:
            item.setdefault("restarted_at", time.time())
            if cluster.zone != zone:
                item.update(moved_from=zone, moved_to=cluster.zone)
    return [dataclasses.replace(plan, host=host) for plan, host in zip(plans, backend.hosts(cluster))]


def _one_attempt(settings: Settings, runner, plans, attempt: int, progress: launch.Progress, should_stop,
                 verbose: bool, stall_limit: stall.StallLimit, budget=None):
    # One live line for the whole attempt (a terminal only: rich draws nothing elsewhere): the workers
    # starting, then from the first step where the run is (tfcluster/pace.py).
    live = Status(f"Starting {len(plans)} workers (attempt {attempt})...", console=console)
    live.start()
    stepping = False
    view = run_view.RunView(plans, verbose, progress.throughput)

    def on_event(plan, event):
        nonlocal stepping
        progress.update(plan.index, event, attempt)
        view.event(plan, event, progress.pace)
        if plan.index != 0:
            return
        note = budget.observe(event) if budget is not None else None
        if note:
            console.print(f"[yellow]{note}[/]", soft_wrap=True)
        if event["event"] in run_view.STEP_EVENTS:
            stepping = True
            live.update(f"Training: {progress.pace.line()}")

    def on_tick(statuses):
        if not stepping:
            running = sum(status.state == launch.RUNNING for status in statuses)
            bars = view.bars_line()  # A script's Keras progress, folded out of the worker lines.
            live.update(f"Attempt {attempt}: {running}/{len(plans)} workers running, "
                        + (bars if bars else "waiting for the first training step..."))

    def on_line(plan, line):
        view.line(plan, line)
        warning = progress.collective.line(plan.index, plan.name, line)  # Once per run (tfcluster/collective.py).
        if warning:
            console.print(f"[bold yellow]! {escape(warning)}[/]", soft_wrap=True, highlight=False)

    follower = runner.follower()
    runner.start(attempt)
    try:
        watch = stall.StallWatch(stall_limit, [plan.index for plan in plans])
        result = launch.follow_attempt(plans, attempt, follower, on_line, on_event, on_tick, should_stop, watch,
                                       lambda: runner.statuses(attempt))
    finally:
        live.stop()
    view.finish(plans)
    return None if result.ok else result


def _report_failure(result: launch.AttemptResult, plans, verbose: bool) -> str | None:
    """Print each failed worker's log tail (without TensorFlow's noise unless verbose) and,
    once, a known cause with its fix; return that cause."""
    causes = []
    for plan, status in result.failures:
        console.print(f"[bold red]✗ {plan.name} ({plan.task} on {plan.host.record.endpoint}) "
                      f"{status.describe()}.[/] Last lines of its log:")
        lines = launch.log_tail(plan, lines=2000)
        for line in (lines if verbose else tflog.without_noise(lines))[-15:]:
            console.print(ui.prefixed(plan.index, plan.name, line), soft_wrap=True)
        keras = "3" if plan.env.get("TF_USE_LEGACY_KERAS") == "0" else "2"
        causes.append(tflog.diagnose(lines, keras))
    cause = next((found for found in causes if found), None)
    if cause:
        console.print(f"[bold yellow]Cause:[/] {cause}", soft_wrap=True)
    console.print("[red]Stopping the other workers (fail fast)...[/]")
    return cause


def _speed(settings: Settings, store: StateStore, run: RunRecord, progress: launch.Progress) -> dict:
    """The learning rate, the configuration, the throughput and (N workers) the scaling efficiency."""
    cluster = store.load_cluster()
    backend = cluster.backend if cluster else settings.backend
    config = throughput.run_config(progress.strategy, backend,
                                   settings.machine_type if backend == "gcp" else "")
    script = run.summary.get("script") or {}  # A script's global batch and rate, read from its code.
    progress.throughput.global_batch = progress.throughput.global_batch or script.get("global_batch")
    figures = progress.throughput.summary()
    scaling = throughput.scaling(run.workers, figures, throughput.reference_run(store, config, run.run_id))
    return {"learning_rate": progress.strategy.get("learning_rate") or script.get("learning_rate"), "config": config,
            "throughput": figures, "scaling": scaling}


def _finish(settings: Settings, store, run: RunRecord, outcome: str, progress: launch.Progress,
            started: float) -> None:
    run.outcome = outcome
    run.ended_at = time.time()
    run.summary = {
        "replicas_in_sync": progress.replicas_in_sync,
        "epochs": progress.epochs,
        "last_epoch": progress.last_epoch,
        "resumed_at": {str(k): v for k, v in progress.resumed_at.items()},
        "metrics": progress.metrics,
        "model_dir": progress.model_dir,
        "keras_path": progress.keras_path,
        "saved_model_path": progress.saved_model_path,
        "signatures": progress.signatures,
        "chance": progress.chance,
        "first_step_at": progress.first_step_at,
        "scratch_dirs": {str(k): v for k, v in progress.scratch_dirs.items()},
        "scratch_removed": progress.scratch_removed,
        "wall_seconds": round(run.ended_at - started, 2),
        "preemptions": list(progress.preemptions),
        "maintenance": list(progress.maintenance),
        "redone_seconds": _redone(progress),
        "collective": progress.collective.describe(progress.strategy),
        **_speed(settings, store, run, progress),
        # What the launcher's caller recorded before: --then, and who stopped the run.
        **{key: run.summary[key] for key in ("then", "stopped_by", "script") if key in run.summary},
    }
    store.save_run(run)


def _redone(progress: launch.Progress) -> float:
    """Seconds of the chief's steps done again after restarts (the cost ledger prices them)."""
    chief = progress.throughput.clocks.get(0)
    return round(ledger.redone_seconds(chief.samples, chief.median_step_seconds), 2) if chief else 0.0


def _publish_throughput(store: StateStore, backend, run: RunRecord, local_dir) -> str:
    """Where TensorBoard finds the throughput figures: the local run folder, and on a cluster with a
    bucket the bucket too, beside the trainer's logs (`invoke tensorboard` reads the bucket there)."""
    cluster = store.load_cluster()
    if cluster is None or not cluster.bucket:
        return str(local_dir)
    from tfcluster.backends.gcp.cloud import storage as gcs
    from tfcluster.backends.gcp.cloud import translated

    url = f"gs://{cluster.bucket}/runs/{run.run_id}/{backend.tensorboard_folder}/throughput"
    try:
        with translated(cluster.project, f"uploading the throughput figures to {url}"):
            gcs.upload_dir(gcs.client(cluster.project), local_dir, url)
    except TfClusterError as error:  # The run's outcome stands; the figures stay in run.json and locally.
        console.print(f"[yellow]Throughput figures kept in {local_dir} only: {error}[/]", soft_wrap=True)
        return str(local_dir)
    return url
