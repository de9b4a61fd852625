"""Machines that really boot: a Debian 12 rootfs with systemd as PID 1 in unprivileged Docker.

Follows shared/notes/vm-in-a-container.md. Each machine is a container from the image that
.ci/vm-cache.sh builds (cached), booted with `/sbin/init`; its boot unit fetches the
startup-script attribute from its own metadata stand-in and runs it, as Compute Engine's guest
agent does. Each machine gets:
- its own metadata stand-in (tests/fake_metadata.py) on 127.NET.0.X:80, the address
  `metadata.google.internal` names inside the container (`--add-host`), serving what
  terraform/instances.tf puts in the instance metadata;
- its own world: /etc/pip.conf (the offline wheelhouse, served over HTTP by this lab, a dead
  index, or an index that accepts and never answers) and an apt source (the offline repository
  or a dead address), mounted read-only. Nothing inside ever reaches a real registry.
Containers are removed by ID at close(), always.
"""

from __future__ import annotations

import functools
import json
import http.server
import os
import re
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.fake_metadata import FakeMetadataServer

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("TFCLUSTER_CI_CACHE", "/var/cache/tfcluster-ci")) / "vm"
NET = int(os.environ.get("TFCLUSTER_TESTLAB_NET", "7"))
LABEL = f"tfcluster-test=vmlab-{NET}"
DEAD = "http://127.0.0.1:9"  # The discard port: nothing listens, connections are refused at once.


def sh(*argv: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), check=check, capture_output=True, text=True, timeout=timeout)


def ensure_cache() -> dict[str, str]:
    """The image, apt repository and wheelhouse (built by .ci/vm-cache.sh, a no-op when cached)."""
    sh("bash", str(REPO / ".ci/vm-cache.sh"), timeout=1800)
    pairs = (line.split("=", 1) for line in (CACHE / "current.env").read_text().splitlines() if "=" in line)
    return dict(pairs)


def terraform_metadata_keys() -> set[str]:
    """The instance metadata keys terraform/instances.tf sets, so the lab serves the same ones."""
    text = (REPO / "terraform/instances.tf").read_text()
    block = text[text.index("metadata = {"):]
    block = block[:block.index("}")]
    return set(re.findall(r'^\s*"([a-z-]+)"\s*=', block, re.M))


class _RecordingHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the wheelhouse directory as pip's find-links and notes when each request came."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.server.requests.append((time.monotonic(), self.path, self.client_address[0]))
        super().do_GET()


class WheelServer:
    """The offline wheelhouse over HTTP on one machine's address (find-links page + wheels)."""

    def __init__(self, address: str, wheelhouse: str):
        handler = functools.partial(_RecordingHandler, directory=wheelhouse)
        self.server = http.server.ThreadingHTTPServer((address, 0), handler)
        self.server.daemon_threads = True
        self.server.requests = []
        self.url = f"http://{address}:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def requests(self) -> list[tuple[float, str, str]]:
        return list(self.server.requests)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class HungIndex:
    """A package index that accepts connections and never answers (a stuck proxy or mirror)."""

    def __init__(self, address: str):
        self.sock = socket.create_server((address, 0))
        self.url = f"http://{address}:{self.sock.getsockname()[1]}/simple"
        self.accepted: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)  # Held open, never read or answered.

    def close(self) -> None:
        self._closed = True
        self.sock.close()
        for conn in self.accepted:
            conn.close()


@dataclass
class Machine:
    # Short name (also the container's hostname and the instance name in metadata).
    name: str
    # Loopback address of this machine's metadata stand-in and package servers.
    address: str
    # Its metadata server (instance attributes in, guest attributes out).
    metadata: FakeMetadataServer
    # Host directory holding its world files (pip.conf, apt source), mounted read-only.
    world: Path
    # The docker container ID.
    container: str = ""
    # The wheelhouse server, when pip is pointed at it.
    wheels: WheelServer | None = None
    # The hanging index, when pip is pointed at one.
    hung: HungIndex | None = None
    # Closers for this machine's servers.
    closers: list = field(default_factory=list)

    def exec(self, *argv: str, check: bool = False, timeout: float = 60) -> subprocess.CompletedProcess:
        return sh("docker", "exec", self.container, *argv, check=check, timeout=timeout)

    def state(self) -> dict:
        out = sh("docker", "inspect", "-f", "{{.State.Running}} {{.State.ExitCode}} {{.State.Pid}}",
                 self.container).stdout.split()
        return {"running": out[0] == "true", "exit_code": int(out[1]), "pid": int(out[2])}

    def running(self) -> bool:
        return self.state()["running"]

    def ready(self) -> str | None:
        return self.metadata.guest_attributes.get("tfcluster/ready")

    def journal(self, unit: str) -> str:
        return self.exec("journalctl", "-u", unit, "--no-pager", "-o", "short-iso").stdout

    def set_pip(self, pip_conf: str) -> None:
        """Rewrite /etc/pip.conf in place (same inode, so the bind mount sees it)."""
        with open(self.world / "pip.conf", "r+") as handle:
            handle.truncate(0)
            handle.write(pip_conf)

    def stop(self, timeout: float = 60) -> None:
        """`instances stop`: a clean shutdown (SIGRTMIN+3 to systemd, see boot())."""
        sh("docker", "stop", "-t", str(int(timeout)), self.container, timeout=timeout + 30)

    def start(self) -> None:
        sh("docker", "start", self.container)


def pip_conf_wheelhouse(url: str) -> str:
    # pip trusts plain HTTP only from localhost or a trusted-host (a mirror's usual pip.conf).
    host = url.split("//", 1)[1].split(":", 1)[0].split("/", 1)[0]
    return f"[global]\nno-index = true\nfind-links = {url}\ntrusted-host = {host}\ntimeout = 30\n"


def pip_conf_index(url: str, timeout: int) -> str:
    return f"[global]\nindex-url = {url}\ntimeout = {timeout}\nretries = 0\n"


class VmLab:
    """Boots machines at once; close() removes every container by ID and stops every server."""

    def __init__(self, workdir: Path):
        # Machines a killed earlier run of this same lab network left behind (ours by label).
        stale = sh("docker", "ps", "-aq", "--filter", f"label={LABEL}", check=False).stdout.split()
        if stale:
            sh("docker", "rm", "-f", *stale, check=False)
        self.cache = ensure_cache()
        self.workdir = workdir
        self.machines: list[Machine] = []
        # The real scripts, as terraform's file() reads them into the metadata.
        self.startup_script = (REPO / "startup/startup.sh").read_text()
        # terraform/main.tf's watchdog_package: {"file.py": source} as jsonencode writes it.
        self.watchdog = json.dumps({path.name: path.read_text()
                                    for path in sorted((REPO / "startup/tfcluster_watchdog").glob("*.py"))})

    def metadata_values(self, name: str, nonce: str, idle_minutes: float, extra: dict[str, str],
                        planned: dict[str, str] | None = None) -> dict[str, str]:
        attributes = dict(planned) if planned is not None else {
            # Every key terraform/instances.tf sets, with the values it would set on a CPU VM.
            "block-project-ssh-keys": "true",
            "enable-oslogin": "false",
            "enable-guest-attributes": "TRUE",
            "serial-port-enable": "false",
            "install-nvidia-driver": "False",
            "ssh-keys": "tfcluster:ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA test",
            "tfcluster-cluster": "vmlab",
            "tfcluster-tf-port": "2222",
            "tfcluster-idle-minutes": f"{idle_minutes:g}",
            "tfcluster-idle-action": "stop",
            "tfcluster-idle-probes": "jobs_and_ssh",
            "tfcluster-boot-grace-minutes": "45",
            "tfcluster-watchdog": self.watchdog,
            "tfcluster-boot-nonce": nonce,
            "tfcluster-docker": "false",
            "startup-script": self.startup_script,
        }
        attributes.update({"tfcluster-boot-nonce": nonce, **extra})
        values = {f"instance/attributes/{key}": value for key, value in attributes.items()}
        values.update({"instance/id": str(abs(hash((name, nonce))) % 10**18 + 10**18), "instance/name": name, "instance/zone": "projects/123/zones/europe-west4-a",
                       "project/project-id": "vmlab-project"})
        return values

    def boot(self, name: str, *, nonce: str, pip: str = "wheelhouse", apt: str = "offline",
             idle_minutes: float = 60, extra: dict[str, str] | None = None,
             planned: dict[str, str] | None = None) -> Machine:
        """Start one machine. pip: wheelhouse | dead | hung; apt: offline | dead. ``planned``: the
        instance metadata as terraform plans it (tests/world/provider/planning.py), served
        instead of the CPU VM's set above; the nonce and ``extra`` still apply."""
        address = f"127.{NET}.0.{10 + len(self.machines)}"
        world = self.workdir / name
        world.mkdir(parents=True)
        metadata = FakeMetadataServer(self.metadata_values(name, nonce, idle_minutes, extra or {}, planned),
                                      bind=(address, 80))
        machine = Machine(name, address, metadata, world, closers=[metadata.close])
        self.machines.append(machine)
        if pip == "wheelhouse":
            machine.wheels = WheelServer(address, self.cache["WHEELHOUSE"])
            machine.closers.append(machine.wheels.close)
            pip_conf = pip_conf_wheelhouse(machine.wheels.url)
        elif pip == "dead":
            pip_conf = pip_conf_index(f"{DEAD}/simple", timeout=3)
        else:
            machine.hung = HungIndex(address)
            machine.closers.append(machine.hung.close)
            # A long read timeout: only the boot grace can end this boot in test time.
            pip_conf = pip_conf_index(machine.hung.url, timeout=3600)
        (world / "pip.conf").write_text(pip_conf)
        source = "file:/srv/tfcluster-apt ./" if apt == "offline" else f"{DEAD}/debian bookworm main"
        (world / "tfcluster.list").write_text(f"deb [trusted=yes] {source}\n")
        machine.container = sh(
            "docker", "run", "-d", "--label", LABEL, "--hostname", name,
            "--network", "host", "--add-host", f"metadata.google.internal:{address}",
            # SIGRTMIN+3 halts systemd cleanly: `docker stop` is the ACPI shutdown of `instances stop`.
            "--stop-signal", "SIGRTMIN+3",
            "--tmpfs", "/run", "--tmpfs", "/run/lock", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:ro",
            "-v", f"{world / 'pip.conf'}:/etc/pip.conf:ro",
            "-v", f"{world / 'tfcluster.list'}:/etc/apt/sources.list.d/tfcluster.list:ro",
            "-v", f"{self.cache['APT_REPO']}:/srv/tfcluster-apt:ro",
            self.cache["IMAGE"], "/sbin/init").stdout.strip()
        return machine

    def close(self) -> None:
        ids = [machine.container for machine in self.machines if machine.container]
        if ids:
            sh("docker", "rm", "-f", *ids, check=False)
        for machine in self.machines:
            for closer in machine.closers:
                try:
                    closer()
                except OSError:
                    pass
