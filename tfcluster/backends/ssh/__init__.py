"""The ssh backend: your own hosts over SSH, and the transport under the gcp backend.

Rooms: connection (SSH sessions, pinned host keys, deadlines), host (the WorkerHost over SSH),
sync (content-hashed code and data bundles), mesh (TF-port reachability), watchdog (the idle
watchdog on own hosts), backend (SshBackend). May import tfcluster.backends.{base,group},
state, config and errors; never commands or launch.
"""

from tfcluster.backends.ssh.backend import SshBackend
from tfcluster.backends.ssh.connection import HostAddress, SshConnection, parse_hosts
from tfcluster.backends.ssh.host import SshHost

__all__ = ["HostAddress", "SshBackend", "SshConnection", "SshHost", "parse_hosts"]
