"""`--image`: workers inside a container image, with real Docker (tests/imagelab.py).

No remote registry is reachable here: the images are built locally (debootstrapped Debian 12 +
tensorflow-cpu + tf-keras from the package index, cached), and the registry is Debian's
docker-registry on loopback, or, for a gcp cluster, behind REGION-docker.pkg.dev as a private
dockerd sees it (tests/registrylab.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests import imagelab, labnet
from tests.conftest import REPO, events_of, wait_for
from tfcluster.backends.local import processes_with_env
from tfcluster.ports import free_ports
from tfcluster.container import LABEL_CLUSTER

@pytest.fixture(scope="module", autouse=True)
def docker() -> None:
    """A Docker daemon, started when the first test here needs one (never at import)."""
    reason = imagelab.ensure_dockerd()
    if reason:
        pytest.skip(f"docker: {reason}")


@pytest.fixture(scope="session")
def images() -> tuple[str, str]:
    """(image with TensorFlow, image with Python only), built or imported once."""
    reason = imagelab.ensure_dockerd()
    if reason:
        pytest.skip(f"docker: {reason}")
    images, _ = imagelab.build()
    return images


def containers(cli, running_only: bool = False) -> list[str]:
    """Names of the containers that carry the test cluster's id."""
    cluster = cli.cluster()
    if cluster is None:
        return []
    argv = ["docker", "ps", "--filter", f"label={LABEL_CLUSTER}={cluster['cluster_id']}", "--format", "{{.Names}}"]
    if not running_only:
        argv.insert(2, "--all")
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()


@pytest.fixture
def icli(cli):
    """The CLI fixture, plus removal of any container a failed test left behind."""
    ids = []
    yield cli
    for path in (cli.state_dir / "clusters").glob("*.json") if (cli.state_dir / "clusters").exists() else []:
        ids.append(json.loads(path.read_text())["cluster_id"])
    for cluster_id in ids:
        imagelab.remove_containers(f"{LABEL_CLUSTER}={cluster_id}")


def build_the_example(icli, base: str, tmp_path: Path) -> str:
    """examples/Dockerfile, built by `invoke image build` on ``base`` (no registry here to pull
    TensorFlow's own image from; the test images hold what it installs, so its RUN installs nothing)."""
    context = tmp_path / "example"
    context.mkdir()
    dockerfile = (REPO / "examples" / "Dockerfile").read_text()
    assert re.search(r"(?m)^ARG BASE=tensorflow/tensorflow:\S+-gpu$", dockerfile)
    (context / "Dockerfile").write_text(re.sub(r"(?m)^ARG BASE=.*$", f"ARG BASE={base}", dockerfile))
    tag = f"tfc-example-lab{labnet.number()}:1"  # The daemon is shared with the labs beside this one.
    built = icli.run("image", "build", "--dockerfile", str(context / "Dockerfile"), "--tag", tag, timeout=600)
    assert built.returncode == 0 and f"✓ Built {tag}." in built.stdout, built.stdout + built.stderr
    return tag


def test_three_workers_train_inside_the_image(icli, images, tmp_path):
    """In the example image (examples/Dockerfile), built by `invoke image build`."""
    tf_image = build_the_example(icli, images[0], tmp_path)
    assert icli.run("up", "--workers", "3").returncode == 0
    launcher = icli.popen("train", "--image", tf_image, "--", "--epochs", "2")
    try:
        seen = wait_for(lambda: len(containers(icli, running_only=True)) == 3 and containers(icli), 240,
                        what="three worker containers")
        # The PID the launcher watches is the container's first process, in its own PID namespace,
        # and it carries TFCLUSTER_RUN_ID: what the VM watchdog's job probe looks for in /proc.
        pid_file = icli.runs()[-1] / "worker-0.attempt1.pid"
        pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), 60, what="PID file"))
        assert os.readlink(f"/proc/{pid}/ns/pid") != os.readlink("/proc/self/ns/pid")
        assert any(item.startswith(b"TFCLUSTER_RUN_ID=") for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"))
        output, _ = launcher.communicate(timeout=600)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, output
    run_dir, run = icli.latest_run()
    assert sorted(seen) == [f"tfc-{run_dir.name}-w{i}-a1" for i in range(3)]
    assert run["outcome"] == "succeeded" and run["image"] == tf_image
    assert run["summary"]["replicas_in_sync"] == 3
    # The program ran on the image's Python (the launcher's venv is not in the image).
    assert run["command"][0] == "python3"
    model = run_dir / "output" / "model"
    assert (model / "model.keras").is_file() and (model / "saved_model.pb").is_file()  # At the root: Vertex's.
    tasks = {(e["task_type"], e["task_id"]) for i in range(3)
             for e in events_of((run_dir / f"worker-{i}.log").read_text()) if e["event"] == "strategy"}
    assert tasks == {("chief", 0), ("worker", 0), ("worker", 1)}
    # The environment went through an owner-only env file; TF_CONFIG is in it.
    env_file = run_dir / "worker-1.attempt1.env"
    assert env_file.stat().st_mode & 0o777 == 0o600
    tf_config = [line.split("=", 1)[1] for line in env_file.read_text().splitlines() if line.startswith("TF_CONFIG=")]
    assert json.loads(tf_config[0])["task"] == {"type": "worker", "index": 0}
    assert containers(icli) == []  # --rm: nothing stays after a clean exit.
    # The passed in-image check is remembered per machine and image id (later trains skip it).
    identity = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", tf_image],
                              capture_output=True, text=True, check=True).stdout.strip().removeprefix("sha256:")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tfcluster" / "image-checks"
    assert (cache / f"{identity}-tensorflow-tf_keras-tensorboard").is_file()
    subprocess.run(["docker", "rmi", tf_image], capture_output=True)


def test_killed_container_fails_fast_then_retry_resumes(icli, images):
    tf_image, _ = images
    assert icli.run("up", "--workers", "2").returncode == 0  # A third worker would prove nothing more.
    launcher = icli.popen("train", "--image", tf_image, "--retries", "1", "--", "--epochs", "4")
    try:
        run_dir = wait_for(lambda: icli.runs() and icli.runs()[-1], 60, what="run folder")
        chief_log = run_dir / "worker-0.log"
        wait_for(lambda: chief_log.exists() and any(e["event"] == "epoch_end" for e in events_of(chief_log.read_text())),
                 300, what="first epoch on the chief")
        victim = f"tfc-{run_dir.name}-w1-a1"
        subprocess.run(["docker", "kill", victim], check=True, capture_output=True)
        killed_at = time.time()
        # While attempt 2 runs, nothing of attempt 1 is left.
        wait_for(lambda: (run_dir / "worker-0.attempt2.sh").exists(), 60, what="attempt 2")
        assert not [name for name in containers(icli) if name.endswith("-a1")]
        output, _ = launcher.communicate(timeout=600)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, output
    assert "worker-1 (worker:0 on 127.0.0.1" in output and "was killed by SIGKILL (exit 137)" in output
    assert (run_dir / "worker-0.attempt2.sh").stat().st_mtime - killed_at < 30
    run = json.loads((run_dir / "run.json").read_text())
    assert run["attempts"] == 2 and run["outcome"] == "succeeded"
    assert run["summary"]["resumed_at"]["2"] > 1 and run["summary"]["last_epoch"] == 4
    assert containers(icli) == []


SLEEPER = """
import os, time
print("worker", os.environ["TFCLUSTER_WORKER_INDEX"], "up", flush=True)
time.sleep(600)
"""


def test_stop_and_down_remove_every_container(icli, images, tmp_path):
    tf_image, _ = images
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    assert icli.run("up", "--workers", "3").returncode == 0
    cluster_id = icli.cluster()["cluster_id"]
    for ender in ("stop", "down"):
        launcher = icli.popen("train", "--image", tf_image, "--script", str(script))
        try:
            wait_for(lambda: len(containers(icli, running_only=True)) == 3, 180, what="three containers")
            run_dir = icli.runs()[-1]
            wait_for(lambda: all((run_dir / f"worker-{i}.attempt1.pid").exists() for i in range(3)), 30,
                     what="PID files")
            ended = icli.run(ender, timeout=120)
            assert ended.returncode == 0, ended.stdout + ended.stderr
            assert not subprocess.run(["docker", "ps", "--all", "--quiet", "--filter",
                                       f"label={LABEL_CLUSTER}={cluster_id}"],
                                      capture_output=True, text=True).stdout.split()
            assert processes_with_env(f"TFCLUSTER_CLUSTER_ID={cluster_id}") == []
            launcher.wait(timeout=60)
        finally:
            if launcher.poll() is None:
                launcher.kill()
    assert "no worker process is left, nor any container" in ended.stdout
    assert icli.cluster() is None


def test_ctrl_c_removes_the_containers(icli, images, tmp_path):
    tf_image, _ = images
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    assert icli.run("up", "--workers", "2").returncode == 0
    launcher = icli.popen("train", "--image", tf_image, "--script", str(script))
    wait_for(lambda: len(containers(icli, running_only=True)) == 2, 180, what="two containers")
    run_dir = icli.runs()[-1]
    wait_for(lambda: all((run_dir / f"worker-{i}.attempt1.pid").exists() for i in range(2)), 30, what="PID files")
    launcher.send_signal(signal.SIGINT)
    output, _ = launcher.communicate(timeout=120)
    assert launcher.returncode == 1 and "no worker is left running" in output
    assert containers(icli) == []


def test_preflight_names_the_host_and_the_fix(icli, images, tmp_path):
    tf_image, python_image = images
    assert icli.run("up", "--workers", "2").returncode == 0

    def one_error(*args, env=None) -> str:
        saved = dict(icli.env)
        icli.env.update(env or {})
        try:
            result = icli.run("train", *args, timeout=300)
        finally:
            icli.env.clear()
            icli.env.update(saved)
        assert result.returncode == 2, result.stdout + result.stderr
        assert "Traceback" not in result.stderr and not icli.runs()
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        return lines[0]

    # A machine without Docker (no docker program on the PATH the launcher and the workers see).
    no_docker = tmp_path / "bin"
    no_docker.mkdir()
    line = one_error("--image", tf_image, env={"PATH": str(no_docker)})
    assert line.startswith("error: image preflight failed on 1 host(s): worker-0 (127.0.0.1): "
                           "Docker is not installed; install it")
    # An image without TensorFlow.
    line = one_error("--image", python_image)
    assert "worker-0 (127.0.0.1): python3 in image " + python_image + " cannot import tensorflow, tf_keras, tensorboard" in line
    assert "No module named 'tensorflow'" in line and "pip install tensorflow tf-keras tensorboard" in line
    # An image that is neither here nor pullable.
    line = one_error("--image", "127.0.0.1:9/absent/trainer:1")
    assert "image 127.0.0.1:9/absent/trainer:1 is not on this host and cannot be pulled" in line
    # A malformed reference never reaches Docker.
    assert "image must be an image reference" in one_error("--image", "Not An Image")
    # No preflight container of this cluster is left (they carry its id: other labs' tests run
    # beside this one on the same daemon, so nothing here looks at the daemon as a whole).
    assert containers(icli) == [] and not subprocess.run(
        ["docker", "ps", "-aq", "--filter", "label=tfcluster.run=preflight", "--filter",
         f"label={LABEL_CLUSTER}={icli.cluster()['cluster_id']}"], capture_output=True, text=True).stdout.split()


@pytest.fixture
def registry(tmp_path):
    """Debian's docker-registry on a free loopback port, storage in the test's folder."""
    if shutil.which("docker-registry") is None:
        pytest.skip("docker-registry is not installed (apt-get install docker-registry)")
    port = labnet.free_ports(1)[0]
    config = tmp_path / "registry.yml"
    config.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {tmp_path / 'registry'}\n"
                      f"http:\n  addr: 127.0.0.1:{port}\n")
    process = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)

    def answers() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            return False

    try:
        wait_for(answers, 20, what="docker-registry")
        yield f"127.0.0.1:{port}"
    finally:
        process.kill()
        process.wait(timeout=10)


def test_image_build_pushes_and_up_pre_pulls(icli, images, registry, tmp_path):
    _, python_image = images
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "marker.txt").write_text("built by invoke image build\n")
    (context / "Dockerfile").write_text(f"FROM {python_image}\nCOPY marker.txt /marker.txt\n")
    built = icli.run("image", "build", "--dockerfile", str(context / "Dockerfile"), "--tag", "trainer:1",
                     "--registry", f"{registry}/tfc", timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    reference = f"{registry}/tfc/trainer:1"
    assert f"Pushed {reference}" in built.stdout
    with urllib.request.urlopen(f"http://{registry}/v2/tfc/trainer/tags/list", timeout=5) as response:
        assert json.load(response)["tags"] == ["1"]

    # Gone from this machine: `up --image` pulls it back from the registry.
    subprocess.run(["docker", "rmi", reference], check=True, capture_output=True)
    try:
        up = icli.run("up", "--workers", "2", "--image", reference, timeout=300)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "pulled on 1 host(s), already present on 0" in up.stdout
        marker = subprocess.run(["docker", "run", "--rm", "--entrypoint", "cat", reference, "/marker.txt"],
                                capture_output=True, text=True)
        assert marker.stdout == "built by invoke image build\n"
        assert icli.cluster()["image"] == reference
        again = icli.run("up", "--workers", "2", "--image", reference)
        assert "pulled on 0 host(s), already present on 1" in again.stdout
    finally:
        subprocess.run(["docker", "rmi", reference], capture_output=True)

    # A registry that does not answer: one line, with the fix.
    # (The tag names this lab: the daemon is shared with the labs running beside this one.)
    dead = f"127.0.0.1:9/tfc-lab{labnet.number()}"
    failed = icli.run("image", "build", "--dockerfile", str(context / "Dockerfile"), "--tag", "trainer:2",
                      "--registry", dead, timeout=600)
    assert failed.returncode == 2 and "Traceback" not in failed.stderr
    assert failed.stderr.strip().startswith(f"error: docker push {dead}/trainer:2 failed (")
    subprocess.run(["docker", "rmi", f"{dead}/trainer:2"], capture_output=True)


class LoopbackHosts:
    """sshd hosts in this machine's own network namespace, so that `docker run --network host`
    (the daemon's network) is the network the hosts' workers share. The namespace hosts of
    tests/hostlab.py cannot serve: a container there would get the daemon's network, not the
    host's. All on one loopback address (127.<NET>.0.10), one sshd port each: TensorFlow's gRPC
    server binds its port on every address, so workers sharing a network need distinct ports,
    which the ssh backend gives to hosts with the same address."""

    def __init__(self, root: Path, count: int):
        from tests.hostlab import NET, sh

        root.mkdir(parents=True, exist_ok=True)
        self.key = root / "id_ed25519"
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key))
        self.known_hosts = root / "known_hosts"
        Path("/run/sshd").mkdir(exist_ok=True)
        self.entries, self.processes, lines = [], [], []
        address = f"127.{NET}.0.10"
        for index, port in enumerate(free_ports(count, address)):
            host_key = root / f"h{index}_key"
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key))
            config = root / f"h{index}_sshd_config"
            config.write_text("\n".join([
                f"HostKey {host_key}", f"PidFile {root / f'h{index}.pid'}", f"ListenAddress {address}:{port}",
                f"AuthorizedKeysFile {self.key}.pub", "PasswordAuthentication no", "UsePAM no",
                "StrictModes no", "PermitRootLogin yes", "Subsystem sftp internal-sftp", "MaxSessions 100", ""]))
            self.processes.append(subprocess.Popen(["/usr/sbin/sshd", "-D", "-f", str(config), "-E",
                                                    str(root / f"h{index}.log")]))
            public = Path(f"{host_key}.pub").read_text().split()
            lines.append(f"[{address}]:{port} {public[0]} {public[1]}\n")
            self.entries.append(f"{address}:{port}")
        self.known_hosts.write_text("".join(lines))
        for entry in self.entries:
            address, port = entry.split(":")
            wait_for(lambda: _answers(address, int(port)), 10, what=f"sshd on {entry}")

    def stop(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait(timeout=10)


def _answers(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.mark.skipif(not Path("/usr/sbin/sshd").exists() or os.geteuid() != 0, reason="needs root and sshd")
def test_three_ssh_hosts_train_in_containers(icli, images, tmp_path):
    tf_image, _ = images
    hosts = LoopbackHosts(tmp_path / "hosts", 3)
    try:
        icli.env.update({
            "INVOKE_TFCLUSTER_BACKEND": "ssh", "INVOKE_TFCLUSTER_HOSTS": ",".join(hosts.entries),
            "INVOKE_TFCLUSTER_SSH_KEY": str(hosts.key), "INVOKE_TFCLUSTER_KNOWN_HOSTS": str(hosts.known_hosts),
            "INVOKE_TFCLUSTER_PYTHON": "/usr/bin/python3",  # Without TensorFlow: the image has it.
            "INVOKE_TFCLUSTER_REMOTE_DIR": str(tmp_path / "remote"),
            # The hosts share this machine's network: their TensorFlow ports come from the lab's block.
            "INVOKE_TFCLUSTER_TF_PORT": str(labnet.loopback_tf_ports()[0]),
        })
        up = icli.run("up", "--image", tf_image, timeout=300)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "already present on 3" in up.stdout.replace("\n", " ")
        result = icli.run("train", "--", "--epochs", "1", timeout=900)  # The image `up` pulled.
        assert result.returncode == 0, result.stdout + result.stderr
        run_dir, run = icli.latest_run()
        assert run["image"] == tf_image and run["summary"]["replicas_in_sync"] == 3
        assert (run_dir / "output" / "model" / "model.keras").is_file()  # Fetched from the chief's host.
        # Each worker reached over its own sshd, with its own TensorFlow port.
        records = icli.cluster()["hosts"]
        assert [r["ssh_port"] for r in records] == [int(e.split(":")[1]) for e in hosts.entries]
        assert len({r["tf_port"] for r in records}) == 3
        down = icli.run("down", timeout=120)
        assert down.returncode == 0 and "no worker process is left, nor any container" in down.stdout
    finally:
        hosts.stop()


@pytest.mark.skipif(shutil.which("docker-registry") is None or shutil.which("nsenter") is None,
                    reason="needs docker-registry and nsenter")
def test_gcp_image_build_pushes_to_the_cluster_registry_and_up_pre_pulls(tmp_path, world, synthetic_data):
    """On a gcp cluster: `image build` pushes to REGION-docker.pkg.dev/PROJECT/CLUSTER-images and
    `up --image` pulls it on the VM, through the names Docker resolves (tests/registrylab.py). The
    registry signs in as Artifact Registry does: the laptop with the operator's token, the VM's
    Docker with its service account's token from the metadata server."""
    from tests import registrylab
    from tests.hostlab import NET, HostLab, available
    from tests.test_gcp_backend import make_gcp_cli
    from tests.world.tls import make_certificates

    if available() is not None:
        pytest.skip(f"test hosts: {available()}")
    accepting, denying = "us-west1-docker.pkg.dev", "europe-west4-docker.pkg.dev"
    subnet = f"10.251.{NET}"  # The private daemon's own link; the registries listen on this side of it.
    addresses = {accepting: f"{subnet}.4", denying: f"{subnet}.5"}
    ca, cert, key = make_certificates(tmp_path / "registry-tls", tuple(addresses))
    started = []
    try:
        daemon = registrylab.PrivateDaemon(tmp_path / "dockerd", addresses, ca, subnet, f"treg{NET}")
        started.append(daemon)
        from tests.world.compute_auth import OPERATOR, OPERATOR_TOKEN, account_of

        accepted = registrylab.TokenRegistry(
            tmp_path / "registry", accepting, addresses[accepting], cert, key, world.compute.state.tokens.get,
            lambda member, resource: [b["role"] for b in world.artifacts.state.policies.get(resource, [])
                                      if member in b.get("members", [])], OPERATOR)
        started.append(accepted)
        started.append(registrylab.DenyingRegistry(denying, addresses[denying], cert, key))
        lab = HostLab(tmp_path / "lab", 1, tag="ti", listen_all=True, vm_login=True)
        started.append(type("Lab", (), {"stop": lambda self: lab.teardown()})())
        registrylab.use_daemon(lab, daemon)
        cli = make_gcp_cli(tmp_path, world, lab, synthetic_data)
        # The laptop's Docker signed in with the operator's token, as `gcloud auth configure-docker`
        # arranges (its own config folder: this machine's ~/.docker stays as it is).
        cli.env.update({"INVOKE_TFCLUSTER_WORKERS": "1", "DOCKER_HOST": daemon.host,
                        "DOCKER_CONFIG": str(tmp_path / "docker-config")})
        signed_in = subprocess.run(["docker", "login", "--username", "oauth2accesstoken", "--password-stdin",
                                    f"https://{accepting}"], input=OPERATOR_TOKEN, capture_output=True, text=True,
                                   env={**os.environ, "DOCKER_HOST": daemon.host,
                                        "DOCKER_CONFIG": cli.env["DOCKER_CONFIG"]})
        assert signed_in.returncode == 0, signed_in.stderr
        up = cli.run("up", timeout=180)
        assert up.returncode == 0, up.stdout + up.stderr
        # The VM's own service account (terraform makes it again, by the same name, at each up).
        vm = f"serviceAccount:{account_of(world.compute.state.instances['default-0'])}"
        registry = "us-west1-docker.pkg.dev/demo-project/default-images"
        assert cli.cluster()["registry"] == registry

        context = tmp_path / "ctx"
        context.mkdir()
        (context / "marker.txt").write_text("pushed to the cluster's registry\n")
        (context / "Dockerfile").write_text("FROM scratch\nCOPY marker.txt /marker.txt\n")
        built = cli.run("image", "build", "--dockerfile", str(context / "Dockerfile"), "--tag", "trainer:1",
                        timeout=600)
        assert built.returncode == 0, built.stdout + built.stderr
        reference = f"{registry}/trainer:1"
        assert f"Pushed {reference}" in built.stdout
        assert accepted.tags("demo-project/default-images/trainer") == ["1"]
        # Here the registry's Docker endpoint and its REST API are two stand-ins; on Google a push
        # through one is listed by the other (repositories.dockerImages.list), so mirror it.
        world.artifacts.state.add_image("projects/demo-project/locations/us-west1/repositories/default-images",
                                        "trainer", "1", 1024)

        # Without `gcloud auth configure-docker`, Artifact Registry refuses the push: one line, the fix.
        refused = cli.run("image", "build", "--dockerfile", str(context / "Dockerfile"), "--tag", "trainer:2",
                          "--registry", f"{denying}/demo-project/default-images", timeout=600)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr
        [line] = refused.stderr.strip().splitlines()
        assert line.startswith(f"error: docker push {denying}/demo-project/default-images/trainer:2 failed (")
        assert "Unauthenticated request" in line
        assert line.endswith(f"run `gcloud auth configure-docker {denying}` once")

        # The cluster's VMs were made without Docker: `up --image` says how to get it, and `down`
        # keeps the registry (it holds the image now).
        refused_up = cli.run("up", "--image", reference, timeout=120)
        assert refused_up.returncode == 2 and refused_up.stderr.strip().splitlines() == [
            f"error: cluster default was created without Docker; run invoke down, then invoke up --image "
            f"{reference} (the bucket and registry are kept)"]
        kept = cli.run("down", timeout=180)
        assert kept.returncode == 0 and "kept registry us-west1-docker.pkg.dev/demo-project/default-images" \
            in kept.stdout, kept.stdout + kept.stderr
        # Gone from the daemon: `up --image` makes VMs with Docker, reuses the kept registry and pulls
        # the image on the VM through Docker's names; its preflight then runs inside the image, which
        # (FROM scratch) has no Python: refused with the image's own fault, after the pull.
        assert daemon.docker("rmi", reference).returncode == 0
        # A VM whose service account may not read the repository (an IAM deny policy here): the
        # pull is refused with Artifact Registry's own words, on the named VM.
        accepted.denied.add(vm)
        denied = cli.run("up", "--image", reference, timeout=300)
        assert denied.returncode != 0 and "Traceback" not in denied.stderr
        assert 'Permission "artifactregistry.repositories.downloadArtifacts" denied on resource ' \
            '"projects/demo-project/locations/us-west1/repositories/default-images"' in denied.stderr, denied.stderr
        assert "worker-0" in denied.stderr
        assert "reusing registry us-west1-docker.pkg.dev/demo-project/default-images kept by an earlier `down`" \
            in denied.stdout, denied.stdout + denied.stderr
        assert any(r.startswith(f"{vm}: ") for r in accepted.refusals)
        accepted.denied.clear()
        pulled = cli.run("up", "--image", reference, timeout=300)
        assert pulled.returncode == 2 and f"image {reference} has no python3 on its PATH" in pulled.stderr
        assert daemon.docker("image", "inspect", reference).returncode == 0
        assert cli.run("down", timeout=120).returncode == 0
    finally:
        for thing in reversed(started):
            thing.stop()
