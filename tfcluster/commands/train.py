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

from rich.text import Text

from tfcluster import container, gpu_health, holds, launch, ledger, stall, ui
from tfcluster.backends import Payload
from tfcluster.commands import (batch_fit, requirements as script_requirements, restage, script_facts,
                                 script_layout, spend)
from tfcluster.commands.attempts import run_attempts
from tfcluster.commands.common import active_run, backend_for_cluster, console, require_up_cluster
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
    # --code-dir: the folder shipped with --script to remote hosts (it must contain the script).
    code_dir: str | None
    # Arguments after `--`, passed to the trainer or script.
    trainer_args: list[str]
    # Restarts after a failure (None: the configured default).
    retries: int | None
    # Print the plan and start nothing.
    dry_run: bool
    # --requirements: a pip requirements file installed on every host before the run (None: none).
    requirements: str | None = None
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
    # --detach: start the workers and return (`logs --follow` and `status` watch the run; no retries).
    detach: bool = False


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
        if request.code_dir:
            raise ConfigError("--code-dir goes with --script (the script to run inside it)")
        return None, None
    script = Path(request.script).expanduser()
    if not script.is_file():
        raise ConfigError(f"--script {request.script} does not exist or is not a file; "
                          "give the path of a Python training script")
    script = script.resolve()
    if not request.code_dir:
        return script, None
    project = Path(request.code_dir).expanduser().resolve()
    if not project.is_dir():
        raise ConfigError(f"--code-dir {request.code_dir} is not a folder")
    if project not in script.parents:
        raise ConfigError(f"--script {request.script} must be inside --code-dir {request.code_dir}")
    return script, project


def _keras_env(settings: Settings, request: TrainRequest, script: Path | None) -> dict[str, str]:
    """TF_USE_LEGACY_KERAS for the workers. The bundled trainer always uses tf_keras; a script gets
    tf_keras for tf.keras by default, because Keras 3's model.fit fails under MultiWorkerMirroredStrategy
    with 2+ workers (keras-team/keras#20585), and the tutorials' scripts use tf.keras with fit."""
    if request.keras is not None and script is None:
        raise ConfigError("--keras goes with --script; the bundled trainer always uses tf_keras")
    # "0" rather than unset: a TF_USE_LEGACY_KERAS=1 in the launcher's own shell must not leak in.
    return {"TF_USE_LEGACY_KERAS": "1" if script is None or settings.keras == "2" else "0"}


def _check_detach(request: TrainRequest) -> None:
    """What needs this launcher attached: restarts, and removing the cluster from here at the end."""
    if request.detach and request.retries is not None:
        raise ConfigError("--retries needs the launcher attached (it restarts the workers after a failure); drop "
                          "--detach, or --retries")
    if request.detach and request.then == "down":
        raise ConfigError("--then down removes the cluster from this launcher, which --detach leaves; run `invoke "
                          "down` when `invoke status` says the run ended (gcp: --then stop halts the VMs by themselves)")


def train(settings: Settings, request: TrainRequest) -> RunRecord | None:
    limit = stall_limit(request.stall_minutes)
    then = _then_action(request.then)
    _check_detach(request)
    store = StateStore(settings)
    cluster = require_up_cluster(store)
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
    requirements = script_requirements.read(request.requirements, backend.installs_requirements_in_job, image)
    note = script_layout.worker_count_note(script.name, script.read_text(errors="replace"), workers) if script else None
    if note:  # Once, before anything starts: the launcher knows the layout the script guesses.
        console.print(Text.assemble(("! ", "yellow"), note), soft_wrap=True)

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
                      args=list(request.trainer_args), requirements=requirements.content
                      if requirements is not None and backend.installs_requirements_in_job else None)
    short = batch_fit.short_data_note(data_dir, payload.args, len(hosts) * backend.replicas_per_machine(settings)) \
        if script is None else None
    if short:
        console.print(Text.assemble(("! ", "yellow"), short), soft_wrap=True)
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
    # `stop` or `down` from another shell is seen at every step (tfcluster/holds.py LauncherLease).
    with holds.LauncherLease(store, run_id):
        run, failed = _launch(settings, store, backend, cluster, request, Launch(
            run_id, hosts, payload, common_env, image, data_dir, keras_env["TF_USE_LEGACY_KERAS"] == "1", workers,
            retries, limit, then, usd, rate, requirements))
    if request.detach:
        return run
    if then is not None and run.outcome != "stopped":  # After Ctrl-C, `stop` or `down` the user decides.
        _then(settings, store, backend, run, then)
    if failed is not None:
        raise failed
    return run


@dataclass
class Launch:
    """What `train` worked out before anything starts."""

    run_id: str
    # The workers' hosts, what they get (code, data, interpreter, arguments) and their environment.
    hosts: list
    payload: Payload
    env: dict
    # The container image ("" = none) and the local data folder to ship (None: remote or none).
    image: str
    data_dir: Path | None
    # Whether tf.keras is tf_keras on the workers (the preflight checks it is installed).
    need_tf_keras: bool
    workers: int
    retries: int
    limit: stall.StallLimit
    then: str | None
    # --budget in USD (0: none) and the cluster's hourly rate (None without prices).
    usd: float
    rate: float | None
    # --requirements, read (None: none): installed on every host after the preflight.
    requirements: script_requirements.Requirements | None = None


def _launch(settings: Settings, store: StateStore, backend, cluster: ClusterState, request: TrainRequest,
            plan: Launch) -> tuple[RunRecord, TrainingFailed | None]:
    """Check, stage and run the attempts (``--detach``: start the first and return); the run and how it
    failed (None: it succeeded, or runs on detached)."""
    run_id, hosts, payload, common_env, image, data_dir = (plan.run_id, plan.hosts, plan.payload, plan.env,
                                                           plan.image, plan.data_dir)
    workers, retries, limit, then, usd, rate = plan.workers, plan.retries, plan.limit, plan.then, plan.usd, plan.rate
    if active_run(store, cluster):
        raise ClusterError(f"a run is still active on cluster '{cluster.name}'; "
                           "watch it with `invoke logs --follow` or end it with `invoke stop`")
    if plan.requirements is not None and payload.requirements is None:  # Before the preflight: the file
        # may be what brings TensorFlow. (A cloud job's bootstrap installs it: it went with the payload.)
        with console.status(f"Installing {plan.requirements.given} on {len(hosts)} {cluster.backend} host(s)..."):
            installed = script_requirements.install(plan.requirements, hosts, payload.python, str(store.root),
                                                    shared_interpreter=cluster.backend == "local")
        for line in installed:
            console.print(f"Requirements on {line}", soft_wrap=True, markup=False)

    def preflight() -> None:
        with console.status(f"Preflight on {len(hosts)} {cluster.backend} host(s)..."):
            # tf_keras must be importable wherever tf.keras resolves to it.
            backend.preflight(cluster, hosts, need_tensorflow=plan.need_tf_keras, image=image)

    def replace_workers(names: list[str]) -> None:
        nonlocal hosts
        backend.replace_machines(cluster, settings, names)
        store.save_cluster(cluster)
        hosts = backend.hosts(cluster)[:workers]  # Re-created VMs have new addresses and host keys.

    # A VM whose GPUs fail the check is re-created under --retries, as a deleted one is; own hosts refuse.
    gpu_health.checked_replacing(preflight, replace_workers if backend.can_replace_machines else None, retries,
                                 lambda line: console.print(Text.assemble(("↻ ", "yellow"), line), soft_wrap=True))
    if data_dir == store.synthetic_data_dir:
        ensure_synthetic_data(store, sys.executable)
    with console.status("Staging code and data..."):
        staged = backend.stage(cluster, hosts, run_id, payload)
    skipped = [name for name, uploaded in staged.uploaded.items() if not uploaded]
    if cluster.backend != "local":
        console.print(f"Code and data: uploaded to {len(staged.uploaded) - len(skipped)} of {len(staged.uploaded)} "
                      f"place(s) ({', '.join(staged.uploaded)}), unchanged (same content hash) on {len(skipped)}.",
                      soft_wrap=True)
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
    if payload.script is not None:  # Its global batch and learning rate, for the summary (it reports neither).
        run.summary["script"] = script_facts.read(payload.script.read_text(errors="replace"), payload.args, workers,
                                                  int(common_env["TFCLUSTER_REPLICAS"]))
    store.save_run(run)
    # What `train --resume` needs to start the same workers again (code and data stay on the hosts).
    # And, should the cluster move zones mid-run, what its new VMs need staged (commands/restage.py).
    (store.run_dir(run_id) / LAUNCH_FILE).write_text(json.dumps({"env": {**common_env, **staged.env},
                                                                 "payload": restage.saved(payload),
                                                                 "stall_minutes": limit.minutes,
                                                                 "requirements": script_requirements.saved(
                                                                     plan.requirements)}))
    backend.set_stall_minutes(cluster, limit.minutes)  # The watchdogs hold it with the laptop gone.
    budget = RunBudget(run_id, usd, rate, time.time()) if usd else None
    backend.set_budget_end(cluster, budget.end_time if budget else None)  # Halts the VMs then, laptop or not.
    if then is not None and backend.can_halt_machines:  # Each VM halts itself at the run's end if this launcher is gone.
        backend.arm_then_stop(cluster, run.run_id, last_attempt=retries + 1)
    if request.detach:
        return _detached(store, cluster, run, plans), None
    try:
        run_attempts(settings, store, backend, run, plans, verbose=request.verbose, stall_limit=limit, budget=budget)
    except TrainingFailed as error:
        return run, error
    finally:  # The launcher saw the run end: no halt is left armed (best effort: --then down took the VMs).
        if budget is not None and (still := store.load_cluster()) is not None:
            with contextlib.suppress(TfClusterError):
                backend.set_budget_end(still, None)
    return run, None


def _detached(store: StateStore, cluster: ClusterState, run: RunRecord, plans: list) -> RunRecord:
    """`train --detach`: the first attempt started, its launcher gone at once (the job outlives it)."""
    run.attempts = 1
    store.save_run(run)
    launch.start_attempt(plans, 1)
    name = f" --cluster {cluster.name}" if cluster.name != "default" else ""
    console.print(f"[green]✓[/] Run {run.run_id} started on {len(plans)} worker(s), detached. Follow it with "
                  f"`invoke logs --follow{name}`, see it with `invoke status{name}`, end it with `invoke stop{name}`.",
                  soft_wrap=True)
    return run


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


def _print_plan(plans: list[launch.WorkerPlan]) -> None:
    for plan in plans:
        colour = ui.worker_colour(plan.index)
        console.print(f"[bold {colour}]{plan.name}[/] ({plan.task}) on {plan.host.record.endpoint}")
        console.print(f"  command:   {shlex.join(plan.argv)}")
        if plan.container is not None:
            console.print(f"  image:     {plan.container.image} (container {plan.container_name(1)})")
        console.print("  TF_CONFIG: " + json.dumps(json.loads(plan.tf_config)), soft_wrap=True)
    console.print("[dim]Dry run: nothing was started.[/]")
