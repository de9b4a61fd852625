"""The tasks: those of the installed `tfcluster` command (tfcluster/program.py, from any folder) and
of `invoke` in a clone (tasks.py re-exports ``ns``). `tfcluster --list` shows them, `tfcluster --help TASK`
explains one.

Thin by design: parse options, call tfcluster.commands, turn user errors into one line.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shlex
import sys
from collections.abc import Mapping
from typing import Optional

from invoke import Collection, Context, Exit, Task
from invoke import task as invoke_task

from tfcluster import commands, config, errors, provisioning, sources, spoken, ui
from tfcluster.errors import ConfigError, TfClusterError


# INVOKE_TFCLUSTER_* as given, taken out of the environment before invoke reads it (take_environment).
_ENVIRONMENT: dict[str, str] = {}


def take_environment() -> None:
    """Read INVOKE_TFCLUSTER_* here, as text, and leave invoke none to read: invoke casts a variable
    to the type of the value invoke.yaml gave the key (`workers: 3` makes INVOKE_TFCLUSTER_WORKERS=abc
    a traceback, and "false" is true for a yes/no). config.load checks each with one error line."""
    _ENVIRONMENT.update(config.take_environment(os.environ))


def _settings(c: Context, **overrides) -> config.Settings:
    values = c.config.get("tfcluster", {})
    if isinstance(values, Mapping):  # Else config.load names what invoke.yaml holds instead.
        values = {**values, **_ENVIRONMENT}
    settings = config.load(values, **overrides)
    commands.adopt_project_state(settings)  # A ./.tfcluster from before the per-user folder moves there, once.
    return settings


# The only short flags, the same on every task that has the option. invoke would give each flag the first
# free letter of its name: `-a` was --detach on train, --all on status and --raw on logs.
SHORT_FLAGS = {"workers": "w", "cluster": "c", "follow": "f"}


class _Task(Task):
    """`-h` is help on every task: never a flag's short name (invoke gave `--then` and `--shards` `h`);
    the other short flags are SHORT_FLAGS'."""

    def arg_opts(self, name: str, default, taken_names: set):
        opts = super().arg_opts(name, default, taken_names | {"h"})
        short = SHORT_FLAGS.get(name)
        opts["names"] = [opts["names"][0], *([short] if short and short not in taken_names else [])]
        return opts


def task(*args, **kwargs):
    return invoke_task(*args, klass=_Task, **kwargs)


def _user_errors(body):
    """Show TfClusterError, and a file this machine refuses to write (a read-only or full state folder),
    as one `error: ...` line and a non-zero exit, never a traceback."""

    @functools.wraps(body)
    def wrapper(c, *args, **kwargs):
        try:
            return body(c, *args, **kwargs)
        except TfClusterError as error:
            raise Exit(f"error: {spoken.respell(str(error))}", code=error.exit_code) from None
        except BrokenPipeError:  # The reader went away (`| head`): stop quietly, as a shell tool does.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's own last flush too.
            raise Exit(code=141) from None  # 128 + SIGPIPE, what a shell reports.
        except OSError as error:
            raise Exit(f"error: {spoken.respell(errors.file_error(error))}", code=2) from None
        except ModuleNotFoundError as error:  # Google's libraries are an extra (`tfcluster[gcp]`).
            if errors.missing_google_library(error) is None:
                raise
            raise Exit(f"error: {errors.missing_google_library(error)}", code=2) from None

    return wrapper


spoken.respell_console(ui.console)  # Every hint the console prints names the command the user runs.


@task(auto_shortflags=False,
      help={"workers": "number of workers (default: tfcluster.workers, 3)",
            "backend": "local (default), ssh, gcp or vertex", "cluster": "cluster name (default: default)",
            "hosts": "ssh: HOST[:SSHPORT],... one worker each",
            "ssh_user": "ssh: login user (default root)",
            "ssh_key": "ssh: private key file (default ~/.ssh/id_ed25519)",
            "known_hosts": "ssh: known_hosts file that vouches for the hosts (default ~/.ssh/known_hosts)",
            "trust_new_hosts": "ssh: pin keys of hosts missing from known_hosts (prints fingerprints)",
            "tf_port": "ssh: TensorFlow port on every host (default 23456)",
            "python": "interpreter that runs the workers (ssh default: python3)",
            "project": "gcp: project ID", "zone": "gcp: zone, e.g. us-west1-b",
            "region": "vertex: region of the jobs, e.g. us-central1 (default: the zone's)",
            "gpu": "gcp: t4, v100, l4, a100, a100-80gb or h100", "gpu_count": "gcp: GPUs per VM (default 1)",
            "machine_type": "gcp: machine type (default: n1-standard-8, or the GPU's G2/A2/A3 type for gpu_count)",
            **provisioning.UP_HELP,
            "operator_cidr": "gcp: only source allowed to SSH in (default: your public IP/32)",
            "idle_minutes": "idle watchdog: minutes before acting, 0 = off (default 30)",
            "idle_action": "idle watchdog: stop or delete (default stop)",
            "max_run_hours": "gcp: hypervisor deadline in hours (default 12)",
            "budget": "gcp: cap the cluster at USD: each VM's hypervisor deadline is set so it cannot bill past it",
            "image": "container image the workers run in; pulled on every host now",
            "boot_image": "gcp: VM boot image, projects/P/global/images/NAME or .../family/FAMILY",
            "ssh_identity": "gcp: oslogin, metadata or auto (default: OS Login where the project requires it)",
            "yes": "gcp: create without asking (on a terminal `up` shows the hourly cost and asks first)"})
@_user_errors
def up(c, workers: Optional[int] = None, backend: Optional[str] = None,
       cluster: Optional[str] = None, hosts: Optional[str] = None, ssh_user: Optional[str] = None,
       ssh_key: Optional[str] = None, known_hosts: Optional[str] = None,
       trust_new_hosts: bool = False, tf_port: Optional[int] = None, python: Optional[str] = None,
       project: Optional[str] = None, zone: Optional[str] = None, gpu: Optional[str] = None,
       gpu_count: Optional[int] = None, machine_type: Optional[str] = None, spot: bool = False,
       operator_cidr: Optional[str] = None, idle_minutes: Optional[int] = None,
       idle_action: Optional[str] = None, max_run_hours: Optional[int] = None,
       image: Optional[str] = None, boot_image: Optional[str] = None, budget: Optional[str] = None,
       yes: bool = False, region: Optional[str] = None, provisioning: Optional[str] = None,
       reservation: Optional[str] = None, capacity: Optional[str] = None, capacity_wait: Optional[float] = None,
       ssh_identity: Optional[str] = None):
    """Create the cluster. Idempotent: running it twice changes nothing."""
    if hosts and workers is None and backend in (None, "ssh"):
        workers = len([h for h in hosts.split(",") if h.strip()])  # One worker per host given.
    settings = _settings(c, workers=workers, backend=backend, cluster=cluster, hosts=hosts,
                         ssh_user=ssh_user, ssh_key=ssh_key, known_hosts=known_hosts,
                         trust_new_hosts=trust_new_hosts or None, tf_port=tf_port, python=python,
                         project=project, zone=zone, gpu=gpu, gpu_count=gpu_count,
                         machine_type=machine_type, spot=spot or None, operator_cidr=operator_cidr,
                         idle_minutes=idle_minutes, idle_action=idle_action,
                         max_run_hours=max_run_hours, image=image, boot_image=boot_image, budget=budget,
                         region=region, provisioning=provisioning, reservation=reservation, capacity=capacity,
                         capacity_wait_minutes=capacity_wait, ssh_identity=ssh_identity)
    sources.check_backend_flags(settings.backend, {"ssh_identity": ssh_identity,
        "hosts": hosts, "ssh_user": ssh_user, "ssh_key": ssh_key, "known_hosts": known_hosts,
        "trust_new_hosts": trust_new_hosts, "tf_port": tf_port, "project": project, "zone": zone, "gpu": gpu,
        "gpu_count": gpu_count, "machine_type": machine_type, "spot": spot, "operator_cidr": operator_cidr,
        "idle_minutes": idle_minutes, "idle_action": idle_action, "max_run_hours": max_run_hours,
        "budget": budget, "boot_image": boot_image, "region": region, "provisioning": provisioning,
        "reservation": reservation, "capacity": capacity, "capacity_wait": capacity_wait})
    if idle_minutes is not None and settings.backend == "ssh":  # Own hosts get a watchdog when asked for one.
        settings = dataclasses.replace(settings, install_watchdog=True)
    commands.up(settings, yes=yes)


def _refuse_project(task_name: str, project: Optional[str]) -> None:
    """--project is a Google Cloud project on every task; the folder `train` and `tune` ship was once
    --project too, and a Vertex AI user types `train --project my-gcp-proj`: name both."""
    if project is not None:
        raise ConfigError(f"{task_name} takes no --project: the Google Cloud project is the cluster's (`invoke up "
                          f"--project P`), and a folder shipped with --script is --code-dir: invoke {task_name} "
                          f"--script SCRIPT --code-dir {project}")


@task(help={
    "workers": "workers to use, 1..cluster size (default: all)",
    "script": "your own TensorFlow script instead of the bundled trainer",
    "code_dir": "with --script: a folder shipped to the hosts with it (honours .tfclusterignore)",
    "project": "refused: the cluster's Google Cloud project is `up`'s; the folder to ship is --code-dir",
    "requirements": "a pip requirements file installed on every host before the run, into the workers' Python "
                    "(cached by its content: an unchanged file installs nothing)",
    "retries": "restart everything up to K times after a failure, resuming from the checkpoint",
    "dry_run": "print each worker's command and TF_CONFIG, start nothing",
    "detach": "start the run and return; follow it with `logs --follow`, see it with `status`",
    "keras": "with --script: what tf.keras is, 2 (default: tf_keras, because Keras 3's model.fit fails "
             "under MultiWorkerMirroredStrategy with 2+ workers, keras-team/keras#20585) or 3 (Keras 3: "
             "train with a custom loop and strategy.run, which works)",
    "verbose": "show every worker line, TensorFlow's start-up noise included (the logs always have it)",
    "cluster": "cluster name (default: default)",
    "image": "run each worker in this container image (default: tfcluster.image, or the one `up` pulled)",
    "stall_minutes": "end an attempt that makes no progress for this long (default: the larger of 10 min and "
                     "20 median steps, or 30 min and 3 x the longest gap between a script's lines); 0 = off",
    "then": "stop (gcp): halt the VMs, down: remove the cluster, when the run ends, succeeded or failed "
            "(not after Ctrl-C); with the laptop gone each VM halts itself",
    "budget": "cap the run at USD (gcp): after 20 steps a run projected over it stops, backed up, and exits 2; "
              "the VMs halt at the budget's end time, laptop or not",
    "resume": "bring back run RUN (e.g. after a preemption while no launcher ran): restart its stopped "
              "VMs and resume it from its backup",
})
@_user_errors
def train(c, workers: Optional[int] = None, script: Optional[str] = None, code_dir: Optional[str] = None,
          project: Optional[str] = None, requirements: Optional[str] = None, retries: Optional[int] = None,
          dry_run: bool = False,
          keras: Optional[str] = None, verbose: bool = False, cluster: Optional[str] = None,
          image: Optional[str] = None, resume: Optional[str] = None, stall_minutes: Optional[int] = None,
          then: Optional[str] = None, budget: Optional[str] = None, detach: bool = False):
    """Train on the cluster; arguments after `--` go to the trainer (e.g. -- --epochs 5)."""
    _refuse_project("train", project)
    settings = _settings(c, cluster=cluster, keras=keras)
    if resume:
        if then:
            raise ConfigError("--then goes with a new run, not with --resume; after it, `invoke down` removes "
                              "the cluster")
        commands.resume(settings, resume, retries=retries, verbose=verbose, stall_minutes=stall_minutes)
        return
    commands.train(settings, commands.TrainRequest(
        workers=workers, script=script, code_dir=code_dir, trainer_args=shlex.split(c.remainder or ""),
        requirements=requirements, retries=retries, dry_run=dry_run, keras=keras, verbose=verbose, image=image,
        stall_minutes=stall_minutes, then=then, budget=budget, detach=detach))


@task(help={
    "workers": "tuners to run, one per worker, 1..cluster size (default: all)",
    "script": "your own Keras Tuner script instead of the bundled search (trainer/tune.py)",
    "code_dir": "with --script: a folder shipped to the hosts with it (honours .tfclusterignore)",
    "project": "refused: the cluster's Google Cloud project is `up`'s; the folder to ship is --code-dir",
    "max_trials": "trials in the search (default: the trainer's 10, or what the script sets)",
    "retries": "restart dead processes up to K times; a tuner's unfinished trial is handed out again",
    "oracle_port": "ssh/gcp: the oracle's port on the chief's machine (default 23457)",
    "dry_run": "print each process's command and environment, start nothing",
    "cluster": "cluster name (default: default)",
})
@_user_errors
def tune(c, workers: Optional[int] = None, script: Optional[str] = None, code_dir: Optional[str] = None,
         project: Optional[str] = None,
         max_trials: Optional[int] = None, retries: Optional[int] = None, oracle_port: Optional[int] = None,
         dry_run: bool = False, cluster: Optional[str] = None):
    """Search hyperparameters: the oracle beside the chief, one tuner per worker (-- ARGS to every process)."""
    _refuse_project("tune", project)
    settings = _settings(c, cluster=cluster, oracle_port=oracle_port)
    commands.tune(settings, commands.TuneRequest(
        workers=workers, script=script, code_dir=code_dir, trainer_args=shlex.split(c.remainder or ""),
        max_trials=max_trials, retries=retries, dry_run=dry_run))


@task(name="status", help={"cluster": "cluster name (default: default)",
                           "all": "every cluster of the state folder: backend, workers, latest run, cost now"})
@_user_errors
def status(c, cluster: Optional[str] = None, all: bool = False):  # noqa: A002 (the flag is --all)
    """Show the cluster, its workers, and the current or last run (--all: every cluster)."""
    if all and cluster:
        raise ConfigError("--all lists every cluster; drop --cluster, or drop --all to see that one")
    commands.status(_settings(c, cluster=cluster), every=all)


@task
@_user_errors
def costs(c):
    """List what every cluster and run has cost (from the cost ledger, kept after `down`)."""
    commands.costs(_settings(c))


@task(help={"worker": "only this worker's log (0 = chief)",
            "follow": "keep streaming until the run ends (re-attaches to a running job)",
            "run": "a run id (default: the latest)", "cluster": "cluster name (default: default)",
            "raw": "every line as the logs hold it: TensorFlow's start-up noise and the progress events too"})
@_user_errors
def logs(c, worker: Optional[int] = None, follow: bool = False, run: Optional[str] = None,
         cluster: Optional[str] = None, raw: bool = False):
    """Print a run's logs with a per-worker prefix, as `train` shows them (--raw: everything)."""
    state = commands.logs(_settings(c, cluster=cluster), worker, follow, run, raw=raw)
    if follow and state != "succeeded":
        raise Exit(code=1)


@task(help={"cluster": "cluster name (default: default)"})
@_user_errors
def stop(c, cluster: Optional[str] = None):
    """End the current run on every worker."""
    commands.stop(_settings(c, cluster=cluster))


@task(help={"cluster": "cluster name (default: default)",
            "keep": "ssh: keep the run folders on the hosts",
            "force": "ssh: forget the cluster even if a host does not answer (what may stay there is named)",
            "delete_bucket": "gcp: also delete the bucket of results and the registry of images "
                             "(both kept by default when not empty, with their size and cost)"})
@_user_errors
def down(c, cluster: Optional[str] = None, keep: bool = False, delete_bucket: bool = False, force: bool = False):
    """Stop anything running, remove the cluster, and verify nothing is left running or billing."""
    commands.down(_settings(c, cluster=cluster), keep=keep, delete_bucket=delete_bucket, force=force)


@task(auto_shortflags=False,
      help={"backend": "local (default), ssh, gcp or vertex", "project": "gcp: project ID",
            "zone": "gcp: zone, e.g. us-west1-b", "region": "vertex: region of the jobs, e.g. us-central1",
            "gpu": "gcp: t4, v100, l4, a100, a100-80gb or h100",
            "gpu_count": "gcp: GPUs per VM",
            "workers": "number of workers (default: tfcluster.workers, 3)", "spot": "gcp: check for SPOT VMs",
            **provisioning.CHECK_HELP,
            "boot_image": "gcp: projects/P/global/images/NAME or .../images/family/FAMILY "
                          "(default: the Deep Learning VM CUDA family)",
            "operator_cidr": "gcp: only source allowed to SSH in (default: your public IP/32)",
            "ssh_identity": "gcp: oslogin, metadata or auto (default: OS Login where the project requires it)",
            "cluster": "cluster name (default: default)"})
@_user_errors
def check(c, backend: Optional[str] = None, project: Optional[str] = None, zone: Optional[str] = None,
          gpu: Optional[str] = None, gpu_count: Optional[int] = None, workers: Optional[int] = None,
          spot: bool = False, boot_image: Optional[str] = None, operator_cidr: Optional[str] = None,
          cluster: Optional[str] = None, region: Optional[str] = None, provisioning: Optional[str] = None,
          reservation: Optional[str] = None, ssh_identity: Optional[str] = None):
    """Before anything is created: one line per prerequisite (✓, ✗ with the fix, ? when it cannot tell)."""
    settings = _settings(c, backend=backend, project=project, zone=zone, gpu=gpu, gpu_count=gpu_count,
                         workers=workers, spot=spot or None, boot_image=boot_image, operator_cidr=operator_cidr,
                         cluster=cluster, region=region, provisioning=provisioning, reservation=reservation,
                         ssh_identity=ssh_identity)
    sources.check_backend_flags(settings.backend, {"ssh_identity": ssh_identity, "project": project, "zone": zone, "gpu": gpu, "gpu_count": gpu_count,
                                                   "spot": spot, "boot_image": boot_image, "operator_cidr": operator_cidr,
                                                   "region": region, "provisioning": provisioning,
                                                   "reservation": reservation})
    commands.check(settings)


@task(auto_shortflags=False,
      help={"gpu": "t4, v100, l4, a100, a100-80gb or h100 (default: tfcluster.gpu)",
            "gpu_count": "GPUs per VM, which picks the machine type (default: every machine type of the GPU)",
            "spot": "sort by the Spot price and show the Spot quota", "project": "gcp: project ID",
            "backend": "gcp (default: VMs, per zone) or vertex (Vertex AI training, per region)"})
@_user_errors
def offers(c, gpu: Optional[str] = None, gpu_count: Optional[int] = None, spot: bool = False,
           project: Optional[str] = None, backend: Optional[str] = None):
    """What a GPU comes in and costs, in each provisioning model (--gpu-count --project: per zone, with quota).

    Without --gpu-count: every machine type of the GPU, one VM's price an hour on-demand, Spot and
    Flex-start, and the flags that make each. With --gpu-count and --project: every zone that offers
    that VM, its price there and your free quota, cheapest first."""
    # capacity auto: a listing names the machine types offered only as Spot or Flex-start too, with what
    # each needs, rather than refusing them as `up` does without --spot.
    commands.offers(_settings(c, backend=backend or "gcp", gpu=gpu, gpu_count=gpu_count, spot=spot or None,
                              project=project, capacity="auto"), every_shape=gpu_count is None)


@task(help={"src": "image folder with one sub-folder per class",
            "out": "output folder (default: <state folder>/data/<the source folder's name>; `train` reads it next)",
            "synthetic": "generate the built-in coloured-shapes set instead",
            "image_size": "square side in pixels (default 32)",
            "shards": "train shards (default: the larger of 16 and 4 x the cluster's workers)",
            "encoding": "raw (default: fastest to train on) or jpeg (about 10x smaller to upload)",
            "val_fraction": "share held out to validate each epoch (default 0.2)",
            "test_fraction": "share held out for one final test score (default: none)",
            "processes": "decoding processes (default: one per core from 1,000 images)"})
@_user_errors
def data(c, src: Optional[str] = None, out: Optional[str] = None, synthetic: bool = False,
         image_size: Optional[int] = None, shards: Optional[int] = None, encoding: Optional[str] = None,
         val_fraction: Optional[str] = None, test_fraction: Optional[str] = None, processes: Optional[int] = None):
    """Turn an image folder into TFRecord shards (trainer/create_tfrecords.py); upload them to a gcp cluster's bucket."""
    commands.data(_settings(c), src, out, synthetic, image_size, shards, encoding, val_fraction, test_fraction,
                  processes)


@task(help={"minutes": "act after this many idle minutes (1-1440)",
            "off": "disable the watchdog until the next `invoke up` (the hypervisor deadline stays)",
            "cluster": "cluster name (default: default)"})
@_user_errors
def idle(c, minutes: Optional[int] = None, off: bool = False, cluster: Optional[str] = None):
    """Change the idle watchdog on a live cluster (takes effect at its next poll)."""
    commands.idle(_settings(c, cluster=cluster), minutes, off)


@task(help={"run": "a run id (default: the latest)", "cluster": "cluster name (default: default)"})
@_user_errors
def pull(c, run: Optional[str] = None, cluster: Optional[str] = None):
    """Download a run's model and TensorBoard logs from the cluster bucket (gcp)."""
    commands.pull(_settings(c, cluster=cluster), run)


@task(help={"run": "a run id (default: the latest)", "port": "port to serve on (default 6006)",
            "cluster": "cluster name (default: default)"})
@_user_errors
def tensorboard(c, run: Optional[str] = None, port: Optional[int] = None, cluster: Optional[str] = None):
    """Start TensorBoard on a run's logs (local folder or gs://); Ctrl-C stops it."""
    port = 6006 if port is None else config.parse_port("port", port)
    logdir = commands.tensorboard_logdir(_settings(c, cluster=cluster), run)
    print(f"TensorBoard on {logdir} at http://localhost:{port}")
    code = commands.serve_tensorboard(logdir, port)
    if code not in (0, -2, 130):  # Ctrl-C is how it is meant to end.
        raise Exit(code=code)


IMAGE_HELP = {"action": "build (the only action)", "dockerfile": "the Dockerfile (default: ./Dockerfile)",
              "tag": "NAME:VERSION, e.g. trainer:1", "context": "build context folder (default: the Dockerfile's folder)",
              "registry": "push to HOST[:PORT]/PATH (default: tfcluster.registry, or the gcp cluster's)",
              "cluster": "cluster name (default: default)"}


@task(positional=["action"], help=dict(IMAGE_HELP))
@_user_errors
def image(c, action, dockerfile: str = "Dockerfile", tag: Optional[str] = None,
          context: Optional[str] = None, registry: Optional[str] = None, cluster: Optional[str] = None):
    """`invoke image build`: build the trainer image here; push it to the gcp cluster's registry or --registry."""
    if action in ("-h", "--help"):  # invoke hands a help flag to the positional action: help, as on every task.
        print("Usage: image build --tag NAME:VERSION [--dockerfile F] [--context DIR] [--registry R] [--cluster C]\n\n"
              f"{image.__doc__}\n\nOptions:\n" + "\n".join(f"  --{name:<12} {text}" for name, text in IMAGE_HELP.items()))
        return
    if action != "build":
        raise ConfigError(f"unknown image action {action!r}; use: invoke image build --tag NAME:VERSION")
    commands.build_image(_settings(c, cluster=cluster, registry=registry), dockerfile, tag, context)


@task(name="ssh", positional=["worker"], help={"worker": "worker-N (default: worker-0, the chief)",
                                               "cluster": "cluster name (default: default)"})
@_user_errors
def ssh(c, worker: Optional[str] = None, cluster: Optional[str] = None):
    """A shell on a worker's host, in its folder (-- CMD: run that instead); the cluster's key, its pinned host key."""
    code = commands.open_shell(_settings(c, cluster=cluster), worker, c.remainder or "")
    if code:
        raise Exit(code=code)


@task(name="exec", help={"worker": "run on this worker only (default 0, the chief)", "all": "run on every worker",
                         "cluster": "cluster name (default: default)"})
@_user_errors
def exec_(c, worker: Optional[str] = None, all: bool = False, cluster: Optional[str] = None):  # noqa: A002
    """Run -- CMD on one worker or all (--all), in its folder; each line prefixed by its worker, as the logs are."""
    commands.run_on_workers(_settings(c, cluster=cluster), c.remainder or "", worker, all)


ns = Collection(check, offers, up, train, tune, status, costs, logs, stop, down, data, idle, pull, tensorboard, image,
                ssh, exec_)
# No tfcluster defaults are given to invoke: it would merge invoke.yaml's values onto them and refuse a
# mapping where a default is text with a traceback. config.load applies the defaults and checks each
# value, with one error line naming the key.
