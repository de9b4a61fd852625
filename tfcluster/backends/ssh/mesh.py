"""Preflight of the TensorFlow port mesh: every host reaches every other host's TF port."""

from __future__ import annotations

import shlex
import time

from tfcluster.backends.group import in_parallel
from tfcluster.backends.ssh.host import SshHost
from tfcluster.errors import ClusterError, HostUnreachable

LISTENER = """
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(64)
s.settimeout(1)
end = time.time() + float(sys.argv[3])
while time.time() < end:
    try:
        s.accept()[0].close()
    except OSError:
        pass
"""

CONNECTOR = """
import socket, sys
bad = []
for endpoint in sys.argv[1:]:
    address, port = endpoint.rsplit(":", 1)
    try:
        socket.create_connection((address, int(port)), timeout=3).close()
    except OSError as error:
        bad.append(f"{endpoint} ({error})")
print("; ".join(bad))
sys.exit(1 if bad else 0)
"""


def check_tf_port_mesh(hosts: list[SshHost]) -> None:
    """Every host can open a TCP connection to every other host's TensorFlow port."""
    if len(hosts) < 2:
        return

    def listen(host: SshHost) -> int:
        command = (f"setsid {shlex.join([host.python, '-c', LISTENER, host.record.address, str(host.record.tf_port), '30'])}"
                   " </dev/null >/dev/null 2>&1 & echo $!")
        code, out = host.connection.shell(command)
        if code != 0 or not out.strip().isdigit():
            raise ClusterError(f"could not open a test listener on port {host.record.tf_port}: {out.strip()}")
        return int(out.strip())

    listeners = in_parallel(hosts, listen, lambda h: h.record.name, "starting the TF-port test listeners")
    try:
        # Wait for every listener to be bound before anyone connects.
        deadline = time.monotonic() + 15
        for host in hosts:
            while not host.port_in_use(host.record.tf_port):
                if time.monotonic() > deadline:
                    raise ClusterError(f"{host.record.name}: test listener did not start")
                time.sleep(0.1)

        def connect(host: SshHost) -> None:
            others = [h.record.endpoint for h in hosts if h is not host]
            code, out, _ = host.connection.run(shlex.join([host.python, "-c", CONNECTOR, *others]), timeout=60)
            if code != 0:
                raise ClusterError(f"cannot reach {out.strip()}; open TCP port {host.record.tf_port} "
                                   "between the hosts (firewall or security group)")

        in_parallel(hosts, connect, lambda h: f"{h.record.name} ({h.record.address})",
                    "checking that the hosts reach each other's TensorFlow port")
    finally:
        for host, pid in zip(hosts, listeners):
            try:
                host.signal(pid, 9)
            except HostUnreachable:
                pass
