"""Ports a local cluster listens on: the `local_ports` setting ("FIRST-LAST", or empty for the
kernel's choice) and finding free ones. At the bottom layer: imports only tfcluster.errors."""

from __future__ import annotations

import random
import re
import socket

from tfcluster.errors import ClusterError, ConfigError

LOOPBACK = "127.0.0.1"


def parse_range(key: str, value, where: str) -> str:
    """"FIRST-LAST" of unprivileged ports ("" = the kernel's choice), normalised; ``where`` names
    the places the setting can be fixed."""
    text = str(value or "").strip()
    if not text:
        return ""
    match = re.fullmatch(r"(\d+)\s*-\s*(\d+)", text)
    if not match or not 1024 <= int(match[1]) <= int(match[2]) <= 65535:
        raise ConfigError(f"{key} must be a port range FIRST-LAST within 1024-65535, such as 20000-20099, "
                          f"or empty for any free port (got {value!r}); set it in {where}")
    return f"{int(match[1])}-{int(match[2])}"


def port_range(text: str) -> range | None:
    """The ports of a parsed ``local_ports`` value, or None for the kernel's choice."""
    if not text:
        return None
    first, last = (int(part) for part in text.split("-"))
    return range(first, last + 1)


def free_ports(count: int, address: str = LOOPBACK, within: range | None = None,
               avoid: frozenset[int] = frozenset()) -> list[int]:
    """``count`` distinct ports free right now and not in ``avoid`` (ports already promised, such
    as the cluster's workers', which listen only while a run lasts): any the kernel picks, or ones of
    ``within`` (tfcluster.local_ports), tried from a random start so two clusters made one after
    the other rarely pick the same ports before either listens.

    Every socket stays bound until all ports are chosen, so none is handed out twice.
    """
    if within is not None:
        start = random.randrange(len(within))
        candidates = [port for port in [*within[start:], *within[:start]] if port not in avoid]
    else:
        candidates = [0] * (count + len(avoid))  # The kernel's choice; at worst each avoided port once.
    bound, chosen = [], []
    try:
        for port in candidates:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            bound.append(sock)
            try:
                sock.bind((address, port))
            except OSError:
                continue  # Taken (only a port of ``within`` can be).
            if sock.getsockname()[1] not in avoid:
                chosen.append(sock.getsockname()[1])
            if len(chosen) == count:
                return chosen
    finally:
        for sock in bound:
            sock.close()
    raise ClusterError(f"local_ports {within[0]}-{within[-1]} has fewer than {count} free ports; widen "
                       "tfcluster.local_ports or leave it empty for any free port" if within is not None
                       else f"the kernel has fewer than {count} free ports on {address}")
