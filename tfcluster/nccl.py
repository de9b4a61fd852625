"""What NCCL says about itself in a worker's log: its version, the network it chose, the interfaces.

The wrapper sets ``NCCL_DEBUG=INFO`` and ``NCCL_DEBUG_SUBSYS=INIT,NET`` on GPU workers
(tfcluster/launch.py); NCCL then prints, once per communicator, lines such as these, quoted from
transcripts users pasted publicly (tests/test_nccl_log.py cites each):

    NCCL version 2.19.3+cuda12.3                                   (rank 0 only, no prefix in older releases)
    host:2744870:2745046 [0] NCCL INFO NET/Socket : Using [0]ens7:10.128.0.32<0>
    host:2744870:2745046 [0] NCCL INFO Using network Socket
    host:39629:39686 [0] NCCL INFO NET/Plugin: Loaded net plugin NCCL RDMA Plugin v6 (v6)
    host:49355:49414 [1] NCCL INFO Using network IBext

"Using network <name>" names the net NCCL took: ``Socket`` and ``IB`` are its own
(NVIDIA/nccl src/transport/net_socket.cc, net_ib.cc); a plugin's is the name it registers, e.g.
``GPUDirectTCPX_v7`` (google/nccl-plugin-gpudirecttcpx src/nccl_plugin.cc: ``ncclNetPlugin_v7 =
{"GPUDirectTCPX_v7", ...}``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# "host:pid:tid [dev] NCCL INFO message" (NVIDIA/nccl src/debug.cc); a WARN line is an error to show.
INFO_LINE = re.compile(r"(?:^|\s)NCCL INFO (?P<message>.*)$")
VERSION = re.compile(r"(?:^|\s)NCCL version (?P<version>\d+\.\d+\.\d+)")
NETWORK = re.compile(r"^Using network (?P<name>\S+)")
SOCKET_INTERFACES = re.compile(r"^NET/Socket ?: Using (?P<list>\[\d+\].*)$")
INTERFACE = re.compile(r"\[\d+\](?P<name>[^:\s]+)")
PLUGIN = re.compile(r"^NET/Plugin ?: Loaded net plugin (?P<name>.+?)(?: \(v\d+\))?$")


def is_nccl_line(line: str) -> bool:
    """An NCCL INFO line, or its bare version line: start-up detail the console folds."""
    return bool(INFO_LINE.search(line) or VERSION.match(line.strip()))


@dataclass
class NcclInit:
    """What one worker's NCCL said at initialisation (empty strings: not said, or not yet)."""

    # "2.19.3" (without "+cudaX.Y").
    version: str = ""
    # The net NCCL uses between machines: "Socket", "IB", "IBext", or a plugin's ("GPUDirectTCPX_v7").
    network: str = ""
    # NET/Socket's interfaces, in its order ("eth0").
    interfaces: list[str] = field(default_factory=list)
    # The net plugin that loaded ("" when none did: NCCL's internal nets).
    plugin: str = ""

    @property
    def seen(self) -> bool:
        return bool(self.version or self.network or self.interfaces)

    def observe(self, line: str) -> bool:
        """Take what ``line`` says; True when it is one of NCCL's."""
        version = VERSION.search(line)
        if version and not self.version:
            self.version = version["version"]
        info = INFO_LINE.search(line)
        if info is None:
            return version is not None
        message = info["message"].strip()
        for pattern, apply in ((NETWORK, lambda m: setattr(self, "network", m["name"])),
                               (SOCKET_INTERFACES, lambda m: setattr(self, "interfaces",
                                                                     INTERFACE.findall(m["list"]))),
                               (PLUGIN, lambda m: setattr(self, "plugin", m["name"].strip()))):
            found = pattern.match(message)
            if found:
                apply(found)
        return True

    def describe(self) -> str:
        """"NCCL 2.27.7, NET/Socket on eth0"; "NCCL 2.19.3, NET/GPUDirectTCPX" (a plugin's net)."""
        head = f"NCCL {self.version}" if self.version else "NCCL"
        # Releases before 2.6 print no "Using network" line: NET/Socket's list is then the net (NVIDIA/nccl#278).
        network = self.network or ("Socket" if self.interfaces else "")
        if not network:
            return f"{head} (no network chosen in the log: one machine's all-reduce, or NCCL_DEBUG_SUBSYS without NET)"
        on = f" on {', '.join(self.interfaces)}" if network == "Socket" and self.interfaces else ""
        return f"{head}, NET/{re.sub(r'_v[0-9]+$', '', network)}{on}"  # A plugin's API version is not its name.
