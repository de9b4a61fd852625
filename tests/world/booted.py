"""VMs that boot: each instance that instances.insert creates becomes a systemd machine from the
vmlab image (tests/vmlab.py, .ci/vm-cache.sh), which runs what terraform put in its metadata.

What Compute Engine does for a VM, done to the machine that plays it:
- **Addresses** (https://cloud.google.com/compute/docs/ip-addresses): a primary internal address
  that stays for the life of the instance, and an ephemeral external one, released at a stop and
  new at each start (#ephemeraladdress). Both are on the machine's one interface, on the lab's
  bridge: internal ones from 10.251.N.0/24 (the lab's own range, not the subnetwork's
  10.128.0.0/20, so two labs on one machine never clash), external ones from 10.252.N.0/24. The
  laptop is 10.252.N.1, the address the world's public-address lookup answers.
- **The metadata server** (tests/world/booted_metadata.py) answers each machine by its address,
  from the instance's record: the metadata terraform set, instance/id, the token of the
  instance's service account, guest attributes in and out.
- **The guest agent** is in the image (.ci/vm-cache.sh): host keys at the first boot of an
  instance id, accounts from ssh-keys.
- **OS Login's guest environment** (tests/world/oslogin_guest.py, mounted into each machine): sshd
  asks it for a login's keys (AuthorizedKeysCommand), and it answers from the instance's
  enable-oslogin and the world's OS Login through the metadata server; it makes the login
  profiles' POSIX accounts as the NSS module would.
- **Boots.** Each boot has its own kernel boot id (/proc/sys/kernel/random/boot_id), as a VM's
  kernel makes one; the watchdog counts idleness afresh from a new one.
- **Lifecycle.** A stop inside the guest (`shutdown -h`, the watchdog's stop) halts the machine
  and the instance becomes TERMINATED; guest attributes are cleared then (Google does not say they
  survive a stop: the strict reading, https://cloud.google.com/compute/docs/metadata/manage-guest-attributes).
  Compute's start boots the same disk; instances.delete removes the machine.
- **Firewall** (https://cloud.google.com/firewall/docs/firewalls): ingress is denied unless a
  rule of the instance's network allows it; a rule applies to the instances carrying one of its
  targetTags (all, without any), and matches traffic from its sourceRanges or from the primary
  internal address of an instance carrying one of its sourceTags; the lowest priority number wins
  and a deny wins a tie; disabled rules do not apply; egress is allowed (the implied rule; no
  egress rule is modelled). Rules are enforced by each machine's own netfilter, set from outside
  its network namespace, and follow changes within a second (Google: "a few seconds").
The world's servers the VMs use (Compute for the watchdog's delete, Cloud Storage for gs://, the
wheelhouse for pip) are reached on the bridge under Google's names (the machine's /etc/hosts) and
trust the test CA (its /etc/ssl).
"""

from __future__ import annotations

import secrets
import socket
import subprocess
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tests.vmlab import LABEL, WheelServer, ensure_cache, pip_conf_wheelhouse, sh
from tests.world.booted_firewall import iptables_rules
from tests.world.booted_metadata import InstanceMetadata
from tests.world.names import COMPUTE_NAMES, STORAGE_NAMES

from tests.hostlab import NET

BRIDGE = f"tfvbr{NET}"
INTERNAL = f"10.251.{NET}"
EXTERNAL = f"10.252.{NET}"
LAPTOP = f"{EXTERNAL}.1"
GUEST_OSLOGIN = "/usr/local/sbin/tfcluster-test-oslogin"
# Wait for the interface this lab plugs in from outside, then boot: systemd's units (the guest
# agent, the startup script) need the network the moment they start.
INIT = ["/bin/sh", "-c", 'until [ "$(cat /sys/class/net/eth0/operstate 2>/dev/null)" = up ]; do sleep 0.1; done; '
        "exec /sbin/init"]


@dataclass
class BootedVm:
    # The instance's name in Compute.
    name: str
    # Index of this machine in the lab (names its veth).
    index: int
    # Its primary internal address (kept across stop and start).
    internal_ip: str
    # Its current ephemeral external address (None while stopped).
    external_ip: str | None
    # The docker container that plays it.
    container: str
    # The PID of its init, for nsenter (0 while stopped).
    pid: int = 0
    # The firewall rules last applied to its network namespace (iptables-restore input).
    applied_rules: str = ""


class TcpRelay:
    """Bytes from (address, port) on the bridge to a world server on loopback, unchanged (TLS
    passes through, so the VMs see the server's own certificate)."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]):
        self.target = target
        self.sock = socket.create_server(listen, reuse_port=False)
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._pipe_pair, args=(client,), daemon=True).start()

    def _pipe_pair(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=10)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        for source, sink in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.closed = True
        self.sock.close()


@dataclass
class BootedMachines:
    """FakeCompute's on_insert / on_start / on_delete for a world whose VMs boot (see above)."""

    # The GoogleWorld whose Compute creates the instances.
    world: object
    # Folder for this lab's files (hosts file, pip.conf, trust store).
    root: Path
    vms: dict = field(default_factory=dict)
    closers: list = field(default_factory=list)

    def __post_init__(self):
        stale = sh("docker", "ps", "-aq", "--filter", f"label={LABEL}-booted", check=False).stdout.split()
        if stale:
            sh("docker", "rm", "-f", *stale, check=False)
        self._teardown_network()
        self.cache = ensure_cache()
        self.state = self.world.compute.state
        # Compute's own lock: its operations call in here holding it (one order, no deadlock).
        self.lock = self.state.lock
        self.closed = False
        self._next_external = 10
        self.root.mkdir(parents=True, exist_ok=True)
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        for address in (f"{INTERNAL}.1/24", f"{INTERNAL}.2/24", f"{INTERNAL}.3/24", f"{LAPTOP}/24"):
            sh("ip", "addr", "add", address, "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")
        self.metadata = InstanceMetadata(self.state, self.name_at, bind=(f"{INTERNAL}.1", 80),
                                         oslogin=self.world.oslogin.state)
        self.wheels = WheelServer(f"{INTERNAL}.1", self.cache["WHEELHOUSE"])
        compute = TcpRelay((f"{INTERNAL}.2", 443), (self.world.compute_address, 443))
        self.world.storage_proxy.listen(f"{INTERNAL}.3", 443, self.world.tls_context)
        self.world.storage_proxy.listen(f"{INTERNAL}.3", 80, None)
        self.closers += [self.metadata.close, self.wheels.close, compute.close]
        (self.root / "hosts").write_text(
            "127.0.0.1 localhost\n"
            # A Compute Engine image's /etc/hosts names the metadata server (169.254.169.254 there).
            f"{INTERNAL}.1 metadata.google.internal metadata\n"
            f"{INTERNAL}.2 {' '.join(COMPUTE_NAMES)}\n{INTERNAL}.3 {' '.join(STORAGE_NAMES)}\n")
        (self.root / "pip.conf").write_text(pip_conf_wheelhouse(self.wheels.url))
        # OS Login's guest part (tests/world/oslogin_guest.py): sshd asks it for a user's keys.
        (self.root / "oslogin.conf").write_text(f"AuthorizedKeysFile none\nAuthorizedKeysCommand {GUEST_OSLOGIN} keys %u\n"
                                                "AuthorizedKeysCommandUser root\n")
        (self.root / "tfcluster.list").write_text("deb [trusted=yes] file:/srv/tfcluster-apt ./\n")
        self.world.trust_store(self.root / "ssl")
        self.world.checkip.public = LAPTOP  # The laptop as the VMs see it.
        self.state.guests_report_ready = True
        self.state.on_insert, self.state.on_start, self.state.on_delete = self.insert, self.start, self.delete
        threading.Thread(target=self._enforce_firewalls, daemon=True).start()

    # ---- what Compute calls
    def insert(self, name: str, record: dict) -> None:
        with self.lock:
            index = len(self.vms)
            internal = f"{INTERNAL}.{10 + index}"
            record["id"] = str(secrets.randbelow(10**19 - 10**18) + 10**18)
            record["internal_ip"], record["external_ip"] = internal, self._new_external()
            container = sh(
                "docker", "run", "-d", "--label", f"{LABEL}-booted", "--hostname", name, "--network", "none",
                "--stop-signal", "SIGRTMIN+3", "--tmpfs", "/run", "--tmpfs", "/run/lock",
                # A VM's root holds every capability; Docker's default set drops CAP_SYS_PTRACE, without
                # which root may not read another user's /proc/PID/environ or fd links (proc(5): a
                # PTRACE_MODE_READ_FSCREDS check, ptrace(2)), so the watchdog would never see a job.
                "--cap-add", "SYS_PTRACE",
                "-v", "/sys/fs/cgroup:/sys/fs/cgroup:ro",
                "-v", f"{self.root / 'hosts'}:/etc/hosts:ro", "-v", f"{self.root / 'ssl'}:/etc/ssl:ro",
                "-v", f"{self.root / 'pip.conf'}:/etc/pip.conf:ro",
                "-v", f"{self.root / 'oslogin.conf'}:/etc/ssh/sshd_config.d/tfcluster-oslogin.conf:ro",
                "-v", f"{Path(__file__).with_name('oslogin_guest.py')}:{GUEST_OSLOGIN}:ro",
                "-v", f"{self.root / 'tfcluster.list'}:/etc/apt/sources.list.d/tfcluster.list:ro",
                "-v", f"{self.cache['APT_REPO']}:/srv/tfcluster-apt:ro",
                self.cache["IMAGE"], *INIT).stdout.strip()
            vm = BootedVm(name, index, internal, record["external_ip"], container)
            self.vms[name] = vm
            self._plug(vm)

    def start(self, name: str, external_ip: str) -> None:
        record = self.state.instances[name]
        with self.lock:
            vm = self.vms[name]
            vm.external_ip = record["external_ip"] = self._new_external()
            sh("docker", "start", vm.container)
            self._plug(vm)

    def delete(self, name: str) -> None:
        with self.lock:
            vm = self.vms.pop(name, None)
        if vm is not None:
            sh("docker", "rm", "-f", vm.container, check=False)

    # ---- the machine's network and life
    def _new_external(self) -> str:
        self._next_external += 1
        return f"{EXTERNAL}.{self._next_external}"

    def _plug(self, vm: BootedVm) -> None:
        """Its interface on the bridge, firewalled before it comes up; then watch for its halt."""
        vm.pid = int(sh("docker", "inspect", "-f", "{{.State.Pid}}", vm.container).stdout)
        veth = f"tfv{NET}_{vm.index}"
        sh("ip", "link", "del", veth, check=False)
        sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", str(vm.pid))
        sh("ip", "link", "set", veth, "master", BRIDGE, "up")
        # A new kernel boot id for this boot (a VM's kernel makes one at each boot; a container
        # shares the host's, so it is bound over /proc from outside, before init runs).
        Path(f"/proc/{vm.pid}/root/run/tfcluster-test-boot-id").write_text(f"{uuid.uuid4()}\n")
        sh("nsenter", "-t", str(vm.pid), "-m", "mount", "--bind", "-o", "ro", "/run/tfcluster-test-boot-id",
           "/proc/sys/kernel/random/boot_id")
        vm.applied_rules = ""
        self._apply_firewall(vm)
        inside = ["nsenter", "-t", str(vm.pid), "-n", "ip"]
        sh(*inside, "addr", "add", f"{vm.internal_ip}/24", "dev", "eth0")
        sh(*inside, "addr", "add", f"{vm.external_ip}/24", "dev", "eth0")
        sh(*inside, "link", "set", "lo", "up")
        sh(*inside, "link", "set", "eth0", "up")
        # OS Login's accounts (the guest environment's NSS part) for as long as this boot runs.
        sh("docker", "exec", "-d", vm.container, "/usr/bin/python3", GUEST_OSLOGIN, "sync")
        threading.Thread(target=self._watch, args=(vm, vm.pid), daemon=True).start()

    def _watch(self, vm: BootedVm, pid: int) -> None:
        """The machine halted by itself (a shutdown inside): Compute shows the instance TERMINATED."""
        subprocess.run(["docker", "wait", vm.container], capture_output=True)
        from tests.fake_compute import stop_instance

        with self.lock:
            if self.closed or vm.pid != pid or self.vms.get(vm.name) is not vm:
                return  # Deleted, or already started again.
            vm.pid, vm.external_ip = 0, None
            record = self.state.instances.get(vm.name)
            if record is not None and record["status"] in ("RUNNING", "STOPPING"):
                stop_instance(self.state, vm.name)
                record["guest"].clear()

    def name_at(self, address: str) -> str | None:
        """The instance whose internal address this is (the metadata server's caller)."""
        with self.lock:
            return next((vm.name for vm in self.vms.values() if vm.internal_ip == address), None)

    # ---- firewall
    def _enforce_firewalls(self) -> None:
        while not self.closed:
            with self.lock:
                for vm in list(self.vms.values()):
                    if vm.pid:
                        try:
                            self._apply_firewall(vm)
                        except subprocess.SubprocessError:
                            pass  # It halted meanwhile; _watch records that.
            threading.Event().wait(0.5)

    def _apply_firewall(self, vm: BootedVm) -> None:
        rules = iptables_rules(self.state, vm.name)
        if rules != vm.applied_rules:
            subprocess.run(["nsenter", "-t", str(vm.pid), "-n", "iptables-restore"], input=rules, text=True,
                           check=True, capture_output=True, timeout=30)
            vm.applied_rules = rules

    # ---- tests' views
    def exec(self, name: str, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return sh("docker", "exec", self.vms[name].container, *argv, check=False, timeout=timeout)

    def journals(self, unit: str = "google-startup-scripts", lines: int = 30) -> str:
        """The last lines of one unit's journal on every machine (for a failing test's message)."""
        with self.lock:
            names = list(self.vms)
        return "\n".join(f"--- {name}:\n" + self.exec(name, "journalctl", "-u", unit, "--no-pager", "-n", str(lines),
                                                      "-o", "cat").stdout for name in names)

    def running(self, name: str) -> bool:
        vm = self.vms.get(name)
        return vm is not None and sh("docker", "inspect", "-f", "{{.State.Running}}", vm.container,
                                     check=False).stdout.strip() == "true"

    def close(self) -> None:
        self.closed = True
        with self.lock:
            ids = [vm.container for vm in self.vms.values()]
        if ids:
            sh("docker", "rm", "-f", *ids, check=False)
        for closer in self.closers:
            try:
                closer()
            except OSError:
                pass
        self._teardown_network()

    def _teardown_network(self) -> None:
        sh("ip", "link", "del", BRIDGE, check=False)
