"""A run on workers whose hosts have GPUs, as far as a CPU machine can tell it: each host's
``nvidia-smi`` is the world's stand-in (tests/world/nvidia_smi.py) on the workers' PATH, and
TensorFlow is the real one (it finds no GPU, and says so)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.world import nvidia_smi

SCRIPTS = Path(__file__).resolve().parent / "scripts"
WARNING = re.compile(r"^! worker-\d's host has 2 GPUs \(nvidia-smi\) but TensorFlow trains on its CPU")


def test_a_script_on_gpu_workers_that_falls_back_to_the_ring_is_told_once_and_nccl_is_not(cli, tmp_path):
    cli.env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # TensorFlow's own default logging, as a user's shell has it.
    folder = nvidia_smi.install(tmp_path / "bin", "nvidia-l4", count=2)
    cli.env["PATH"] = f"{folder}:{cli.env['PATH']}"  # The local workers inherit the CLI's environment.
    assert cli.run("up", "--workers", "2").returncode == 0

    ring = cli.run("train", "--script", str(SCRIPTS / "strategy_as_tutorials.py"), timeout=240)
    assert ring.returncode == 0, ring.stdout[-3000:] + ring.stderr[-2000:]
    warnings = [line for line in ring.stdout.splitlines() if line.startswith("! ")]
    assert len(warnings) == 1, ring.stdout[-3000:]
    # TensorFlow sees no GPU here, so the fix names both steps: a GPU build, and NCCL.
    assert WARNING.match(warnings[0]) and "communication = AUTO" in warnings[0], warnings
    assert "CommunicationImplementation.NCCL" in warnings[0] and "tensorflow[and-cuda]" in warnings[0]
    # The wrapper turned NCCL's INIT and NET lines on for these GPU workers.
    assert ring.stdout.count("NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET") == 2, ring.stdout[-3000:]
    run_dir, run = cli.latest_run()
    assert run["summary"]["collective"] == "ring over gRPC (CPU)"
    assert re.search(r"│ collective +│ ring over gRPC \(CPU\) +│", ring.stdout), ring.stdout[-2000:]
    log = (run_dir / "worker-1.log").read_text()
    assert ", 2 GPUs (nvidia-smi) ===" in log and "communication = CommunicationImplementation.AUTO" in log

    nccl = cli.run("train", "--workers", "1", "--script", str(SCRIPTS / "strategy_as_tutorials.py"), "--", "--nccl",
                   timeout=240)
    assert nccl.returncode == 0, nccl.stdout[-3000:] + nccl.stderr[-2000:]
    assert not [line for line in nccl.stdout.splitlines() if line.startswith("! ")], nccl.stdout[-3000:]
    assert cli.latest_run()[1]["summary"]["collective"].startswith("NCCL (no NCCL line")
