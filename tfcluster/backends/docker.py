"""Docker on the worker hosts: preflight for `train --image`, the pre-pull of `up`, and the
containers of a cluster (found by label) for `down`. Every command goes through
WorkerHost.run_command, so the same code serves this machine and SSH hosts."""

from __future__ import annotations

import json
from tfcluster import container
from tfcluster.backends.group import in_parallel
from tfcluster.backends.host import WorkerHost
from tfcluster.errors import ClusterError

PULL_TIMEOUT = 1800.0  # A TensorFlow GPU image is several GB.


def distinct_hosts(hosts: list[WorkerHost]) -> list[WorkerHost]:
    """One host per machine (several workers may share one Docker daemon)."""
    seen: dict[tuple[str, str, int], WorkerHost] = {}
    for host in hosts:
        record = host.record
        seen.setdefault((record.ssh_address or record.address, record.address, record.ssh_port), host)
    return list(seen.values())


def _label(host: WorkerHost) -> str:
    return f"{host.record.name} ({host.record.ssh_address or host.record.address})"


def check_docker(host: WorkerHost) -> None:
    """A working Docker daemon the login may use; on a GPU machine, also the NVIDIA runtime."""
    version = host.run_command(["docker", "version", "--format", "{{.Server.Version}}"], timeout=30)
    if version.code == 127:
        raise ClusterError("Docker is not installed; install it (apt-get install docker.io, or Docker's "
                           "docker-ce) and start the daemon, or train without --image")
    if version.code != 0:
        if "permission denied" in version.output.lower():
            raise ClusterError("the login may not use Docker (permission denied on /var/run/docker.sock); "
                               "add it to the docker group: sudo usermod -aG docker $USER")
        raise ClusterError(f"the Docker daemon does not answer ({version.last_line}); start it: "
                           "sudo systemctl start docker")
    if host.run_command(["sh", "-c", "ls /dev/nvidia[0-9]*"], timeout=30).code == 0:
        info = host.run_command(["docker", "info", "--format", "{{json .Runtimes}}"], timeout=30)
        runtimes = json.loads(info.stdout) if info.code == 0 and info.stdout.strip().startswith("{") else {}
        if "nvidia" not in runtimes:
            raise ClusterError("this host has an NVIDIA GPU but Docker has no NVIDIA runtime, so "
                               "`--gpus all` fails; install nvidia-container-toolkit, then run "
                               "`sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker`")


def image_id(host: WorkerHost, image: str) -> str | None:
    inspected = host.run_command(["docker", "image", "inspect", "--format", "{{.Id}}", image], timeout=30)
    identity = inspected.stdout.strip()
    return identity if inspected.code == 0 and identity.startswith("sha256:") else None


def ensure_image(host: WorkerHost, image: str) -> str:
    """The image is on the host, pulled if needed; returns "present" or "pulled"."""
    if image_id(host, image):
        return "present"
    pulled = host.run_command(["docker", "pull", "--quiet", image], timeout=PULL_TIMEOUT)
    if pulled.code != 0:
        raise ClusterError(f"image {image} is not on this host and cannot be pulled ({pulled.last_line}); "
                           "build it there, or push it to a registry the host can reach "
                           "(`invoke image build --tag ... --registry ...`)")
    return "pulled"


# Importing TensorFlow in a fresh container costs seconds on every `train`. An image id names its
# content, so a passed check is remembered per machine (in the login's cache folder) and per id.
CHECKS = "${XDG_CACHE_HOME:-$HOME/.cache}/tfcluster/image-checks"


def _check_marker(identity: str, modules: list[str]) -> str:
    return f"{CHECKS}/{identity.removeprefix('sha256:')}-{'-'.join(modules)}"


def check_python(host: WorkerHost, image: str, modules: list[str], cluster_id: str) -> None:
    """python3 in the image imports what the program needs (no network, removed afterwards;
    labelled with the cluster id like every container of the cluster, so `down` finds it if the
    launcher died meanwhile)."""
    ran = host.run_command(
        ["docker", "run", "--rm", "--network", "none", "--label", f"{container.LABEL_RUN}=preflight",
         "--label", f"{container.LABEL_CLUSTER}={cluster_id}", "--entrypoint", container.IMAGE_PYTHON, image, "-c", f"import {', '.join(modules)}"], timeout=300)
    if ran.code == 0:
        return
    if ran.code == 127 or "executable file not found" in ran.output:
        raise ClusterError(f"image {image} has no {container.IMAGE_PYTHON} on its PATH; build it FROM a "
                           "TensorFlow image (e.g. tensorflow/tensorflow:2.21.0-gpu)")
    raise ClusterError(f"{container.IMAGE_PYTHON} in image {image} cannot import {', '.join(modules)} "
                       f"({ran.last_line}); build it FROM tensorflow/tensorflow:2.21.0-gpu or "
                       f"`pip install {' '.join(m.replace('_', '-') for m in modules)}` in it")


def required_modules(bundled_trainer: bool) -> list[str]:
    """What python3 in the image must import: the bundled trainer also writes TensorBoard logs
    with tf_keras (tensorflow 2.21 no longer installs tensorboard by itself)."""
    return ["tensorflow", "tf_keras", "tensorboard"] if bundled_trainer else ["tensorflow"]


def preflight(hosts: list[WorkerHost], image: str, modules: list[str], cluster_id: str) -> None:
    """Docker, the image and TensorFlow in it, on every machine at once; one error naming each failure."""
    def check(host: WorkerHost) -> None:
        check_docker(host)
        ensure_image(host, image)
        identity = image_id(host, image) or ""
        marker = _check_marker(identity, modules) if identity else ""
        if marker and host.run_command(["sh", "-c", f'test -f "{marker}"'], timeout=30).code == 0:
            return  # This very image passed on this machine before.
        check_python(host, image, modules, cluster_id)
        if marker:
            host.run_command(["sh", "-c", f'mkdir -p "{CHECKS}" && touch "{marker}"'], timeout=30)

    in_parallel(distinct_hosts(hosts), check, _label, "image preflight")


def pre_pull(hosts: list[WorkerHost], image: str) -> list[str]:
    """`up` with an image: pull it on every machine in parallel; returns "present"/"pulled" per machine."""
    def pull(host: WorkerHost) -> str:
        check_docker(host)
        return ensure_image(host, image)

    return in_parallel(distinct_hosts(hosts), pull, _label, f"pulling {image}")


def _containers_on(host: WorkerHost, cluster_id: str) -> list[str]:
    """Names of the cluster's containers on one machine (none where Docker is absent or does not answer)."""
    listed = host.run_command(container.list_argv(cluster_id), timeout=30)
    return listed.stdout.split() if listed.code == 0 else []


def cluster_containers(hosts: list[WorkerHost], cluster_id: str) -> dict[str, list[str]]:
    """Per machine: names of the containers labelled with the cluster id."""
    machines = distinct_hosts(hosts)
    found = in_parallel(machines, lambda host: _containers_on(host, cluster_id), _label, "listing containers")
    return dict(zip([_label(h) for h in machines], found))


def remove_cluster_containers(hosts: list[WorkerHost], cluster_id: str) -> None:
    def remove(host: WorkerHost) -> None:
        names = _containers_on(host, cluster_id)
        if names:
            removed = host.run_command(container.remove_argv(names), timeout=120)
            if removed.code != 0 and "No such container" not in removed.output:
                raise ClusterError(f"docker rm failed: {removed.last_line}")

    in_parallel(distinct_hosts(hosts), remove, _label, "removing containers")

