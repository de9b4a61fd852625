"""bench/bench_gpu.py, the one command that proves the GPU paths on a machine with a GPU: here (no
GPU) its --smoke exits 3 with one line, and its report parser and table are checked on the trainer's
own event lines and TensorFlow's strategy line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import bench_gpu  # noqa: E402

STRATEGY_NCCL = ("INFO:tensorflow:Single-worker MultiWorkerMirroredStrategy with local_devices = "
                 "('/job:localhost/replica:0/task:0/device:GPU:0',), communication = "
                 "CommunicationImplementation.NCCL")


def _event(event: str, **fields) -> str:
    return "TFCLUSTER_EVENT " + json.dumps({"event": event, **fields})


def _log(communication: str = "NCCL", precision: str = "mixed_bfloat16", step_seconds: float = 0.02) -> str:
    lines = [STRATEGY_NCCL.replace("NCCL", communication),
             _event("strategy", precision=precision, collective="nccl", communication=communication,
                    gpus=["NVIDIA L4"], global_batch=32, time=100.0),
             _event("first_step", epoch=1, step=1, steps=40, batch=32, time=101.0)]
    lines += [_event("step", epoch=1, step=1 + 10 * k, steps=40, batch=32, time=101.0 + 10 * k * step_seconds)
              for k in range(1, 4)]
    return "\n".join(lines) + "\n"


def test_smoke_without_a_gpu_exits_3_with_one_line(tmp_path):
    env = {**os.environ, "PATH": "/usr/bin:/bin"}  # No nvidia-smi, as on this machine.
    done = subprocess.run([sys.executable, str(REPO / "bench" / "bench_gpu.py"), "--smoke"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 3, done.stdout + done.stderr
    assert done.stdout.splitlines() == ["bench_gpu: no NVIDIA GPU here (nvidia-smi is missing or lists none); "
                                        "run it on a machine with one"] and done.stderr == ""


def test_the_report_parser_reads_precision_collective_and_speed_and_names_what_failed():
    report = bench_gpu.parse_report("mixed", _log(), 0)
    assert report.ok and report.problem == ""
    assert (report.precision, report.collective, report.communication, report.communication_logged) == \
        ("mixed_bfloat16", "nccl", "NCCL", "NCCL")
    assert abs(report.median_step_seconds - 0.02) < 1e-9 and round(report.images_per_second) == 1600

    ring = bench_gpu.parse_report("float32", _log(communication="AUTO", precision="float32"), 0)
    assert not ring.ok and ring.problem == "the strategy holds AUTO, not NCCL; TensorFlow logged AUTO"
    crashed = bench_gpu.parse_report("mixed + XLA", "Traceback (most recent call last):\nValueError: no\n", 1)
    assert not crashed.ok and crashed.problem.startswith("the trainer exited with 1: ValueError: no; "
                                                         "TensorFlow placed the run on no GPU")


def test_the_table_puts_the_runs_side_by_side_with_the_ratio_to_float32():
    reports = [bench_gpu.parse_report("float32", _log(precision="float32", step_seconds=0.04), 0),
               bench_gpu.parse_report("mixed", _log(step_seconds=0.02), 0),
               bench_gpu.parse_report("mixed + XLA", "", 1)]
    lines = bench_gpu.table(reports).splitlines()
    assert [cell.strip() for cell in lines[0].strip("|").split("|")] == \
        ["run", "precision", "collective", "median step", "images/s", "vs float32", "result"]
    assert [cell.strip() for cell in lines[1].strip("|").split("|")] == \
        ["float32", "float32", "nccl (NCCL)", "40.0 ms", "800", "1.00x", "ok"]
    assert [cell.strip() for cell in lines[2].strip("|").split("|")] == \
        ["mixed", "mixed_bfloat16", "nccl (NCCL)", "20.0 ms", "1600", "2.00x", "ok"]
    assert lines[3].split("|")[1].strip() == "mixed + XLA" and "FAILED: the trainer exited with 1" in lines[3]
    assert len({len(line) for line in lines}) == 1  # Aligned columns.
