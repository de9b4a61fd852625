"""The operator's public address, for the firewall rule that lets SSH in from it alone."""

from __future__ import annotations

import urllib.request

from tfcluster.errors import ConfigError


def detect_operator_cidr(timeout: float = 5.0) -> str:
    """This machine's public IPv4 as a /32, for the SSH firewall rule. Asked without any proxy:
    the services answer the address a request arrives from, and through an HTTPS_PROXY that is
    the proxy's, not the address this machine's SSH will come from."""
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    for url in ("https://checkip.amazonaws.com", "https://api.ipify.org"):
        try:
            with direct.open(url, timeout=timeout) as response:
                address = response.read().decode().strip()
            if address.count(".") == 3:
                return f"{address}/32"
        except OSError:
            continue
    raise ConfigError("cannot detect your public IP for the SSH firewall rule; set it with "
                      "--operator-cidr A.B.C.D/32 (or tfcluster.operator_cidr)")
