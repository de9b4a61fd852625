"""Which lab network this test process uses: TFCLUSTER_TESTLAB_NET (1-200).

The network number names everything a lab creates (hostlab's bridge and 10.250.N.0/24, vmlab's
127.N.0.X metadata addresses and container label, the world's 127.77.N.X servers), so two
suites on one machine (two clones, a bench beside the tests) never share one. A caller that
sets the variable keeps its choice; otherwise the first free number is claimed with an
exclusive flock held for the life of this process (the kernel drops it when the process dies,
so a killed run frees its number), skipping numbers whose bridge exists or whose world addresses
are served, in case another suite chose its number by hand.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
from pathlib import Path

VARIABLE = "TFCLUSTER_TESTLAB_NET"
LOCKS = Path("/run/lock/tfcluster-testlab")
FIRST, LAST = 7, 200
WORLD_OCTET = 77  # tests/world/names.py: 127.77.N.X.
_held: list[int] = []  # Open lock descriptors: closing one would free its number.


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
