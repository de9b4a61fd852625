"""The live loop of a search: start, follow the oracle's trials, fail fast, restart, summarise.

Restarts (``--retries K``, K in all): a dead tuner restarts alone with the same tuner id, and
Keras Tuner's oracle hands it the trial it had not finished (``Oracle.create_trial`` returns
``ongoing_trials[tuner_id]``). A dead oracle restarts everything: it reloads its state from the
shared folder (``overwrite=False``) and queues the trials that were running for a retry.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
import time
from pathlib import Path

from rich.status import Status

from tfcluster import holds, launch, ui
from tfcluster.commands.common import console, stop_processes
from tfcluster.commands.tune_plans import ORACLE, Trial, TrialBook, oracle_plan
from tfcluster.config import Settings
from tfcluster.errors import ConfigError, TrainingFailed
from tfcluster.state import RunRecord, StateStore
from trainer import events


def run_search(settings: Settings, store: StateStore, backend, run: RunRecord, plans: list[launch.WorkerPlan],
               bundled: bool, local_tune_dir: Path | None) -> RunRecord:
    book = TrialBook()
    started = time.time()
    run.attempts, run.attempt_of = 1, {plan.name: 1 for plan in plans}
    store.save_run(run)
    interrupted = threading.Event()  # Ctrl-C sets a flag the loop checks each tick.
    previous_handler = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.set())
    try:
        failures = _follow(settings, store, run, plans, book, interrupted)
    finally:
        signal.signal(signal.SIGINT, previous_handler)
    if interrupted.is_set():
        console.print("\n[yellow]Interrupted: stopping the oracle and every tuner...[/]")
        stop_processes(plans, run, settings.stop_grace_seconds)
        _finish(store, run, "stopped", book, started)
        raise TrainingFailed(f"run {run.run_id} stopped by Ctrl-C; no process is left running")
    request = holds.stop_request(store, run.run_id)
    if request is not None:  # `stop` or `down` from another shell: never restarted.
        stop_processes(plans, run, settings.stop_grace_seconds)
        _finish(store, run, "stopped", book, started)
        raise TrainingFailed(f"run {run.run_id} was stopped by {request.describe()}; it is not restarted, and no "
                             "process is left running")

    hosts = [plan.host for plan in plans if plan.label != ORACLE]
    local_dir = store.run_dir(run.run_id)
    with console.status("Collecting logs and trials..."):
        backend.collect(hosts, run.run_id, local_dir, False)  # Tuners' logs (worker-I.log).
        oracle = oracle_plan(plans)
        if Path(oracle.log_path) != local_dir / "oracle.log":
            (local_dir / "oracle.log").write_bytes(oracle.host.read_file(oracle.log_path) or b"")
        if local_tune_dir is not None:
            backend.gather(hosts, run.run_id, "tune", local_dir)
    _finish(store, run, "failed" if failures else "succeeded", book, started)
    if book.error:
        raise ConfigError(book.error)
    if failures:
        plan, status = failures[0]
        raise TrainingFailed(f"run {run.run_id} failed: {plan.name} ({plan.task} on {plan.host.record.address}) "
                             f"{status.describe()} after {run.attempts - 1} restart(s); "
                             f"see `invoke logs{'' if plan.label == ORACLE else f' --worker {plan.index}'}`")
    best = _write_best(store, run, book, plans, bundled, local_tune_dir)
    _print_summary(run, book, best, time.time() - started, local_dir / "best.json")
    return run


def _follow(settings, store, run, plans, book: TrialBook, interrupted) -> list:
    """Until every process exited 0 (returns []), a failure with no restart left (returns the
    failures), or Ctrl-C (returns [])."""
    tuners = {plan.task: plan for plan in plans if plan.label != ORACLE}
    follower = launch.LogFollower(plans)
    spinner = Status(f"Starting the oracle and {len(tuners)} tuner(s)...", console=console)

    def drain(flush: bool = False) -> None:
        for plan, line in follower.poll(flush):
            event = events.parse(line)
            if event is None:
                continue  # Tuners' own output: `invoke logs --worker I`.
            ended = book.update(event)
            if event["event"] == "oracle_ready":
                known = len(book.trials)
                console.print(ui.prefixed(plan.index, plan.name, f"listening on {event.get('address')}:"
                                          f"{event.get('port')}; objective {book.objective} ({book.direction}), "
                                          f"max trials {book.max_trials or 'unset'}"
                                          + (f"; {known} trial(s) reloaded from its folder" if known else "")),
                              soft_wrap=True)
            if ended is not None:
                console.print(_trial_line(ended, book, tuners), soft_wrap=True)

    spinner.start()
    try:
        # The oracle first, on its own: it shares the chief host's SSH connection with tuner 0, and
        # start_attempt works on its plans in parallel threads, one per plan.
        launch.start_attempt([oracle_plan(plans)], 1)
        launch.start_attempt([plan for plan in plans if plan.label != ORACLE], 1)
        while True:
            drain()
            if interrupted.is_set() or holds.stop_request(store, run.run_id) is not None:
                drain(flush=True)
                return []
            statuses = [(plan, launch.worker_status(plan, run.attempt_of[plan.name])) for plan in plans]
            running = sum(status.state == launch.RUNNING for _, status in statuses)
            spinner.update(f"Search: {book.progress()} ({running}/{len(plans)} processes running)")
            failed = [(plan, status) for plan, status in statuses if status.state in (launch.FAILED, launch.LOST)]
            if not failed and all(status.state == launch.SUCCEEDED for _, status in statuses):
                drain(flush=True)
                return []
            if failed:
                drain(flush=True)
                spinner.stop()
                _report(failed)
                if holds.stop_request(store, run.run_id) is not None:
                    return []  # Ended by `stop` or `down`: not a failure to restart.
                if book.error or run.attempts - 1 >= run.retries:
                    console.print("[red]Stopping the oracle and the tuners (fail fast)...[/]")
                    stop_processes(plans, run, settings.stop_grace_seconds)
                    return failed
                _restart(settings, store, run, plans, [plan for plan, _ in failed], book)
                spinner.start()
            time.sleep(launch.POLL_SECONDS)
    finally:
        spinner.stop()


def _restart(settings, store, run: RunRecord, plans, dead, book: TrialBook) -> None:
    run.attempts += 1
    if any(plan.label == ORACLE for plan in dead):
        console.print(f"[yellow]↻ Restart {run.attempts - 1} of {run.retries}: the oracle died, so every process "
                      "restarts; the oracle reloads its state and hands the unfinished trials out again[/]")
        stop_processes(plans, run, settings.stop_grace_seconds)
        dead = plans
    for plan in dead:
        if plan.label != ORACLE:
            unfinished = [t.trial_id for t in book.trials.values() if t.tuner == plan.task and t.status == "RUNNING"]
            console.print(f"[yellow]↻ Restart {run.attempts - 1} of {run.retries}: {plan.task} on {plan.name}"
                          + (f"; the oracle hands it trial {', '.join(unfinished)} again" if unfinished else "")
                          + "[/]")
        stop_processes([plan], run, settings.stop_grace_seconds)  # Whatever is left of its group.
        run.attempt_of[plan.name] += 1
    store.save_run(run)
    for plan in dead:
        launch.start_attempt([plan], run.attempt_of[plan.name])


def _report(failed) -> None:
    for plan, status in failed:
        console.print(f"[bold red]✗ {plan.name} ({plan.task} on {plan.host.record.address}) "
                      f"{status.describe()}.[/] Last lines of its log:")
        for line in launch.log_tail(plan):
            console.print(ui.prefixed(plan.index, plan.name, line), soft_wrap=True)


def _values(hyperparameters: dict) -> str:
    return "  ".join(f"{name}={_number(value)}" for name, value in hyperparameters.items())


def _number(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _trial_line(trial: Trial, book: TrialBook, tuners: dict) -> ui.Text:
    plan = tuners.get(trial.tuner)
    where = f"{trial.tuner} on {plan.name}" if plan else trial.tuner or "?"
    if trial.status == "COMPLETED":
        head = f"✓ trial {trial.trial_id}  {where}  {book.objective} {trial.score:.4f}  "
    else:
        head = f"✗ trial {trial.trial_id}  {where}  {trial.status} {trial.message}  "
    text = ui.prefixed(plan.index if plan else 0, "trial", head + _values(trial.hyperparameters))
    text.append(f"   │ {book.progress()}", style="bold")
    return text


def _flag_value(value) -> str:
    """A float short when that is exact or differs only by float arithmetic's noise (Keras Tuner's 0.1
    steps give 0.30000000000000004 for 0.3), else in full: the command must reproduce the trial's values
    (a log-sampled learning rate has every digit). (The learning rate a trial trained with is the
    trainer's reference rate, --batch-size on one replica; `train` scales it to the replicas in sync.)"""
    if isinstance(value, float):
        short = f"{value:.6g}"
        return short if abs(float(short) - value) <= 1e-12 * abs(value) else repr(value)
    return str(value)


def _train_command(trial: Trial) -> str:
    flags = " ".join(f"--{name.replace('_', '-')} {_flag_value(value)}"
                     for name, value in trial.hyperparameters.items())
    return f"invoke train -- {flags}"


def _write_best(store, run: RunRecord, book: TrialBook, plans, bundled: bool, local_tune_dir: Path | None) -> dict:
    best = book.best()
    if best is None:
        return {}
    trial_dir = f"{book.project_dir}/trial_{best.trial_id}"
    if local_tune_dir is not None:  # Gathered: the same place under the local run folder.
        oracle = oracle_plan(plans)
        relative = os.path.relpath(book.project_dir, f"{oracle.run_root}/tune")
        trial_dir = str((local_tune_dir / relative / f"trial_{best.trial_id}").resolve())
    model = f"{trial_dir}/model.keras"
    record = {"run_id": run.run_id, "trial_id": best.trial_id, "tuner": best.tuner, "objective": book.objective,
              "direction": book.direction, "score": best.score, "hyperparameters": best.hyperparameters,
              "trial_dir": trial_dir,
              "model": model if bundled and ("://" in model or Path(model).exists()) else None,
              "train_command": _train_command(best) if bundled else None}
    (store.run_dir(run.run_id) / "best.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def _finish(store, run: RunRecord, outcome: str, book: TrialBook, started: float) -> None:
    run.outcome, run.ended_at = outcome, time.time()
    done, running, left = book.counts()
    best = book.best()
    run.summary = {"objective": book.objective, "direction": book.direction, "max_trials": book.max_trials,
                   "trials": [dataclasses.asdict(t) for t in book.ranked()], "done": done,
                   "best_trial": best.trial_id if best else None, "best_score": best.score if best else None,
                   "wall_seconds": round(run.ended_at - started, 2)}
    store.save_run(run)


def _print_summary(run: RunRecord, book: TrialBook, best: dict, wall: float, best_path: Path) -> None:
    names = list(dict.fromkeys(name for t in book.ranked() for name in t.hyperparameters))
    table = ui.table(f"Search {run.run_id}: {run.outcome}, {len(book.trials)} trials in {ui.duration(wall)}, "
                     f"sorted by {book.objective} ({book.direction})",
                     ["trial", "tuner", "status", book.objective, *names])
    for trial in book.ranked():
        status = trial.status + (f" ({trial.starts} starts)" if trial.starts > 1 else "")
        table.add_row(trial.trial_id, trial.tuner, status, "-" if trial.score is None else f"{trial.score:.4f}",
                      *[_number(trial.hyperparameters.get(name, "-")) for name in names])
    ui.show(table)
    if best:
        console.print(f"Best: trial {best['trial_id']} ({book.objective} {best['score']:.4f}), "
                      f"its folder {best['trial_dir']}", soft_wrap=True)
        console.print(f"Best hyperparameters: {best_path}", soft_wrap=True)
        if best.get("train_command"):
            console.print(f"Train the final model with them:\n  [bold]{best['train_command']}[/]", soft_wrap=True)
