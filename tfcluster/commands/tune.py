"""`tune`: a Keras Tuner search over the cluster: the oracle beside the chief, one tuner per worker.

Every process runs the same program (the bundled `trainer.tune`, or the user's script under
trainer/tune_hooks.py); ``KERASTUNER_TUNER_ID`` makes one of them the oracle ("chief") and the
others tuners, and ``KERASTUNER_ORACLE_IP``/``PORT`` tell the tuners where it listens.
The shared Keras Tuner folder (``TFCLUSTER_TUNE_DIR``, also the processes' working folder):
local: ``<run>/tune`` for all; ssh: ``<run folder on each host>/tune``, gathered into the local
``<run>/tune`` at the end; gcp: ``gs://<bucket>/tune/<run>/``.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from tfcluster import holds, ui
from tfcluster.backends import Payload
from tfcluster.backends.local import PROJECT_ROOT
from tfcluster.commands.common import active_run, backend_for_cluster, console, require_up_cluster
from tfcluster.commands.train import _script_and_project, _worker_count, ensure_synthetic_data
from tfcluster.commands.tune_loop import run_search
from tfcluster.commands.tune_plans import build_tune_plans
from tfcluster.config import Settings, parse_int
from tfcluster.ports import free_ports, port_range
from tfcluster.errors import ClusterError, ConfigError
from tfcluster.state import RunRecord, StateStore

HOOKS = "tfcluster_tune_hooks.py"  # trainer/tune_hooks.py, copied into each run folder.


@dataclass
class TuneRequest:
    # Workers (= tuners) to use; None means all of the cluster's.
    workers: int | None
    # A user's Keras Tuner script instead of the bundled search (trainer/tune.py).
    script: str | None
    # --code-dir: the folder shipped with --script to remote hosts (it must contain the script).
    code_dir: str | None
    # Arguments after `--`, passed to every process (oracle and tuners).
    trainer_args: list[str]
    # Trials in the search (None: the trainer's default, or what the script sets).
    max_trials: int | None
    # Restarts of dead processes allowed (None: the configured default).
    retries: int | None
    # Print each process's command and environment and start nothing.
    dry_run: bool


def _max_trials(value) -> int | None:
    if value is None:
        return None
    try:
        number = int(str(value).strip())
    except ValueError:
        number = 0
    if number < 1 or isinstance(value, bool):
        raise ConfigError(f"--max-trials must be a whole number >= 1 (got {value}); for example --max-trials 12")
    return number


def tune(settings: Settings, request: TuneRequest) -> RunRecord | None:
    max_trials = _max_trials(request.max_trials)
    store = StateStore(settings)
    cluster = require_up_cluster(store)
    workers = _worker_count(request.workers, cluster)
    retries = settings.retries if request.retries is None else parse_int("retries", request.retries, 0)
    script, project = _script_and_project(request)
    backend = backend_for_cluster(store, cluster)
    if backend.tune_unsupported:
        raise ConfigError(backend.tune_unsupported)
    hosts = backend.hosts(cluster)[:workers]
    python = settings.python or (sys.executable if cluster.backend == "local" else cluster.python)

    data_dir: Path | None = None  # Local TFRecords, shipped to remote hosts.
    # As `train`: a configured gs:// or local folder, the bucket copy `invoke data` made, the synthetic set.
    remote_data = settings.data_dir if settings.data_dir.startswith("gs://") else (
        "" if settings.data_dir else cluster.data_url)
    if settings.data_dir and not remote_data:
        data_dir = Path(settings.data_dir).expanduser()
        if not (data_dir / "manifest.json").exists():
            raise ConfigError(f"data_dir {settings.data_dir} has no manifest.json; create it with "
                              "`invoke data --src IMAGES --out DIR`")
    elif not remote_data and script is None:
        data_dir = store.default_data_dir()
    args = list(request.trainer_args)
    if script is None and max_trials is not None:
        args += ["--max-trials", str(max_trials)]
    run_id = store.new_run_id()
    # Local: any free loopback port. Own hosts and VMs: the configured one (the gcp firewall opens it).
    oracle_port = (free_ports(1, within=port_range(settings.local_ports),
                              avoid=frozenset(host.tf_port for host in cluster.hosts))[0]
                   if cluster.backend == "local" else settings.oracle_port)
    tune_dir = f"gs://{cluster.bucket}/tune/{run_id}" if cluster.bucket else "{run_root}/tune"
    env = {"TFCLUSTER_CLUSTER_ID": cluster.cluster_id,
           "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    if remote_data:
        env["TFCLUSTER_DATA_DIR"] = remote_data
    if script is not None and max_trials is not None:
        env["TFCLUSTER_MAX_TRIALS"] = str(max_trials)  # The hook sets the script's oracle.max_trials.

    if request.dry_run:
        argv = ([python, "-u", "-m", "trainer.tune"] if script is None
                else [python, "-u", f"{{run_root}}/{HOOKS}", str(script)])
        _print_plan(build_tune_plans(hosts, run_id, argv + args, env, oracle_port, tune_dir))
        return None

    holds.refuse_while_held(store)  # `down` (or `up`) holds the cluster: say who, before any run of it is looked at.
    if active_run(store, cluster):
        raise ClusterError(f"a run is still active on cluster '{cluster.name}'; "
                           "watch it with `invoke logs --follow` or end it with `invoke stop`")
    with console.status(f"Preflight on {len(hosts)} {cluster.backend} host(s)..."):
        backend.preflight(cluster, hosts, need_tensorflow=script is None)
        backend.require_modules(cluster, hosts, ["keras_tuner"])
        if cluster.backend != "local" and hosts[0].port_in_use(oracle_port):
            raise ClusterError(f"oracle port {oracle_port} is already in use on {hosts[0].record.name} "
                               f"({hosts[0].record.address}); free it or choose another with --oracle-port")
    if data_dir == store.synthetic_data_dir:
        ensure_synthetic_data(store, sys.executable)
    payload = Payload(python=python, script=script, project=project, data_dir=data_dir, args=args)
    with console.status("Staging code and data..."):
        staged = backend.stage(cluster, hosts, run_id, payload)
        hooks = (PROJECT_ROOT / "trainer" / "tune_hooks.py").read_bytes()
        for host in hosts:
            host.write_file(f"{host.run_root(run_id)}/{HOOKS}", hooks)
            if "://" not in tune_dir:  # The processes start in it: create it first.
                host.write_file(tune_dir.replace("{run_root}", host.run_root(run_id)) + "/.tfcluster", b"")
    argv = list(staged.argv)
    if script is None:
        argv[argv.index("trainer.task")] = "trainer.tune"
    else:
        argv.insert(argv.index("-u") + 1, f"{{run_root}}/{HOOKS}")
    plans = build_tune_plans(hosts, run_id, argv, {**env, **staged.env}, oracle_port, tune_dir)
    run = RunRecord(run_id=run_id, cluster=cluster.name, workers=workers, command=argv, retries=retries,
                    kind="tune", oracle_port=oracle_port)
    store.save_run(run)
    with holds.LauncherLease(store, run_id, "`invoke tune`"):  # `stop` and `down` wait for this launcher (tfcluster/holds.py).
        return run_search(settings, store, backend, run, plans, bundled=script is None,
                          local_tune_dir=None if "://" in tune_dir else store.run_dir(run_id) / "tune")


def _print_plan(plans) -> None:
    for plan in plans:
        colour = ui.worker_colour(plan.index)
        console.print(f"[bold {colour}]{plan.name}[/] ({plan.task}) on {plan.host.record.address}")
        console.print(f"  command: {shlex.join(plan.argv)}", soft_wrap=True)
        for key, value in sorted(plan.env.items()):
            console.print(f"  {key}={shlex.quote(value)}", soft_wrap=True)
    console.print("[dim]Staging adds PYTHONPATH (the code) and TFCLUSTER_DATA_DIR (the data) on each host. "
                  "Dry run: nothing was started.[/]")
