"""`train`: check the request, stage code and data, and hand the plans to the attempt loop."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tfcluster import container, holds, launch, ledger, stall, ui
from tfcluster.backends import Payload
from tfcluster.commands import restage, spend
from tfcluster.commands.attempts import clock, run_attempts
from tfcluster.commands.common import (active_run, backend_for_cluster, console, plans_for, require_cluster,
                                       stop_processes)
from tfcluster.commands.budget import RunBudget
from tfcluster.config import Settings, parse_image, parse_int
from tfcluster.errors import ClusterError, ConfigError, TfClusterError, TrainingFailed
from tfcluster.money import parse_usd
from tfcluster.state import ClusterState, RunRecord, StateStore


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
    # --keras as given on the command line (None: not given); Settings.keras holds the value in force.
    keras: str | None = None
    # Show every worker line in the console, TensorFlow's start-up noise included.
    verbose: bool = False
    # Container image to run the workers in (None: tfcluster.image, else the one `up` pulled).
    image: str | None = None
    # --stall-minutes: the stall limit's floor in minutes, 0 = off (None: tfcluster/stall.py's rule).
    stall_minutes: int | None = None
    # --then: what to do with the cluster when the run ends, succeeded or failed ("down"; None: keep it).
    then: str | None = None
    # --budget: the run's cap in USD (None or 0: none; tfcluster/commands/budget.py).
    budget: float | str | None = None


# --then stop halts the VMs (disks stay; `invoke up` starts them again); --then down removes the cluster.
THEN_ACTIONS = ("stop", "down")


def _then_action(then: str | None) -> str | None:
    if then is not None and then not in THEN_ACTIONS:
        raise ConfigError(f"--then must be stop or down (got {then!r}): halt the VMs, or remove the cluster, "
                          "when the run ends")
    return then


def stall_limit(minutes: int | None) -> stall.StallLimit:
    """The stall rule for --stall-minutes: a whole number of minutes, 0 = off."""
    if minutes is None:
        return stall.StallLimit()
    try:
        value = int(str(minutes).strip())
    except ValueError:
        value = -1
    if not 0 <= value <= 10080 or isinstance(minutes, bool):
        raise ConfigError(f"--stall-minutes must be a whole number of minutes from 1 to 10080, or 0 to turn "
                          f"stall detection off (got {minutes})")
    return stall.StallLimit(minutes=value)


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


def _keras_env(settings: Settings, request: TrainRequest, script: Path | None) -> dict[str, str]:
    """TF_USE_LEGACY_KERAS for the workers. The bundled trainer always uses tf_keras; a script gets
    tf_keras for tf.keras by default, because Keras 3's model.fit fails under MultiWorkerMirroredStrategy
    with 2+ workers (keras-team/keras#20585), and the tutorials' scripts use tf.keras with fit."""
    if request.keras is not None and script is None:
        raise ConfigError("--keras goes with --script; the bundled trainer always uses tf_keras")
    # "0" rather than unset: a TF_USE_LEGACY_KERAS=1 in the launcher's own shell must not leak in.
    return {"TF_USE_LEGACY_KERAS": "1" if script is None or settings.keras == "2" else "0"}


def train(settings: Settings, request: TrainRequest) -> RunRecord | None:
    limit = stall_limit(request.stall_minutes)
    then = _then_action(request.then)
    store = StateStore(settings)
    cluster = require_cluster(store)
    workers = _worker_count(request.workers, cluster)
    retries = settings.retries if request.retries is None else parse_int("retries", request.retries, 0)
    script, project = _script_and_project(request)
    keras_env = _keras_env(settings, request, script)
    backend = backend_for_cluster(store, cluster)
    usd = parse_usd("--budget", request.budget)
    rate = backend.hourly_rate(cluster, settings) if usd else None
    if usd and rate is None:
        raise ConfigError(f"--budget needs the cluster's prices, and the {cluster.backend} backend has none (tfcluster "
                          "does not bill its machines by the hour); drop --budget, or cap the time with --stall-minutes")
    if then == "stop" and not backend.can_halt_machines:
        raise ConfigError(f"--then stop halts cloud VMs, and the {cluster.backend} backend's machines are not "
                          "tfcluster's to halt; use --then down to remove the cluster when the run ends")
    hosts = backend.hosts(cluster)[:workers]
    image = parse_image("image", request.image) if request.image else (settings.image or cluster.image)
    python = settings.python or (sys.executable if cluster.backend == "local" else cluster.python)
    if image:
        python = container.IMAGE_PYTHON  # The image provides Python and TensorFlow.

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
        data_dir = store.default_data_dir()  # `invoke data`'s last set, or the synthetic one (made below).
    payload = Payload(python=python, script=script, project=project, data_dir=data_dir,
                      args=list(request.trainer_args))
    run_id = store.new_run_id()
    common_env = {
        "TFCLUSTER_CLUSTER_ID": cluster.cluster_id,
        "AIP_MODEL_DIR": "{run_root}/output/model",
        "AIP_CHECKPOINT_DIR": "{run_root}/output/checkpoints",
        "AIP_TENSORBOARD_LOG_DIR": "{run_root}/output/tensorboard",
        # For a script's learning rate (tfcluster.scaled_learning_rate): the replicas in sync.
        "TFCLUSTER_REPLICAS": str(len(hosts) * backend.replicas_per_machine(settings)),
        **keras_env,
    }
    # TensorFlow's C++ logging stays at its own default, so each worker's log is complete; the
    # console folds the start-up noise instead (attempts.py). A level the user set is passed on.
    if "TF_CPP_MIN_LOG_LEVEL" in os.environ:
        common_env["TF_CPP_MIN_LOG_LEVEL"] = os.environ["TF_CPP_MIN_LOG_LEVEL"]

    if remote_data:
        common_env["TFCLUSTER_DATA_DIR"] = remote_data

    if request.dry_run:
        argv = [python, "-u", "-m", "trainer.task"] if script is None else [python, "-u", str(script)]
        plans = launch.build_plans(hosts, run_id, argv + payload.args, common_env,
                                   container.ContainerSpec(image) if image else None)
        _print_plan(plans)
        return None

    # From here until its attempts end, this launcher holds the cluster: `down` waits for it, and a
    # `stop` or `down` from another shell is seen at every step (tfcluster/state.py LauncherLease).
    with holds.LauncherLease(store, run_id):
        run, failed = _launch(settings, store, backend, cluster, request, run_id, hosts, payload, common_env,
                              image, data_dir, keras_env, workers, retries, limit, then, usd, rate)
    if then is not None and run.outcome != "stopped":  # After Ctrl-C, `stop` or `down` the user decides.
        _then(settings, store, backend, run, then)
    if failed is not None:
        raise failed
    return run


def _launch(settings: Settings, store: StateStore, backend, cluster: ClusterState, request: TrainRequest,
            run_id: str, hosts: list, payload: Payload, common_env: dict, image: str, data_dir: Path | None,
            keras_env: dict, workers: int, retries: int, limit: stall.StallLimit, then: str | None,
            usd: float, rate: float | None) -> tuple[RunRecord, TrainingFailed | None]:
    """Check, stage and run the attempts; the run and how it failed (None: it succeeded)."""
    if active_run(store, cluster):
        raise ClusterError(f"a run is still active on cluster '{cluster.name}'; "
                           "watch it with `invoke logs --follow` or end it with `invoke stop`")
    with console.status(f"Preflight on {len(hosts)} {cluster.backend} host(s)..."):
        # tf_keras must be importable wherever tf.keras resolves to it.
        backend.preflight(cluster, hosts, need_tensorflow=keras_env["TF_USE_LEGACY_KERAS"] == "1",
                          image=image)
    if data_dir == store.synthetic_data_dir:
        ensure_synthetic_data(store, sys.executable)
    with console.status("Staging code and data..."):
        staged = backend.stage(cluster, hosts, run_id, payload)
    skipped = [name for name, uploaded in staged.uploaded.items() if not uploaded]
    if cluster.backend != "local":
        console.print(f"Code and data: uploaded to {len(hosts) - len(skipped)} host(s), "
                      f"unchanged (same content hash) on {len(skipped)}.")
    request_seen = holds.stop_request(store, run_id)
    if request_seen is not None:  # `down` came while this run was staged: nothing has started.
        raise TrainingFailed(f"run {run_id} was stopped by {request_seen.describe()} before it started; "
                             "nothing was started")
    spec = container.ContainerSpec(image, staged.mounts) if image else None
    plans = launch.build_plans(hosts, run_id, staged.argv, {**common_env, **staged.env}, spec)
    if cluster.bucket:
        console.print(f"Outputs go to gs://{cluster.bucket}/runs/{run_id}/ (model, checkpoints, TensorBoard).")
    run = RunRecord(run_id=run_id, cluster=cluster.name, workers=workers, command=staged.argv,
                    retries=retries, image=image, mounts=list(staged.mounts) if image else [])
    if then is not None:
        run.summary = {"then": then}  # Known to `status` while the run goes on, laptop or not.
    store.save_run(run)
    # What `train --resume` needs to start the same workers again (code and data stay on the hosts).
    # And, should the cluster move zones mid-run, what its new VMs need staged (commands/restage.py).
    (store.run_dir(run_id) / LAUNCH_FILE).write_text(json.dumps({"env": {**common_env, **staged.env},
                                                                 "payload": restage.saved(payload),
                                                                 "stall_minutes": limit.minutes}))
    backend.set_stall_minutes(cluster, limit.minutes)  # The watchdogs hold it with the laptop gone.
    budget = RunBudget(run_id, usd, rate, time.time()) if usd else None
    backend.set_budget_end(cluster, budget.end_time if budget else None)  # Halts the VMs then, laptop or not.
    try:
        if then is not None and backend.can_halt_machines:  # Each VM halts itself at the run's end if this launcher is gone.
            backend.arm_then_stop(cluster, run.run_id, last_attempt=retries + 1)
        run_attempts(settings, store, backend, run, plans, verbose=request.verbose, stall_limit=limit, budget=budget)
    except TrainingFailed as error:
        return run, error
    finally:  # The launcher saw the run end: no halt is left armed (best effort: --then down took the VMs).
        if budget is not None and (still := store.load_cluster()) is not None:
            with contextlib.suppress(TfClusterError):
                backend.set_budget_end(still, None)
    return run, None


def _then(settings: Settings, store: StateStore, backend, run: RunRecord, then: str) -> None:
    """`--then stop|down`, after the run ended (succeeded or failed): recorded in run.json, then done."""
    from tfcluster.commands.cluster import down

    run.summary = {**run.summary, "then": then}
    store.save_run(run)
    if then == "down":
        console.print(f"--then down: run {run.run_id} {run.outcome}; removing cluster '{run.cluster}'...")
        down(settings)
        return
    console.print(f"--then stop: run {run.run_id} {run.outcome}; stopping the VMs...")
    cluster = store.load_cluster()
    stopped = backend.stop_machines(cluster)
    spend.sync(store, backend, cluster, settings, own=ledger.STOP, run=run.run_id)  # Our own stops, as such.
    console.print(f"--then stop: {len(stopped)} VM(s) stopped ({', '.join(stopped) or 'none was running'}); "
                  "their disks and the bucket bill until `invoke down`; `invoke up` starts them again.",
                  soft_wrap=True)


LAUNCH_FILE = restage.LAUNCH_FILE


def resume(settings: Settings, run_id: str, retries: int | None = None, verbose: bool = False,
           stall_minutes: int | None = None) -> RunRecord:
    """`train --resume RUN`: stop what is left of the run, start its preempted VMs again and
    resume the same run from its backup, as the next attempt."""
    limit = stall_limit(stall_minutes)
    store = StateStore(settings)
    cluster = require_cluster(store)
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
    with holds.LauncherLease(store, run_id):
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
    env = json.loads(launch_file.read_text())["env"]
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


def _print_plan(plans: list[launch.WorkerPlan]) -> None:
    for plan in plans:
        colour = ui.worker_colour(plan.index)
        console.print(f"[bold {colour}]{plan.name}[/] ({plan.task}) on {plan.host.record.endpoint}")
        console.print(f"  command:   {shlex.join(plan.argv)}")
        if plan.container is not None:
            console.print(f"  image:     {plan.container.image} (container {plan.container_name(1)})")
        console.print("  TF_CONFIG: " + json.dumps(json.loads(plan.tf_config)), soft_wrap=True)
    console.print("[dim]Dry run: nothing was started.[/]")
