"""Real OpenSSH test hosts on one machine: one network namespace, IP, hostname and sshd each.

Follows shared/notes/test-hosts.md: a bridge in the root namespace, a veth pair per host,
`sshd -D` started with `unshare --uts` so each host has its own hostname. Traffic only
goes to addresses inside these namespaces. Teardown kills every process inside each
namespace (`ip netns del` does not) before deleting it.
"""

from __future__ import annotations

import os
import shutil
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# One lab network per test process: TFCLUSTER_TESTLAB_NET (1-200) picks the /24 and the names,
# so two suites (two worktrees, a bench beside the tests) never share a bridge or a namespace.
NET = int(os.environ.get("TFCLUSTER_TESTLAB_NET", "7"))
SUBNET = f"10.250.{NET}"
BRIDGE = f"tfcbr{NET}"


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), check=check, capture_output=True, text=True)


def available() -> str | None:
    """None when namespaces and sshd can be used here, else the reason."""
    if os.geteuid() != 0:
        return "needs root for ip netns"
    if not Path("/usr/sbin/sshd").exists():
        return "openssh-server is not installed (.ci/run installs it)"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "needs iproute2 and util-linux"
    return None


# The VMs' login (tfcluster/config.py gcp_ssh_user) as a uid no account of this machine has.
VM_LOGIN, VM_UID = "tfcluster", 64123


def vm_login_files(home: Path) -> dict[str, str]:
    """/etc/passwd, group and shadow with the `tfcluster` login added, for `ip netns exec` to put
    over /etc in the hosts' mount namespaces: this machine's own files stay as they are."""
    def read(name: str) -> list[str]:
        return Path("/etc", name).read_text().splitlines()

    passwd = read("passwd") + [f"{VM_LOGIN}:x:{VM_UID}:{VM_UID}::{home}:/bin/bash"]
    group = [line + ("," if not line.endswith(":") else "") + VM_LOGIN if line.startswith("docker:") else line
             for line in read("group")] + [f"{VM_LOGIN}:x:{VM_UID}:"]
    # "*": no password, not locked (sshd refuses a "!" account when UsePAM is off).
    shadow = read("shadow") + [f"{VM_LOGIN}:*:19000:0:99999:7:::"]
    return {"passwd": "\n".join(passwd) + "\n", "group": "\n".join(group) + "\n",
            "shadow": "\n".join(shadow) + "\n"}


def _reachable(path: Path) -> list[str]:
    """Shell lines that let a non-root login reach ``path`` (the suite's Python: pyenv keeps it
    under /root, mode 700) in this mount namespace only: the first ancestor others may not enter
    becomes an empty tmpfs holding a bind mount of ``path``, staged through /opt."""
    path = path.resolve()
    blocked = next((parent for parent in reversed(path.parents) if not os.stat(parent).st_mode & 0o001), None)
    if blocked is None:
        return []
    staged, quoted = "/opt/.tfcluster-python", shlex.quote(str(path))
    return [f"mkdir -p {staged}", f"mount --bind {quoted} {staged}",
            f"mount -t tmpfs -o mode=755 tfcluster-reach {shlex.quote(str(blocked))}",
            f"mkdir -p {quoted}", f"mount --bind {staged} {quoted}"]


@dataclass
class TestHost:
    # Index, namespace name, address and hostname.
    index: int
    netns: str
    address: str
    hostname: str
    # The sshd process (ip netns exec ... unshare ... sshd -D); HostLab.start_sshd sets it.
    sshd: subprocess.Popen | None
    # Public host key line ("ssh-ed25519 AAAA...").
    host_key_public: str
    # Host-side veth name, for cutting the link.
    veth: str

    def exec(self, *argv: str, check: bool = False) -> subprocess.CompletedProcess:
        return sh("ip", "netns", "exec", self.netns, *argv, check=check)

    def pids(self) -> list[int]:
        out = sh("ip", "netns", "pids", self.netns, check=False).stdout.split()
        return [int(pid) for pid in out]

    def inside(self, *argv: str) -> list[str]:
        """``argv`` run as a process of this host, for a lab with ``own_pids``: in the PID, mount,
        network and UTS namespaces of its sshd, so it sees only the host's own processes (as a
        program on a VM does) and the host's sessions see it."""
        children = wait_for_children(self.sshd.pid)
        return ["nsenter", "--target", str(children[0]), "--pid", "--mount", "--net", "--uts", *argv]

    def cut_link(self) -> None:
        sh("ip", "link", "set", self.veth, "down")

    def restore_link(self) -> None:
        sh("ip", "link", "set", self.veth, "up")


def wait_for_children(pid: int, timeout: float = 10) -> list[int]:
    """The child processes of ``pid`` (unshare --fork's child is the namespace's first process)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            children = []
        if children:
            return [int(child) for child in children]
        time.sleep(0.05)
    raise RuntimeError(f"process {pid} started no child within {timeout}s")


class HostLab:
    """N hosts with a shared client key and a known_hosts file that lists them all."""

    def __init__(self, root: Path, count: int, tag: str = "tc", client_alive: bool = True,
                 listen_all: bool = False, etc: dict[str, str | Path] | None = None, vm_login: bool = False,
                 own_pids: bool = False, sbin: dict[int, Path] | None = None):
        """``client_alive=False`` leaves sshd's ClientAliveInterval at its default (off), as on most
        hosts: sshd then never notices on its own that a client behind a cut link is gone.
        ``vm_login=True`` makes each host what startup/startup.sh leaves on a VM, so the gcp backend
        runs with its own defaults: the non-root login `tfcluster` (its own home on each host, in
        the docker group as the guest agent puts accounts it creates) and the venv at
        /opt/tfcluster/venv (this suite's venv, seen there through a mount only the host sees).
        ``own_pids=True`` gives each host a PID namespace of its own, with sshd as its first process
        (`TestHost.inside` runs a program there): a program that looks at every process, as the VM
        watchdog does, then sees the host's alone, not those of tests running beside it."""
        self.root = root
        self.own_pids = own_pids
        # Host index -> a folder each login there finds at /usr/local/sbin (first on root's PATH): the
        # programs of that host alone, such as its GPUs' nvidia-smi (tests/world/nvidia_smi.py).
        self.sbin = sbin or {}
        self.vm_login = vm_login
        self.homes = Path("/home") / f"tfcluster-lab-{tag}{NET}"
        self.tag = tag
        self.client_alive = client_alive
        # sshd on every address of its namespace, so an address added later (a VM's new
        # ephemeral IP) reaches it too.
        self.listen_all = listen_all
        # Files `ip netns exec` puts over /etc for every process of a host (hosts, ssl/...):
        # name -> text, or a folder to copy. The world the host's processes see.
        self.etc = etc or {}
        self.hosts: list[TestHost] = []
        # What tests started for these hosts (a metadata server on the bridge): stopped at teardown.
        self.closers: list = []
        self.root.mkdir(parents=True, exist_ok=True)
        self.client_key = root / "id_ed25519"
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.client_key))
        self.authorized_keys = root / "authorized_keys"
        shutil.copy(f"{self.client_key}.pub", self.authorized_keys)
        self.known_hosts = root / "known_hosts"
        Path("/run/sshd").mkdir(exist_ok=True)
        self._teardown_network(count + 8)  # Leftovers of an earlier, killed session.
        if vm_login:
            shutil.rmtree(self.homes, ignore_errors=True)
            self.homes.mkdir(mode=0o755, parents=True)
        try:
            sh("ip", "link", "add", BRIDGE, "type", "bridge")
            sh("ip", "addr", "add", f"{SUBNET}.1/24", "dev", BRIDGE)
            sh("ip", "link", "set", BRIDGE, "up")
            for index in range(count):
                self.hosts.append(self._add_host(index))
            self.known_hosts.write_text("".join(f"{h.address} {h.host_key_public}\n" for h in self.hosts))
            for host in self.hosts:
                self._wait_for_port(host)
        except BaseException:
            # A lab that fails half-built (a name clash, an sshd that never answers) is torn down
            # here: the caller never gets an object to tear down, and its sshd would outlive the test.
            self._teardown_started(count)
            raise

    def _add_host(self, index: int) -> TestHost:
        netns, veth, address = f"{self.tag}{NET}_h{index}", f"{self.tag}{NET}_v{index}", f"{SUBNET}.{10 + index}"
        sh("ip", "netns", "add", netns)
        sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
        sh("ip", "link", "set", veth, "master", BRIDGE, "up")
        sh("ip", "-n", netns, "addr", "add", f"{address}/24", "dev", "eth0")
        sh("ip", "-n", netns, "link", "set", "eth0", "up")
        sh("ip", "-n", netns, "link", "set", "lo", "up")
        host_dir = self.root / f"h{index}"
        host_dir.mkdir()
        host_key = host_dir / "ssh_host_ed25519_key"
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key))
        config = host_dir / "sshd_config"
        config.write_text("\n".join([
            f"HostKey {host_key}", f"PidFile {host_dir / 'sshd.pid'}", f"ListenAddress {'0.0.0.0' if self.listen_all else address}",
            # sshd reads these as the user: the `tfcluster` login reads its own copy.
            f"AuthorizedKeysFile {self.authorized_keys} .ssh/authorized_keys", "PasswordAuthentication no",
            "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no", "PermitRootLogin yes",
            "Subsystem sftp internal-sftp", "ClientAliveInterval 5" if self.client_alive else "", "MaxStartups 100:30:200",
            "MaxSessions 100", ""]))
        hostname = f"{self.tag}-h{index}"
        etc_dir = Path("/etc/netns") / netns
        shutil.rmtree(etc_dir, ignore_errors=True)
        files = {**self.etc}
        if self.vm_login:
            files.update(vm_login_files(self.home(index)))
            # A Compute Engine image's /etc/hosts names the metadata server ("169.254.169.254
            # metadata.google.internal metadata"); here it is on the bridge, where the world's
            # machines (tests/world/machines.py) serve it.
            hosts = str(self.etc.get("hosts") or "127.0.0.1 localhost\n")
            files["hosts"] = hosts + f"{SUBNET}.1 metadata.google.internal metadata\n"
        for name, content in files.items():
            etc_dir.mkdir(parents=True, exist_ok=True)
            if isinstance(content, Path):
                shutil.copytree(content, etc_dir / name, symlinks=True)
            else:
                (etc_dir / name).write_text(content)
                if name == "shadow":
                    os.chmod(etc_dir / name, 0o600)
        if self.vm_login:
            home = self.home(index)
            (home / ".ssh").mkdir(parents=True)
            shutil.copy(self.authorized_keys, home / ".ssh" / "authorized_keys")
            for path in (home, home / ".ssh", home / ".ssh" / "authorized_keys"):
                os.chown(path, VM_UID, VM_UID)
        public = Path(f"{host_key}.pub").read_text().split()
        host = TestHost(index, netns, address, hostname, None, f"{public[0]} {public[1]}", veth)
        self.start_sshd(host)
        return host

    def home(self, index: int) -> Path:
        """The `tfcluster` login's home on host ``index`` (``vm_login`` labs)."""
        return self.homes / f"h{index}"

    def start_sshd(self, host: TestHost) -> None:
        """(Re)start the host's sshd, as at a boot: its own hostname and, for ``vm_login`` labs,
        /opt/tfcluster/venv, in the mount namespace every login session inherits."""
        host_dir = self.root / f"h{host.index}"
        boot = [f"hostname {host.hostname}"]
        if host.index in self.sbin:  # In this host's mount namespace only (`ip netns exec` made it a slave).
            boot.append(f"mount --bind {shlex.quote(str(self.sbin[host.index]))} /usr/local/sbin")
        if self.vm_login:
            # A tmpfs over /opt in this host's mount namespace only (`ip netns exec` made it a slave).
            boot += ["mount -t tmpfs -o mode=755 tfcluster-opt /opt", "mkdir -p /opt/tfcluster",
                     f"ln -s {shlex.quote(sys.prefix)} /opt/tfcluster/venv", *_reachable(Path(sys.base_prefix))]
        boot.append(f"exec /usr/sbin/sshd -D -f {host_dir / 'sshd_config'} -E {host_dir / 'sshd.log'}")
        own_pids = ["--pid", "--fork", "--mount-proc"] if self.own_pids else []
        host.sshd = subprocess.Popen(["ip", "netns", "exec", host.netns, "unshare", "--uts", *own_pids, "sh", "-c",
                                      " && ".join(boot)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _wait_for_port(self, host: TestHost, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((host.address, 22), timeout=0.5) as sock:
                    if sock.recv(4).startswith(b"SSH"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sshd on {host.address} did not answer within {timeout}s")

    def kill_processes(self, host: TestHost, keep_sshd: bool = True) -> None:
        for pid in host.pids():
            if keep_sshd and pid == host.sshd.pid:
                continue
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def teardown(self) -> None:
        for close in reversed(self.closers):
            close()
        self.closers = []
        self._teardown_started(len(self.hosts))

    def _teardown_started(self, count: int) -> None:
        for host in self.hosts:
            self.kill_processes(host, keep_sshd=False)
            host.sshd.kill()
            host.sshd.wait(timeout=10)
        self._teardown_network(count)
        self.hosts = []
        if self.vm_login:
            shutil.rmtree(self.homes, ignore_errors=True)

    def _teardown_network(self, count: int) -> None:
        for index in range(count):
            netns = f"{self.tag}{NET}_h{index}"
            pids = sh("ip", "netns", "pids", netns, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            sh("ip", "netns", "del", netns, check=False)
            shutil.rmtree(Path("/etc/netns") / netns, ignore_errors=True)
            sh("ip", "link", "del", f"{self.tag}{NET}_v{index}", check=False)
        sh("ip", "link", "del", BRIDGE, check=False)
