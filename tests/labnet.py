"""Which lab network this test process uses: TFCLUSTER_TESTLAB_NET (1-200).

The network number names everything a lab creates (hostlab's bridge and 10.250.N.0/24, vmlab's
127.N.0.X metadata addresses and container label, the world's 127.77.N.X servers, a block of TCP
ports), so two suites on one machine (two clones, a bench beside the tests), or two pytest-xdist
workers of one suite, never share one. A serial run whose caller sets the variable keeps its
choice; otherwise the first free number is claimed with an exclusive flock held for the life of
this process (the kernel drops it when the process dies, so a killed run frees its number),
skipping numbers whose bridge exists or whose world addresses are served, in case another suite
chose its number by hand. An xdist worker inherits the controller's environment, so it drops an
inherited number and claims its own.

Ports: a worker's TensorFlow server binds its port on every address, so a lab cannot scope its
ports by address the way it scopes its servers. Each lab owns a block below the kernel's
ephemeral range (32768-60999, /proc/sys/net/ipv4/ip_local_port_range), which no ``bind(0)`` or
outgoing connection of another process takes: the local clusters its tests make listen in the
first part (tfcluster.local_ports, which tests/conftest.py's Cli sets), ssh hosts on this
machine's loopback in the next four, the tests' own servers in the rest (``free_ports``).
"""

from __future__ import annotations

import errno
import fcntl
import os
import random
import socket
from pathlib import Path

VARIABLE = "TFCLUSTER_TESTLAB_NET"
LOCKS = Path("/run/lock/tfcluster-testlab")
FIRST, LAST = 7, 200
WORLD_OCTET = 77  # tests/world/names.py: 127.77.N.X.
_held: list[int] = []  # Open lock descriptors: closing one would free its number.
# Each lab's ports: 64 from 20000 up (lab 200's block ends at 32416, below the ephemeral range):
# 48 for the local clusters, 4 for TensorFlow servers of ssh hosts on this machine's loopback
# (tests/test_image.py), the rest for the tests' own servers.
PORTS_BASE, PORTS_PER_LAB, PORTS_FOR_CLUSTERS, PORTS_FOR_LOOPBACK_TF = 20000, 64, 48, 4


def _world_listening(number: int) -> bool:
    """Some process serves the world's addresses of this number (tests/world/names.py)."""
    for last in (1, 2, 3, 5):
        with socket.socket() as probe:
            try:
                probe.bind((f"127.{WORLD_OCTET}.{number}.{last}", 443))
            except OSError as error:
                if error.errno == errno.EADDRINUSE:
                    return True
    return False


def claim() -> int:
    """This process's lab network number, claimed once and exported for its subprocesses."""
    if os.environ.get("PYTEST_XDIST_WORKER") and not _held:
        # An xdist worker inherited the controller's number with its environment (xdist sets
        # PYTEST_XDIST_WORKER before the worker loads any conftest): it needs one of its own.
        os.environ.pop(VARIABLE, None)
    if os.environ.get(VARIABLE):
        return int(os.environ[VARIABLE])
    LOCKS.mkdir(parents=True, exist_ok=True)
    for number in range(FIRST, LAST + 1):
        if number == WORLD_OCTET:
            continue  # vmlab's 127.N.0.X would land on the world's 127.77.*.* servers.
        if Path(f"/sys/class/net/tfcbr{number}").exists() or _world_listening(number):
            continue  # A suite that chose its number by hand (or a killed run's bridge).
        fd = os.open(LOCKS / f"{number}.lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        _held.append(fd)
        os.environ[VARIABLE] = str(number)
        return number
    raise RuntimeError(f"every lab network {FIRST}-{LAST} is in use; set {VARIABLE}")


def number() -> int:
    """This process's claimed number (claim() runs first, in tests/conftest.py)."""
    return int(os.environ[VARIABLE])


def port_block(lab: int | None = None) -> range:
    lab = number() if lab is None else lab
    first = PORTS_BASE + (lab - FIRST) * PORTS_PER_LAB
    return range(first, first + PORTS_PER_LAB)


def cluster_ports(lab: int | None = None) -> str:
    """The local clusters' share of the block, as tfcluster.local_ports takes it ("FIRST-LAST")."""
    block = port_block(lab)
    return f"{block[0]}-{block[PORTS_FOR_CLUSTERS - 1]}"


def loopback_tf_ports() -> range:
    """Ports for TensorFlow servers of ssh hosts that share this machine's network (an ssh
    cluster's tf_port and the next ones): TensorFlow binds them on every address."""
    start = port_block()[PORTS_FOR_CLUSTERS]
    return range(start, start + PORTS_FOR_LOOPBACK_TF)


def free_ports(count: int, address: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports of this lab's server share that ``address`` can bind now, for a
    test's own servers (a registry, a storage emulator). Bound and released: within a lab, tests
    run one at a time, and no other lab's process binds these."""
    share = list(port_block()[PORTS_FOR_CLUSTERS + PORTS_FOR_LOOPBACK_TF:])
    random.shuffle(share)  # A server a killed test left behind holds one; don't always try it first.
    found = []
    for port in share:
        with socket.socket() as probe:
            try:
                probe.bind((address, port))
            except OSError:
                continue
        found.append(port)
        if len(found) == count:
            return found
    raise RuntimeError(f"lab {number()} has fewer than {count} free server ports on {address}")
