"""`image build`: build the trainer image on this machine and push it to the cluster's registry."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tfcluster.commands.common import console
from tfcluster.config import Settings, parse_image
from tfcluster.errors import ConfigError, TfClusterError
from tfcluster.state import StateStore


def _docker(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["docker", *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise TfClusterError("Docker is not installed on this machine; install it (apt-get install "
                             "docker.io, or Docker's docker-ce) to build images") from None
    except subprocess.TimeoutExpired:
        raise TfClusterError(f"`docker {argv[0]}` did not finish within {timeout:g} s") from None


def _tail(output: str) -> str:
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def registry_for(settings: Settings, store: StateStore) -> str:
    """Where to push: tfcluster.registry, else the cluster's own registry (gcp), else nowhere."""
    if settings.registry:
        return settings.registry
    cluster = store.load_cluster()
    return cluster.registry if cluster is not None else ""


def build_image(settings: Settings, dockerfile: str, tag: str | None, context: str | None) -> str:
    """Build ``tag`` from ``dockerfile``; push it when a registry is known. Returns the reference."""
    if not tag:
        raise ConfigError("image build needs --tag NAME:VERSION (e.g. --tag trainer:1)")
    parse_image("tag", tag)
    path = Path(dockerfile).expanduser()
    if not path.is_file():
        raise ConfigError(f"--dockerfile {dockerfile} does not exist; give the path of your Dockerfile")
    folder = Path(context).expanduser() if context else path.resolve().parent
    if not folder.is_dir():
        raise ConfigError(f"--context {context} is not a folder")
    registry = registry_for(settings, StateStore(settings))
    reference = parse_image("registry", f"{registry}/{tag}") if registry else tag
    version = _docker(["version", "--format", "{{.Server.Version}}"], 30)
    if version.returncode != 0:
        raise TfClusterError(f"the Docker daemon on this machine does not answer ({_tail(version.stdout)}); "
                             "start it: sudo systemctl start docker")
    with console.status(f"Building {reference} from {path}..."):
        # The classic builder: Debian's docker.io has no buildx; DOCKER_BUILDKIT is the user's choice.
        built = _docker(["build", "--file", str(path.resolve()), "--tag", reference, str(folder.resolve())], 3600)
    if built.returncode != 0:
        raise TfClusterError(f"docker build failed: {_tail(built.stdout)}; fix the Dockerfile and run again")
    console.print(f"[green]✓[/] Built {reference}.")
    if not registry:
        console.print("  No registry configured (tfcluster.registry, or a gcp cluster's): the image stays "
                      "on this machine, which is enough for the local backend.")
        return reference
    with console.status(f"Pushing {reference}..."):
        pushed = _docker(["push", "--quiet", reference], 3600)
    if pushed.returncode != 0:
        host = registry.split("/")[0]
        # Without credentials Artifact Registry answers 401, then "denied: Unauthenticated request..."
        # (Docker prints the registry's error code in lowercase before the message).
        refused = any(word in pushed.stdout.lower() for word in ("denied", "unauthorized", "authentication required"))
        if refused:
            hint = (f"run `gcloud auth configure-docker {host}` once" if host.endswith("-docker.pkg.dev")
                    else f"log in first: docker login {host}")
        else:
            hint = f"check that {host} is reachable from this machine"
        raise TfClusterError(f"docker push {reference} failed ({_tail(pushed.stdout)}); {hint}")
    console.print(f"[green]✓[/] Pushed {reference}. Next: invoke up --image {reference}  "
                  f"(pulls it on every host), then invoke train")
    return reference
