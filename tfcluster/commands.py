"""The operations behind the invoke tasks: up, train, status, logs, stop, down, data.

tasks.py parses options and calls these; they raise TfClusterError subclasses for
anything the user can fix.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from rich.status import Status

from tfcluster import launch, ui
from tfcluster.backends import Payload, get_backend
from tfcluster.config import Settings, parse_int
from tfcluster.errors import ClusterError, ConfigError, TfClusterError, TrainingFailed
from tfcluster.state import ClusterState, RunRecord, StateStore
from trainer import events

console = ui.console


def _backend(name: str, store: StateStore):
    return get_backend(name, store, announce=lambda text: console.print(f"[yellow]![/] {text}"))


def _require_cluster(store: StateStore) -> ClusterState:
    cluster = store.load_cluster()
    if cluster is None:
        raise ClusterError(f"no cluster '{store.cluster_name}' is up; run: invoke up")
    return cluster


# ---------------------------------------------------------------- up


def up(settings: Settings) -> ClusterState:
    store = StateStore(settings)
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
        backend = _backend(existing.backend, store)
        if hasattr(backend, "refresh"):
            backend.refresh(existing, settings)
        console.print(f"Cluster [bold]{existing.name}[/] is already up: {existing.workers} "
                      f"{existing.backend} workers. Nothing re-created.")
        return existing
    with console.status(f"Creating {settings.backend} cluster '{settings.cluster}' "
                        f"with {settings.workers} workers..."):
        cluster = _backend(settings.backend, store).up(settings, None)
        store.save_cluster(cluster)
    console.print(f"[green]✓[/] Cluster [bold]{cluster.name}[/] is up: {cluster.workers} "
                  f"{cluster.backend} workers ({', '.join(h.endpoint for h in cluster.hosts)}).")
    console.print("  Next: invoke train --workers N   (state: "
                  f"{store.cluster_file})")
    return cluster


# ---------------------------------------------------------------- train


@dataclass
class TrainRequest:
    # Workers to use; None means all of the cluster's.
    workers: int | None
    # A user's script to run instead of the bundled trainer.
    script: str | None
    # Folder shipped with --script to remote hosts (it must contain the script).
    project: str | None
    # Arguments after `--`, passed to the trainer or script.
    trainer_args: list[str]
    # Restarts after a failure (None: the configured default).
    retries: int | None
    # Print the plan and start nothing.
    dry_run: bool


def ensure_synthetic_data(store: StateStore, python: str) -> Path:
    """The built-in demo TFRecords, generated once (in a subprocess: the launcher stays TF-free)."""
    data_dir = store.synthetic_data_dir
    if (data_dir / "manifest.json").exists():
        return data_dir
    with console.status("Generating the built-in synthetic shapes dataset (once)..."):
        result = subprocess.run([python, "-m", "trainer.create_tfrecords", "--synthetic",
                                 "--out", str(data_dir)], capture_output=True, text=True,
                                cwd=str(Path(launch.__file__).resolve().parent.parent))
    if result.returncode != 0:
        tail = " | ".join(result.stderr.strip().splitlines()[-3:])
        raise TfClusterError(f"could not generate the synthetic dataset in {data_dir}: {tail}")
    return data_dir


def _worker_count(requested: int | None, cluster: ClusterState) -> int:
    if requested is None:
        return cluster.workers
    count = parse_int("workers", requested, 1)
    if count > cluster.workers:
        raise ConfigError(
            f"workers must be between 1 and {cluster.workers}, the size of cluster "
            f"'{cluster.name}' (got {count}); use --workers {cluster.workers} or "
            f"`invoke down && invoke up --workers {count}`")
    return count


def _script_and_project(request: TrainRequest) -> tuple[Path | None, Path | None]:
    if not request.script:
        if request.project:
            raise ConfigError("--project goes with --script (the script to run inside it)")
        return None, None
    script = Path(request.script).expanduser()
    if not script.is_file():
        raise ConfigError(f"--script {request.script} does not exist or is not a file; "
                          "give the path of a Python training script")
    script = script.resolve()
    if not request.project:
        return script, None
    project = Path(request.project).expanduser().resolve()
    if not project.is_dir():
        raise ConfigError(f"--project {request.project} is not a folder")
    if project not in script.parents:
        raise ConfigError(f"--script {request.script} must be inside --project {request.project}")
    return script, project


def _active_run(store: StateStore, cluster: ClusterState) -> tuple[RunRecord, list] | None:
    run = store.latest_run()
    if run is None or run.outcome is not None or run.attempts == 0:
        return None
    plans = _plans_for(store, cluster, run)
    statuses = [launch.worker_status(plan, run.attempts) for plan in plans]
    if any(status.state in (launch.RUNNING, launch.STARTING) for status in statuses):
        return run, plans
    return None


def _plans_for(store: StateStore, cluster: ClusterState, run: RunRecord,
               env: dict[str, str] | None = None) -> list[launch.WorkerPlan]:
    hosts = _backend_for_cluster(store, cluster).hosts(cluster)[: run.workers]
    return launch.build_plans(hosts, run.run_id, run.command, env or {})


def _backend_for_cluster(store: StateStore, cluster: ClusterState):
    return _backend(cluster.backend, store)


def train(settings: Settings, request: TrainRequest) -> RunRecord | None:
    store = StateStore(settings)
    cluster = _require_cluster(store)
    workers = _worker_count(request.workers, cluster)
    retries = settings.retries if request.retries is None else parse_int("retries", request.retries, 0)
    script, project = _script_and_project(request)
    backend = _backend_for_cluster(store, cluster)
    hosts = backend.hosts(cluster)[:workers]
    python = settings.python or (sys.executable if cluster.backend == "local" else cluster.python)

    # Where the data comes from, first match wins: a configured gs:// or local folder, the
    # bucket copy `invoke data` made for this cluster, else (bundled trainer) the synthetic set.
    data_dir: Path | None = None  # Local TFRecords, shipped to remote hosts.
    remote_data = ""  # gs:// TFRecords the workers read directly.
    if settings.data_dir.startswith("gs://"):
        remote_data = settings.data_dir
    elif settings.data_dir:
        data_dir = Path(settings.data_dir).expanduser()
        if not (data_dir / "manifest.json").exists():
            raise ConfigError(f"data_dir {settings.data_dir} has no manifest.json; create it with "
                              "`invoke data --src IMAGES --out DIR`")
    elif cluster.data_url:
        remote_data = cluster.data_url
    elif script is None:
        data_dir = store.synthetic_data_dir  # Generated below, unless this is a dry run.
    payload = Payload(python=python, script=script, project=project, data_dir=data_dir,
                      args=list(request.trainer_args))
    run_id = store.new_run_id()
    common_env = {
        "TFCLUSTER_CLUSTER_ID": cluster.cluster_id,
        "AIP_MODEL_DIR": "{run_root}/output/model",
        "AIP_CHECKPOINT_DIR": "{run_root}/output/checkpoints",
        "AIP_TENSORBOARD_LOG_DIR": "{run_root}/output/tensorboard",
        "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
    }

    if remote_data:
        common_env["TFCLUSTER_DATA_DIR"] = remote_data

    if request.dry_run:
        argv = [python, "-u", "-m", "trainer.task"] if script is None else [python, "-u", str(script)]
        plans = launch.build_plans(hosts, run_id, argv + payload.args, common_env)
        _print_plan(plans)
        return None

    if _active_run(store, cluster):
        raise ClusterError(f"a run is still active on cluster '{cluster.name}'; "
                           "watch it with `invoke logs --follow` or end it with `invoke stop`")
    with console.status(f"Preflight on {len(hosts)} {cluster.backend} host(s)..."):
        backend.preflight(cluster, hosts, need_tensorflow=script is None)
    if data_dir == store.synthetic_data_dir:
        ensure_synthetic_data(store, sys.executable)
    with console.status("Staging code and data..."):
        staged = backend.stage(cluster, hosts, run_id, payload)
    skipped = [name for name, uploaded in staged.uploaded.items() if not uploaded]
    if cluster.backend != "local":
        console.print(f"Code and data: uploaded to {len(hosts) - len(skipped)} host(s), "
                      f"unchanged (same content hash) on {len(skipped)}.")
    plans = launch.build_plans(hosts, run_id, staged.argv, {**common_env, **staged.env})
    if cluster.bucket:
        console.print(f"Outputs go to gs://{cluster.bucket}/runs/{run_id}/ (model, checkpoints, TensorBoard).")
    run = RunRecord(run_id=run_id, cluster=cluster.name, workers=workers, command=staged.argv,
                    retries=retries)
    store.save_run(run)
    return _run_attempts(settings, store, backend, run, plans)


def _print_plan(plans: list[launch.WorkerPlan]) -> None:
    for plan in plans:
        colour = ui.worker_colour(plan.index)
        console.print(f"[bold {colour}]{plan.name}[/] ({plan.task}) on {plan.host.record.endpoint}")
        console.print(f"  command:   {shlex.join(plan.argv)}")
        console.print("  TF_CONFIG: " + json.dumps(json.loads(plan.tf_config)), soft_wrap=True)
    console.print("[dim]Dry run: nothing was started.[/]")


def _run_attempts(settings: Settings, store: StateStore, backend, run: RunRecord,
                  plans: list[launch.WorkerPlan]) -> RunRecord:
    progress = launch.Progress()
    started = time.time()
    failure: launch.AttemptResult | None = None
    # Ctrl-C sets a flag that the follow loop checks each tick, instead of raising
    # KeyboardInterrupt wherever the main thread happens to be (a lock, a thread pool).
    interrupted = threading.Event()
    previous_handler = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.set())
    try:
        for attempt in range(1, run.retries + 2):
            run.attempts = attempt
            store.save_run(run)
            if attempt > 1:
                console.print(f"[yellow]↻ Retrying: attempt {attempt} of {run.retries + 1}, "
                              "resuming from the last checkpoint[/]")
                backend.before_retry([plan.host for plan in plans], run.run_id)
            failure = _one_attempt(settings, plans, attempt, progress, interrupted.is_set)
            if failure is None or failure.interrupted:
                break
            _report_failure(failure, plans)
            launch.stop_attempt(plans, attempt, settings.stop_grace_seconds)
            if interrupted.is_set():
                break
        if interrupted.is_set():
            console.print("\n[yellow]Interrupted: stopping every worker...[/]")
            launch.stop_attempt(plans, run.attempts, settings.stop_grace_seconds)
            _finish(store, run, "stopped", progress, started)
            raise TrainingFailed(f"run {run.run_id} stopped by Ctrl-C; no worker is left running")
    finally:
        signal.signal(signal.SIGINT, previous_handler)

    outcome = "succeeded" if failure is None else "failed"
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
    _finish(store, run, outcome, progress, started)
    _print_summary(run, progress, time.time() - started)
    if failure is not None:
        plan, status = failure.failures[0]
        raise TrainingFailed(f"run {run.run_id} failed: {plan.name} ({plan.task}) {status.describe()}"
                             f" after {run.attempts} attempt(s); see `invoke logs --worker {plan.index}`")
    return run


def _one_attempt(settings: Settings, plans, attempt: int, progress: launch.Progress, should_stop):
    waiting = Status(f"Starting {len(plans)} workers (attempt {attempt})...", console=console)
    waiting.start()
    spinning = True

    def on_line(plan, line):
        console.print(ui.prefixed(plan.index, plan.name, line), soft_wrap=True)

    def on_event(plan, event):
        nonlocal spinning
        progress.update(plan, event, attempt)
        if plan.index != 0:
            return
        kind = event["event"]
        if kind == "first_step" and spinning:
            waiting.stop()
            spinning = False
        if kind == "strategy":
            console.print(ui.prefixed(0, plan.name, f"MultiWorkerMirroredStrategy: "
                                      f"{event.get('replicas_in_sync')} replicas in sync, global batch "
                                      f"{event.get('global_batch')}, shard policy {event.get('shard_policy')}",
                                      ), style="bold", soft_wrap=True)
        elif kind == "epoch_end":
            console.print(ui.prefixed(0, plan.name, f"epoch {event.get('epoch')}/{event.get('epochs')}  "
                                      + ui.format_metrics(event.get("metrics", {}))), style="bold", soft_wrap=True)

    def on_tick(statuses):
        if spinning:
            running = sum(status.state == launch.RUNNING for status in statuses)
            waiting.update(f"Attempt {attempt}: {running}/{len(plans)} workers running, "
                           "waiting for the first training step...")

    follower = launch.LogFollower(plans, from_end=True)
    launch.start_attempt(plans, attempt)
    try:
        result = launch.follow_attempt(plans, attempt, follower, on_line, on_event, on_tick, should_stop)
    finally:
        if spinning:
            waiting.stop()
    return None if result.ok else result


def _report_failure(result: launch.AttemptResult, plans) -> None:
    for plan, status in result.failures:
        console.print(f"[bold red]✗ {plan.name} ({plan.task} on {plan.host.record.endpoint}) "
                      f"{status.describe()}.[/] Last lines of its log:")
        for line in launch.log_tail(plan):
            console.print(ui.prefixed(plan.index, plan.name, line), soft_wrap=True)
    console.print("[red]Stopping the other workers (fail fast)...[/]")


def _finish(store, run: RunRecord, outcome: str, progress: launch.Progress, started: float) -> None:
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
        "chance": progress.chance,
        "first_step_at": progress.first_step_at,
        "scratch_dirs": {str(k): v for k, v in progress.scratch_dirs.items()},
        "scratch_removed": progress.scratch_removed,
        "wall_seconds": round(run.ended_at - started, 2),
    }
    store.save_run(run)


def _print_summary(run: RunRecord, progress: launch.Progress, wall: float) -> None:
    table = ui.table(f"Run {run.run_id}: {run.outcome}", ["", ""])
    table.show_header = False
    table.add_row("workers", str(run.workers))
    table.add_row("replicas in sync", str(progress.replicas_in_sync or "n/a"))
    if progress.epochs:
        table.add_row("epochs", f"{progress.last_epoch}/{progress.epochs}")
    resumed = {a: e for a, e in progress.resumed_at.items() if a > 1}
    table.add_row("attempts", str(run.attempts))
    for attempt, epoch in sorted(resumed.items()):
        redo = f"epochs 1-{epoch - 1} not redone" if epoch > 1 else "no checkpoint yet, started over"
        table.add_row(f"attempt {attempt}", f"resumed at epoch {epoch} ({redo})")
    if progress.metrics:
        table.add_row("final metrics", ui.format_metrics(progress.metrics))
    if "val_accuracy" in progress.metrics and progress.chance:
        table.add_row("validation accuracy",
                      f"{progress.metrics['val_accuracy']:.3f} (chance {progress.chance:.3f})")
    table.add_row("model", progress.keras_path or "n/a")
    if progress.saved_model_path:
        table.add_row("SavedModel", progress.saved_model_path)
    table.add_row("wall time", ui.duration(wall))
    console.print(table)


# ---------------------------------------------------------------- status / logs / stop / down


def _run_statuses(store, cluster, run) -> list[tuple[launch.WorkerPlan, launch.WorkerStatus]]:
    plans = _plans_for(store, cluster, run)
    return [(plan, launch.worker_status(plan, max(run.attempts, 1))) for plan in plans]


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


def status(settings: Settings) -> dict:
    store = StateStore(settings)
    cluster = _require_cluster(store)
    table = ui.table(f"Cluster {cluster.name} ({cluster.backend}), up since {ui.when(cluster.created_at)}",
                     ["worker", "task", "TF endpoint"])
    from tfcluster import tfconfig

    for index, host in enumerate(cluster.hosts):
        task_type, task_index = tfconfig.task_of(index)
        table.add_row(f"[{ui.worker_colour(index)}]{host.name}[/]", f"{task_type}:{task_index}", host.endpoint)
    console.print(table)
    backend = _backend_for_cluster(store, cluster)
    if hasattr(backend, "vm_rows") and cluster.status == "up":
        vms = ui.table("VMs", ["VM", "state", "uptime", "cost so far"])
        for row in backend.vm_rows(cluster, settings):
            vms.add_row(row["name"], row["status"], ui.duration(row["uptime_seconds"]),
                        f"${row['cost_so_far']:.2f}")
        console.print(vms)
    _print_watchdog(backend, cluster)
    run = store.latest_run()
    if run is None:
        console.print("No run yet. Start one with: invoke train")
        return {"cluster": cluster.name, "run": None}
    pairs = _run_statuses(store, cluster, run)
    state = run_state(run, [s for _, s in pairs])
    colour = {"running": "yellow", "succeeded": "green"}.get(state, "red")
    table = ui.table(f"Run {run.run_id}: [{colour}]{state}[/], attempt {run.attempts} of "
                     f"{run.retries + 1}, started {ui.when(run.started_at)}",
                     ["worker", "state", "pid", "exit code"])
    for plan, worker in pairs:
        table.add_row(f"[{ui.worker_colour(plan.index)}]{plan.name}[/]", worker.state,
                      str(worker.pid or "-"), "-" if worker.exit_code is None else str(worker.exit_code))
    console.print(table)
    if run.summary.get("metrics"):
        console.print("final metrics: " + ui.format_metrics(run.summary["metrics"]))
    if run.summary.get("keras_path"):
        console.print(f"model: {run.summary['keras_path']}")
    return {"cluster": cluster.name, "run": run.run_id, "state": state,
            "workers": {plan.name: worker.state for plan, worker in pairs}}


def _print_watchdog(backend, cluster: ClusterState) -> None:
    """Per host: busy or idle, idle for how long, when the watchdog acts, the hypervisor deadline."""
    if not hasattr(backend, "watchdog_status"):
        return
    try:
        statuses = backend.watchdog_status(cluster)
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
    console.print(table)


def idle(settings: Settings, minutes: int | None, off: bool) -> int:
    """Change the idle watchdog on a live cluster; returns the new idle minutes (0 = off)."""
    if off == (minutes is not None):
        raise ConfigError("give exactly one of --minutes N or --off")
    value = 0 if off else parse_int("minutes", minutes, 1)
    if value > 1440:
        raise ConfigError(f"minutes must be between 1 and 1440 (got {value})")
    store = StateStore(settings)
    cluster = _require_cluster(store)
    backend = _backend_for_cluster(store, cluster)
    if not hasattr(backend, "set_idle"):
        raise ClusterError(f"the {cluster.backend} backend has no idle watchdog (workers run on this machine)")
    backend.set_idle(cluster, value, settings.idle_action)
    if value:
        console.print(f"[green]✓[/] The watchdog now {settings.idle_action}s each machine after {value} idle "
                      "minutes (from its next poll, within 60 s).")
    else:
        console.print("[yellow]Idle watchdog off[/] until the next `invoke up`; the hypervisor deadline "
                      "(gcp) and `invoke down` still stop the spending.")
    return value


def _print_new_lines(follower: launch.LogFollower, flush: bool = False) -> None:
    for plan, line in follower.poll(flush):
        if events.PREFIX not in line:
            console.print(ui.prefixed(plan.index, plan.name, line), soft_wrap=True)


def logs(settings: Settings, worker: int | None, follow: bool, run_id: str | None = None) -> str:
    store = StateStore(settings)
    run = _run_or_latest(store, run_id)
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
        for index in range(run.workers):
            path = store.run_dir(run.run_id) / f"worker-{index}.log"
            if (selected is None or index == selected) and path.exists():
                for line in path.read_text(errors="replace").splitlines():
                    console.print(ui.prefixed(index, f"worker-{index}", line), soft_wrap=True)
        return run.outcome or "unknown"

    plans = _plans_for(store, cluster, run)
    follower = launch.LogFollower([plan for plan in plans if selected is None or plan.index == selected])
    attempt = max(run.attempts, 1)
    while True:
        _print_new_lines(follower)
        current = store.load_run(run.run_id) or run
        state = run_state(current, [launch.worker_status(plan, attempt) for plan in plans])
        if not follow or (state != "running" and current.attempts == attempt):
            _print_new_lines(follower, flush=True)
            if follow:
                console.print(f"Run {run.run_id} {state}.")
            return state
        attempt = current.attempts  # A retry started: follow the new attempt.
        time.sleep(launch.POLL_SECONDS)


def stop(settings: Settings) -> str | None:
    store = StateStore(settings)
    cluster = _require_cluster(store)
    active = _active_run(store, cluster)
    if active is None:
        console.print("No run is active.")
        return None
    run, plans = active
    with console.status(f"Stopping run {run.run_id}..."):
        launch.stop_attempt(plans, run.attempts, settings.stop_grace_seconds)
    run.outcome, run.ended_at = "stopped", time.time()
    store.save_run(run)
    console.print(f"[green]✓[/] Run {run.run_id} stopped; no worker is left running.")
    return run.run_id


def down(settings: Settings, keep: bool = False) -> None:
    store = StateStore(settings)
    cluster = store.load_cluster()
    if cluster is None:
        console.print(f"Cluster '{settings.cluster}' is not up. Nothing to do.")
        return
    if _active_run(store, cluster):
        stop(settings)
    backend = _backend_for_cluster(store, cluster)
    leftovers = backend.leftover_processes(cluster)
    if leftovers:
        backend.kill_leftovers(cluster)
        deadline = time.monotonic() + 10
        while leftovers and time.monotonic() < deadline:
            time.sleep(0.1)
            leftovers = backend.leftover_processes(cluster)
    if leftovers:
        raise ClusterError(f"could not end {len(leftovers)} process(es) of cluster '{cluster.name}': "
                           f"{'; '.join(leftovers)}; kill them by hand, then run `invoke down` again")
    backend.teardown(cluster, keep)
    store.remove_cluster()
    console.print(f"[green]✓[/] Cluster [bold]{cluster.name}[/] is down: verified that no worker "
                  f"process is left. Run results stay in {store.runs_dir}.")


# ---------------------------------------------------------------- data


def data(settings: Settings, src: str | None, out: str | None, synthetic: bool,
         image_size: int | None = None) -> Path:
    """Run trainer/create_tfrecords.py; the default output is where `train` looks."""
    if bool(src) == bool(synthetic):
        raise ConfigError("give exactly one of --src IMAGE_FOLDER or --synthetic")
    if src and not Path(src).expanduser().is_dir():
        raise ConfigError(f"--src {src} is not a folder; give a folder with one sub-folder per class")
    store = StateStore(settings)
    target = Path(out or settings.data_dir or store.synthetic_data_dir).expanduser()
    argv = [settings.python or sys.executable, "-m", "trainer.create_tfrecords", "--out", str(target)]
    argv += ["--synthetic"] if synthetic else ["--src", str(Path(src).expanduser())]
    if image_size is not None:
        argv += ["--image-size", str(parse_int("image_size", image_size, 1))]
    result = subprocess.run(argv, cwd=str(Path(launch.__file__).resolve().parent.parent))
    if result.returncode != 0:
        raise TfClusterError(f"create_tfrecords failed (exit {result.returncode}); see the error above")
    cluster = store.load_cluster()
    if cluster is not None and cluster.bucket:
        from tfcluster import gcs

        url = f"gs://{cluster.bucket}/data/{target.name}"
        with console.status(f"Uploading the shards to {url} ..."):
            names = gcs.upload_dir(gcs.client(cluster.project), target, url)
        cluster.data_url = url
        store.save_cluster(cluster)
        console.print(f"[green]✓[/] Uploaded {len(names)} files to {url}; `invoke train` reads them from there.")
        return target
    if not settings.data_dir and out and Path(out).resolve() != store.synthetic_data_dir:
        console.print(f"Train on it with: INVOKE_TFCLUSTER_DATA_DIR={target} invoke train "
                      "(or set tfcluster.data_dir in invoke.yaml)")
    return target


def _run_or_latest(store: StateStore, run_id: str | None) -> RunRecord:
    run = store.load_run(run_id) if run_id else store.latest_run()
    if run is None:
        raise ClusterError(f"no run {'named ' + run_id if run_id else 'yet'} for cluster "
                           f"'{store.cluster_name}'; start one with: invoke train")
    return run


def pull(settings: Settings, run_id: str | None = None) -> Path:
    """Download a run's model and TensorBoard logs from the cluster bucket into its run folder."""
    from tfcluster import gcs

    store = StateStore(settings)
    cluster = _require_cluster(store)
    if not cluster.bucket:
        raise ClusterError(f"cluster '{cluster.name}' has no bucket: `train` already fetched the results "
                           f"into {store.runs_dir}")
    run = _run_or_latest(store, run_id)
    storage = gcs.client(cluster.project)
    destination = store.run_dir(run.run_id) / "output"
    count = 0
    for part in ("model", "tensorboard"):
        url = f"gs://{cluster.bucket}/runs/{run.run_id}/{part}"
        count += len(gcs.download_prefix(storage, url, destination / part))
    if count == 0:
        raise ClusterError(f"nothing under gs://{cluster.bucket}/runs/{run.run_id}/ yet (did the run finish?)")
    console.print(f"[green]✓[/] Downloaded {count} files of run {run.run_id} into {destination}")
    return destination


def tensorboard_logdir(settings: Settings, run_id: str | None = None) -> str:
    """A run's TensorBoard folder: on the bucket for gcp clusters, else the local run folder."""
    store = StateStore(settings)
    run = _run_or_latest(store, run_id)
    cluster = store.load_cluster()
    if cluster is not None and cluster.bucket:
        return f"gs://{cluster.bucket}/runs/{run.run_id}/tensorboard"
    logdir = store.run_dir(run.run_id) / "output" / "tensorboard"
    if not logdir.exists():
        raise ClusterError(f"run {run.run_id} has no TensorBoard logs at {logdir}")
    return str(logdir)
