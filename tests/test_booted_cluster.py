"""The gcp backend end to end on VMs that boot (tests/world/booted.py): real terraform through the
provider stand-ins creates the instances, each becomes a systemd machine that runs the
startup-script terraform read from startup/startup.sh, and the product works on them with its
own defaults (the `tfcluster` login the guest agent makes from ssh-keys, /opt/tfcluster/venv,
~/.tfcluster-remote). Nothing is overridden but the world around it.

One cluster of 2 VMs lives through one ordered scenario (each step needs the one before):
up -> train on gs:// -> pull -> idle stop -> up again (restart) -> train again -> down.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from tests.conftest import Cli, wait_for
from tests.hostlab import available
from tests.imagelab import ensure_dockerd
from tests.world.booted import EXTERNAL, BootedMachines
from tests.world.names import VM_TOKEN
from tests.world.provider import mirror

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("debootstrap") is None or available() is not None,
                                reason="needs root, debootstrap, Docker and network namespaces (.ci/run installs them)")
TF_VERSION = "2.21.0"
VM_EMAIL = "default-vm@demo-project.iam.gserviceaccount.com"


@pytest.fixture
def booted(tmp_path, world, synthetic_data):
    reason = ensure_dockerd()
    if reason:
        pytest.skip(reason)
    machines = BootedMachines(world, tmp_path / "booted")
    machines.metadata.tokens[VM_EMAIL] = VM_TOKEN
    cli = Cli(tmp_path / "state", synthetic_data)
    cli.env.update(mirror.build(tmp_path / "providers"))
    cli.env.update({"INVOKE_TFCLUSTER_BACKEND": "gcp", "INVOKE_TFCLUSTER_PROJECT": world.compute.state.project,
                    "INVOKE_TFCLUSTER_ZONE": "us-west1-b", "INVOKE_TFCLUSTER_WORKERS": "2",
                    # No GPU here: CPU VMs (the startup script then installs tensorflow without [and-cuda]).
                    "INVOKE_TFCLUSTER_GPU_COUNT": "0"})
    cli.enter(world)
    cli.machines = machines
    try:
        yield cli
    finally:
        try:
            if cli.cluster() is not None:
                cli.run("down", "--delete-bucket", timeout=300)
        finally:
            machines.close()


def instances(world) -> dict:
    with world.compute.state.lock:
        return {name: dict(record) for name, record in world.compute.state.instances.items()}


def test_a_booted_cluster_from_up_to_down(booted, world):
    cli, machines = booted, booted.machines
    up = cli.run("up", timeout=1500)
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:] + machines.journals()
    vms = instances(world)
    assert sorted(vms) == ["default-0", "default-1"]
    for name, record in vms.items():
        # Readiness came from startup.sh on the machine, with this boot's nonce.
        nonce = record["metadata"]["tfcluster-boot-nonce"]
        assert machines.metadata.history(name, "tfcluster/ready") == [f"{nonce}:starting", f"{nonce}:ok"]
        # SSH went to the external address, with the key its guest agent generated and published.
        assert record["external_ip"].startswith(EXTERNAL + ".")
    known = (cli.state_dir / "gcp" / "default" / "known_hosts")
    print(up.stdout[-2000:])

    train = cli.run("train", "--", "--epochs", "2", timeout=900)
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    run_dir, run = cli.latest_run()
    assert run["summary"]["replicas_in_sync"] == 2
