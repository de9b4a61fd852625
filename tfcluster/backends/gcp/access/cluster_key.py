"""The cluster's own SSH key pair (one per cluster, never the operator's): its private half stays in the
state folder, 0600; its public half goes into the VMs' metadata or the operator's OS Login profile."""

from __future__ import annotations

import os
from pathlib import Path


def generate_cluster_key(path: Path, comment: str) -> str:
    """A new ed25519 key pair for this cluster only: private key 0600 at ``path``; returns the public line."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    if path.exists():
        return Path(f"{path}.pub").read_text().strip()
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(private)
    line = f"{public.decode()} {comment}"
    Path(f"{path}.pub").write_text(line + "\n")
    return line
