"""Workers inside a container image: names, labels, the env file and the `docker run` part of
the worker wrapper. Rendering only, no I/O (the launcher and the backends run what this renders).

The wrapper keeps its contract (.pgid, .pid, .exit, log appended): it starts `docker run`
attached in the background, with output into the worker's log, and records as the program's PID
the container's first process as this host sees it, so liveness, SIGTERM, SIGKILL, `status` and
the clean-up checks act on the real training process, exactly as without an image. The container
is named per run, worker and attempt, so `stop` and `down` can `docker rm -f` it by name even if
the wrapper died before it wrote the PID, and labelled with the cluster id, so `down` can prove
that none is left.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

LABEL_CLUSTER = "tfcluster.cluster-id"
LABEL_RUN = "tfcluster.run"
LABEL_WORKER = "tfcluster.worker"

# The container's first process. PID 1 of a PID namespace ignores signals it has no handler
# for (see pid_namespaces(7)), so a bare `python` would ignore `stop`'s SIGTERM; this /bin/sh
# forwards TERM and INT to the program and exits with its status. (Docker's --init would do
# the same but needs docker-init, which Debian's docker.io does not ship.)
INIT = ("trap 'kill -TERM $p 2>/dev/null' TERM INT; \"$@\" & p=$!; wait $p; s=$?; "
        "while kill -0 $p 2>/dev/null; do wait $p; s=$?; done; exit $s")

# Python inside the image (the image provides Python and TensorFlow; the code is mounted).
IMAGE_PYTHON = "python3"


@dataclass
class ContainerSpec:
    # Image reference, e.g. us-docker.pkg.dev/P/REPO/trainer:1 or trainer:1.
    image: str
    # Host folders mounted at the same path (code, data); the run folder is always mounted.
    mounts: list[str] = field(default_factory=list)


def container_name(run_id: str, index: int, attempt: int) -> str:
    """Unique per run, worker and attempt; run ids are [a-z0-9-], as Docker names allow."""
    return f"tfc-{run_id}-w{index}-a{attempt}"


def env_file(env: dict[str, str]) -> bytes:
    """`docker run --env-file` content: KEY=VALUE per line, taken literally (no quoting)."""
    bad = sorted(key for key, value in env.items() if "\n" in value or "\0" in value)
    if bad:
        raise ValueError(f"environment values with a newline cannot go into an env file: {', '.join(bad)}")
    return "".join(f"{key}={value}\n" for key, value in sorted(env.items())).encode()


# NCCL_DEBUG and NCCL_DEBUG_SUBSYS, as the wrapper's GPU probe exports them (collective.GPU_PROBE: on GPU
# hosts, unless the user set them), reach the container by name: docker reads the env file, not this
# shell ("--env VAR" takes VAR's value from the client's environment). Passed only when set: a bare
# name that is unset may blank an image's own ENV value (docker/cli#1780).
NCCL_PASS = "".join(f'if [ -n "${{{name}+x}}" ]; then set -- "$@" --env {name}; fi\n'
                    for name in ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS"))


def wrapper_start(spec: ContainerSpec, name: str, labels: dict[str, str], env_path: str, workdir: str,
                  run_root: str, argv: list[str], log_path: str, pid_path: str) -> str:
    """Shell lines that start the container, write the PID file and end with `wait` on
    `docker run`, whose exit status is the program's (137 when the container was killed)."""
    q = shlex.quote
    mounts = []
    for path in dict.fromkeys([run_root, *spec.mounts]):  # Ordered, no duplicate mount points.
        mounts += ["--volume", f"{path}:{path}"]
    label_args = [arg for key, value in sorted(labels.items()) for arg in ("--label", f"{key}={value}")]
    run = ["docker", "run", "--rm", "--name", name, *label_args, "--network", "host",
           "--env-file", env_path, "--env", "HOME=/tmp", "--workdir", workdir, *mounts,
           "--entrypoint", "/bin/sh", spec.image, "-c", INIT, "tfcluster-init", *argv]
    return f"""# The container runs as this login, so files in the run folder stay its own.
set -- --user "$(id -u):$(id -g)"
if ls /dev/nvidia[0-9]* >/dev/null 2>&1; then set -- "$@" --gpus all; fi
{NCCL_PASS}{shlex.join(run[:2])} "$@" {shlex.join(run[2:])} >> {q(log_path)} 2>&1 </dev/null &
c=$!
p=
while kill -0 $c 2>/dev/null; do
  p=$(docker inspect --format '{{{{.State.Pid}}}}' {q(name)} 2>/dev/null)
  case "$p" in ''|0) p=; sleep 0.1;; *) break;; esac
done
echo "${{p:-$c}}" > {q(pid_path)}
wait $c"""


def remove_argv(names: list[str]) -> list[str]:
    """Kill and remove containers by name; a missing one is not an error (see remove_ok)."""
    return ["docker", "rm", "--force", *names]


def list_argv(cluster_id: str) -> list[str]:
    """Names of every container (running or not) of the cluster."""
    return ["docker", "ps", "--all", "--filter", f"label={LABEL_CLUSTER}={cluster_id}",
            "--format", "{{.Names}}"]
