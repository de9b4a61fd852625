"""Vertex AI's training replicas, each played by a Docker container from the job's own image, on a
network of this lab's own (tests/world/vertex.py decides when they start and stop).

What a replica sees, as Vertex AI gives it (sources in tests/world/vertex.py's module text):
- its own host name, the one CLUSTER_SPEC and TF_CONFIG name for it
  ("cmle-training-workerpool0-<job hash>-0"), resolvable by every replica of the job, and the
  same name again when Vertex AI restarts it; TensorFlow's port 2222 on it;
- Cloud Storage under Google's names and the world's test CA in its /etc/ssl (the world's
  storage door also listens on this network's gateway, so TensorFlow's own gs:// client reaches
  it unchanged);
- metadata.google.internal, whose instance/service-accounts/default/token is the token of the
  job's service account (CustomJobSpec.serviceAccount, "the workload run-as account"; without
  one, the Vertex AI Custom Code Service Agent, which the world's storage does not know);
- the environment: the job's containerSpec.env and Vertex AI's own variables.

Its stdout and stderr go to the Cloud Logging stand-in (tests/world/cloud_logging.py) as they are
written, at INFO and ERROR.

The network is a Docker bridge with fixed addresses (10.253.<lab>.0/24, the lab's own range:
10.250 is the namespace hosts', 10.251 and 10.252 the booted VMs'), every replica added to every
other's /etc/hosts with --add-host, so nothing depends on Docker's embedded DNS (the daemon runs
with --iptables=false). Every container carries this lab's label and is removed by name; nothing
here looks at the daemon's other containers.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.fake_metadata import FakeMetadataServer, token_answer
from tests.world.cloud_logging import parse_time
from tests.world.compute_auth import token_for

NET = int(os.environ.get("TFCLUSTER_TESTLAB_NET", "7"))
SUBNET = f"10.253.{NET}"
NETWORK = f"tfc-vertex-{NET}"
BRIDGE = f"tfcvx{NET}"
GATEWAY = f"{SUBNET}.1"  # Cloud Storage's names: the world's storage door listens here too.
METADATA = f"{SUBNET}.2"  # metadata.google.internal.
LABEL = f"tfcluster-test=vertex-{NET}"
LABEL_JOB = "tfcluster-test.vertex-job"
TF_PORT = 2222


def docker(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *argv], capture_output=True, text=True, timeout=timeout)


@dataclass
class Replica:
    """One replica of one job."""

    # Its task name, as Cloud Logging and Vertex AI's errors name it: workerpool<P>-<I>.
    task: str
    pool: int
    index: int
    # Its host name in CLUSTER_SPEC and TF_CONFIG, and its address on the lab's network.
    host: str
    address: str
    # The container that plays it now (a restart makes a new one of the same name).
    container: str
    # Exit code of the current container once it ended (None while it runs).
    exit_code: int | None = None
    # Why it ended, when the world ended it: "preempted", "stopped".
    ended_by: str = ""
    threads: list = field(default_factory=list)


class ReplicaMetadata(FakeMetadataServer):
    """metadata.google.internal for the replicas: each one answered by its address."""

    def __init__(self, runtime: "ReplicaRuntime", bind: tuple[str, int]):
        self.runtime = runtime
        super().__init__({}, bind=bind)

    def read(self, client: str, path: str) -> str | None:
        account = self.runtime.account_at(client)
        if account is None:
            return None
        project, number = self.runtime.project, self.runtime.project_number
        values = {"project/project-id": project, "project/numeric-project-id": number,
                  "instance/service-accounts/default/email": account,
                  "instance/service-accounts/default/token": token_answer(token_for(account)),
                  "instance/service-accounts/default/scopes": "https://www.googleapis.com/auth/cloud-platform"}
        return values.get(path.rstrip("/"))


class ReplicaRuntime:
    """The lab's network, its metadata server and the replicas' containers."""

    def __init__(self, world, root: Path, write_log):
        # write_log(job_id, task, line, severity, at): a replica's output line, to Cloud Logging.
        self.write_log = write_log
        self.project = world.compute.state.project
        self.project_number = world.project_apis.apis.project_number
        self.lock = threading.Lock()
        self.accounts: dict[str, str] = {}  # address -> the service account of the replica there.
        self.free = [f"{SUBNET}.{n}" for n in range(10, 250)]
        self._remove_leftovers()
        made = docker("network", "create", "--driver", "bridge", "--subnet", f"{SUBNET}.0/24", "--gateway", GATEWAY,
                      "-o", f"com.docker.network.bridge.name={BRIDGE}", "--label", LABEL, NETWORK)
        if made.returncode != 0:
            raise RuntimeError(f"docker network create {NETWORK}: {made.stderr.strip()}")
        subprocess.run(["ip", "addr", "add", f"{METADATA}/24", "dev", BRIDGE], check=True, capture_output=True)
        self.trust = world.trust_store(root / "vertex-ssl")
        world.storage_proxy.listen(GATEWAY, 443, world.tls_context)
        world.storage_proxy.listen(GATEWAY, 80, None)
        self.metadata = ReplicaMetadata(self, (METADATA, 80))
        self.google_hosts = ["www.googleapis.com", "storage.googleapis.com"]

    @staticmethod
    def _remove_leftovers() -> None:
        """What a killed run of this lab left: its containers (by this lab's label), then its network."""
        stale = docker("ps", "-aq", "--filter", f"label={LABEL}").stdout.split()
        if stale:
            docker("rm", "-f", *stale)
        docker("network", "rm", NETWORK)

    def account_at(self, address: str) -> str | None:
        with self.lock:
            return self.accounts.get(address)

    def allocate(self, count: int) -> list[str]:
        with self.lock:
            taken, self.free = self.free[:count], self.free[count:]
        if len(taken) < count:
            raise RuntimeError("the lab's Vertex network has no free address")
        return taken

    def release(self, replicas: list[Replica]) -> None:
        with self.lock:
            for replica in replicas:
                self.accounts.pop(replica.address, None)
                self.free.append(replica.address)

    def run(self, job_id: str, replica: Replica, everyone: list[Replica], image: str, command: list[str],
            args: list[str], env: dict[str, str], account: str) -> str | None:
        """Start ``replica``'s container (removing any earlier one of that name); None, or Docker's
        words when it could not start (an image that cannot be pulled)."""
        docker("rm", "-f", replica.container)
        with self.lock:
            self.accounts[replica.address] = account
        argv = ["run", "-d", "--name", replica.container, "--label", LABEL, "--label", f"{LABEL_JOB}={job_id}",
                "--network", NETWORK, "--ip", replica.address, "--hostname", replica.host,
                "-v", f"{self.trust}:/etc/ssl:ro", "--add-host", f"metadata.google.internal:{METADATA}"]
        argv += [item for name in self.google_hosts for item in ("--add-host", f"{name}:{GATEWAY}")]
        argv += [item for other in everyone if other is not replica
                 for item in ("--add-host", f"{other.host}:{other.address}")]
        argv += [item for key, value in env.items() for item in ("-e", f"{key}={value}")]
        if command:
            argv += ["--entrypoint", command[0], image, *command[1:], *args]
        else:
            argv += [image, *args]
        replica.exit_code, replica.ended_by = None, ""
        started = docker(*argv, timeout=600)
        if started.returncode != 0:
            return started.stderr.strip() or started.stdout.strip()
        replica.threads = [threading.Thread(target=self._wait, args=(replica,), daemon=True),
                           *[threading.Thread(target=self._follow, args=(job_id, replica, stream), daemon=True)
                             for stream in ("stdout", "stderr")]]
        for thread in replica.threads:
            thread.start()
        return None

    def _wait(self, replica: Replica) -> None:
        waited = docker("wait", replica.container, timeout=24 * 3600)
        text = waited.stdout.strip()
        replica.exit_code = int(text) if text.lstrip("-").isdigit() else 137

    def _follow(self, job_id: str, replica: Replica, stream: str) -> None:
        """One of the container's streams, line by line, with Docker's own time of each line."""
        process = subprocess.Popen(["docker", "logs", "--follow", "--timestamps", replica.container],
                                   stdout=subprocess.PIPE if stream == "stdout" else subprocess.DEVNULL,
                                   stderr=subprocess.PIPE if stream == "stderr" else subprocess.DEVNULL)
        source = process.stdout if stream == "stdout" else process.stderr
        for raw in iter(source.readline, b""):
            stamp, _, text = raw.decode(errors="replace").rstrip("\n").partition(" ")
            try:
                at = parse_time(stamp)
            except ValueError:
                at, text = time.time(), raw.decode(errors="replace").rstrip("\n")
            self.write_log(job_id, replica.task, text, "INFO" if stream == "stdout" else "ERROR", at)
        process.wait()

    def kill(self, replica: Replica, why: str) -> None:
        replica.ended_by = why
        docker("kill", replica.container)

    def stop(self, replicas: list[Replica], grace: int = 10) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds, every replica at once."""
        for replica in replicas:
            replica.ended_by = replica.ended_by or "stopped"
        running = [r.container for r in replicas if r.exit_code is None]
        if running:
            docker("stop", "-t", str(grace), *running, timeout=grace + 120)

    def remove(self, replicas: list[Replica]) -> None:
        """The replicas' containers gone, once their last lines are in Cloud Logging."""
        for replica in replicas:
            for thread in replica.threads:
                thread.join(timeout=15)
        names = [r.container for r in replicas]
        if names:
            docker("rm", "-f", *names)
        self.release(replicas)

    def close(self) -> None:
        self.metadata.close()
        self._remove_leftovers()
