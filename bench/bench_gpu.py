"""The GPU paths of tfcluster, proved in one go on any machine with one NVIDIA GPU.

    python bench/bench_gpu.py [--smoke]

CI has no GPU, so this is where the product's GPU code meets a real one:
1. **The host check** (tfcluster/gpu_health.py) against the real ``nvidia-smi``: every GPU's ECC,
   retired-page and row-remapper fields, printed as ``nvidia-smi`` reports them.
2. **The bundled trainer on one worker**, where TensorFlow with GPU support is importable: float32
   against mixed precision (``--precision auto``: bfloat16 from compute capability 8.0, float16
   from 7.0), XLA off and on, with the strategy built for NCCL (``--collective nccl``). On one GPU
   this checks the strategy's construction and the ``communication`` TensorFlow logs for it, not
   NCCL's transport: one replica runs no all-reduce. Images/s at the median step, side by side.

It downloads nothing (the synthetic shapes set is generated here). ``--smoke`` (the small CNN,
a few dozen steps each) finishes in under 5 minutes on one GPU; the default trains ResNet-50 at
128 px. Exit codes: 0 every path passed; 1 a GPU path failed; 3 no NVIDIA GPU here (one line);
4 TensorFlow is not importable (the host check ran; one line says so).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tfcluster import gpu_health  # noqa: E402
from tfcluster.backends.base import CommandResult  # noqa: E402
from tfcluster.collective import STRATEGY_LINE  # noqa: E402
from tfcluster.state import HostRecord  # noqa: E402
from tfcluster.steptime import StepClock  # noqa: E402
from trainer import events  # noqa: E402

NO_GPU, NO_TENSORFLOW = 3, 4
# (label, --precision, --xla) in the order printed; the first is the reference for the ratio.
CONFIGS = (("float32", "float32", False), ("mixed", "auto", False),
           ("float32 + XLA", "float32", True), ("mixed + XLA", "auto", True))


@dataclass
class Report:
    """One trainer run, as its log tells it."""

    label: str
    ok: bool = False
    precision: str = ""
    collective: str = ""
    # TensorFlow's own "communication = CommunicationImplementation.X", and the strategy event's.
    communication_logged: str = ""
    communication: str = ""
    gpus: list[str] = field(default_factory=list)
    global_batch: int = 0
    median_step_seconds: float | None = None
    problem: str = ""

    @property
    def images_per_second(self) -> float | None:
        step = self.median_step_seconds
        return self.global_batch / step if step and self.global_batch else None


def parse_report(label: str, text: str, exit_code: int) -> Report:
    """The trainer's events and TensorFlow's strategy line from one run's output."""
    report, clock = Report(label), StepClock()
    for line in text.splitlines():
        event = events.parse(line)
        found = STRATEGY_LINE.search(line)
        if found:
            report.communication_logged = found["communication"]
        if event is None:
            continue
        clock.observe(event)
        if event["event"] == "strategy":
            report.precision = event.get("precision", "")
            report.collective = event.get("collective", "")
            report.communication = event.get("communication", "")
            report.gpus = list(event.get("gpus") or [])
            report.global_batch = int(event.get("global_batch") or 0)
    report.median_step_seconds = clock.median_step_seconds
    problems = [
        exit_code != 0 and f"the trainer exited with {exit_code}: {_last_line(text)}",
        not report.gpus and "TensorFlow placed the run on no GPU",
        report.communication != "NCCL" and f"the strategy holds {report.communication or 'nothing'}, not NCCL",
        report.communication_logged not in ("", "NCCL") and f"TensorFlow logged {report.communication_logged}",
        report.median_step_seconds is None and "no step time was reported",
    ]
    report.problem = "; ".join(problem for problem in problems if problem)
    report.ok = not report.problem
    return report


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip() and events.PREFIX not in line]
    return lines[-1].strip() if lines else "no output"


def table(reports: list[Report]) -> str:
    """Side by side: precision, XLA, collective, median step, images/s and the ratio to float32."""
    reference = reports[0].images_per_second if reports else None
    rows = [("run", "precision", "collective", "median step", "images/s", "vs float32", "result")]
    for report in reports:
        rate = report.images_per_second
        rows.append((report.label, report.precision or "n/a",
                     f"{report.collective or '?'} ({report.communication_logged or report.communication or '?'})",
                     f"{report.median_step_seconds * 1000:.1f} ms" if report.median_step_seconds else "n/a",
                     f"{rate:.0f}" if rate else "n/a",
                     f"{rate / reference:.2f}x" if rate and reference else "n/a",
                     "ok" if report.ok else f"FAILED: {report.problem}"))
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return "\n".join("| " + " | ".join(cell.ljust(width) for cell, width in zip(row, widths)) + " |"
                     for row in rows)


class ThisMachine:
    """This machine as a host of the check (tfcluster/gpu_health.py asks ``record`` and ``run_command``)."""

    record = HostRecord(name="this machine", address="localhost", tf_port=0)

    def run_command(self, argv: list[str], timeout: float = 60) -> CommandResult:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        except FileNotFoundError:
            return CommandResult(127, "", f"{argv[0]}: not found")
        except subprocess.TimeoutExpired:
            return CommandResult(124, "", f"{argv[0]} did not answer within {timeout:g} s")
        return CommandResult(done.returncode, done.stdout, done.stderr)


def gpus_here() -> list[str]:
    """`nvidia-smi -L`'s GPU lines ("GPU 0: NVIDIA L4 (UUID: ...)"); none without nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return []
    listed = ThisMachine().run_command(["nvidia-smi", "-L"], timeout=60)
    return [line for line in listed.stdout.splitlines() if re.match(r"GPU \d+:", line)] if listed.code == 0 else []


def tensorflow_gpus(python: str) -> int | None:
    """GPUs TensorFlow sees (None: TensorFlow is not importable)."""
    probe = "import tensorflow as tf; print(len(tf.config.list_physical_devices('GPU')))"
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    return int(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 and done.stdout.strip() else None


def run_trainer(python: str, data: Path, out: Path, label: str, precision: str, xla: bool, smoke: bool) -> Report:
    steps, model = (40, ["--model", "cnn"]) if smoke else (150, ["--model", "resnet50", "--image-size", "128"])
    argv = [python, "-u", "-m", "trainer.task", "--data-dir", str(data), "--epochs", "1", "--steps-per-epoch",
            str(steps), "--precision", precision, "--collective", "nccl", *model,
            "--model-dir", str(out / "model"), "--checkpoint-dir", str(out / "checkpoints"),
            "--tensorboard-dir", str(out / "tensorboard"), *(["--xla"] if xla else [])]
    # The workers' sitecustomize lets TensorFlow's strategy line through, as on a cluster.
    env = {key: value for key, value in os.environ.items() if key != "TF_CONFIG"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tfcluster" / "workerpath"), str(REPO)])
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env, timeout=1800)
    return parse_report(label, done.stdout + done.stderr, done.returncode)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="the small CNN for a few dozen steps (< 5 min)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter with TensorFlow")
    args = parser.parse_args(argv)

    listed = gpus_here()
    if not listed:
        print("bench_gpu: no NVIDIA GPU here (nvidia-smi is missing or lists none); run it on a machine with one")
        return NO_GPU
    print("nvidia-smi -L:\n  " + "\n  ".join(listed))
    failed = False
    host = ThisMachine()
    answer = gpu_health.probe(host)
    print("nvidia-smi " + " ".join(gpu_health.GPU_QUERY[1:]) + ":\n  " + "\n  ".join(
        ", ".join(row) for row in (answer.rows if answer else [])))
    faults = gpu_health.check_hosts([host])
    for fault in faults:
        print(f"host check FAILED: {fault.line()}")
    print("host check: " + ("FAILED" if faults else f"ok ({len(answer.rows) if answer else 0} GPU(s) fit to train)"))
    failed = failed or bool(faults)

    seen = tensorflow_gpus(args.python)
    if seen is None:
        print(f"bench_gpu: TensorFlow is not importable by {args.python}: ran the host check only")
        return 1 if failed else NO_TENSORFLOW
    if seen == 0:
        print(f"bench_gpu: FAILED: TensorFlow sees no GPU (a CPU-only build?) although nvidia-smi lists {len(listed)}")
        return 1
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        data = Path(tmp) / "data"
        subprocess.run([args.python, "-m", "trainer.create_tfrecords", "--synthetic", "--out", str(data),
                        "--image-size", "64" if args.smoke else "128"], cwd=REPO, check=True, capture_output=True)
        reports = []
        for label, precision, xla in CONFIGS:
            reports.append(run_trainer(args.python, data, Path(tmp) / label.replace(" ", ""), label, precision, xla,
                                       args.smoke))
            print(f"  {label}: {'ok' if reports[-1].ok else 'FAILED: ' + reports[-1].problem}", flush=True)
    print(table(reports))
    print(json.dumps({"gpus": listed, "host_check": [fault.line() for fault in faults],
                      "runs": [{"label": r.label, "ok": r.ok, "images_per_second": r.images_per_second,
                                "precision": r.precision, "communication": r.communication_logged} for r in reports]}))
    return 1 if failed or not all(report.ok for report in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
