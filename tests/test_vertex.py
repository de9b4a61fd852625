"""`--backend vertex`: each run's attempts as Vertex AI custom jobs, in the test world
(tests/world/vertex.py, cloud_logging.py), with the real terraform on the unmodified module."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests import imagelab
from tests.conftest import Cli
from tests.world.provider import mirror
from tests.world.vertex_replicas import LABEL, NET

REGION = "us-west1"  # Where the world's Compute offers T4s (Vertex AI trains on its machines).


def make_vertex_cli(tmp_path, world, synthetic_data) -> Cli:
    cli = Cli(tmp_path / "state", synthetic_data)
    cli.env.update(mirror.build(tmp_path / "providers"))
    cli.env.update({"INVOKE_TFCLUSTER_BACKEND": "vertex", "INVOKE_TFCLUSTER_PROJECT": world.compute.state.project,
                    "INVOKE_TFCLUSTER_REGION": REGION})
    cli.enter(world)
    return cli


def replicas() -> list[str]:
    """The world's replica containers of this lab (tests/world/vertex_replicas.py's label)."""
    return subprocess.run(["docker", "ps", "-a", "--filter", f"label={LABEL}", "--format", "{{.Names}}"],
                          capture_output=True, text=True, check=True).stdout.split()


def test_up_and_down(tmp_path, world, synthetic_data):
    cli = make_vertex_cli(tmp_path, world, synthetic_data)
    up = cli.run("up", timeout=300)
    print(up.stdout, up.stderr)
    assert up.returncode == 0
    cluster = cli.cluster()
    print(json.dumps(cluster, indent=1))
    down = cli.run("down", timeout=300)
    print(down.stdout, down.stderr)
    assert down.returncode == 0


def test_check_offers_tune_tmp(tmp_path, world, synthetic_data):
    cli = make_vertex_cli(tmp_path, world, synthetic_data)
    for args in (("check",), ("offers", "--backend", "vertex"), ("check", "--gpu", "h100", "--region", "us-west1")):
        r = cli.run(*args, timeout=300)
        print(args, r.returncode, r.stdout, r.stderr)
