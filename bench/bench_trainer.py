"""The trainer's knobs on one machine, side by side in one run: workers at equal global work, and
steps per execution.

    python bench/bench_trainer.py [--rounds 2] [--steps 20]

1. **Equal global work**: the same global batch (96) and the same steps (2 epochs of --steps) with
   1, 2 and 3 local workers (per-replica batch 96, 48, 32), so every run trains the same images.
   Speed-up is N workers' images/s over 1 worker's; efficiency is speed-up / N (strong scaling).
   Both by wall clock (each attempt's first step to its last epoch's end, validation included) and
   at the median step, as the run summary computes them (tfcluster/throughput.py).
2. **Steps per execution**: 2 workers, per-replica batch 32, ``--steps-per-execution 1`` against
   ``10``: the same steps, fewer Python round trips between them.

Every run goes through the CLI (`invoke train`) on one local 3-worker cluster; the orders alternate
between rounds, and each figure is the median over the rounds. All workers share this machine's
cores (see bench_scaling.py's CPU floor): on separate machines each worker has its own.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_scaling import CORES, REPO, one_run

GLOBAL_BATCH = 96
SPE_WORKERS = 2


def median(outcomes: list[dict], key: str) -> float:
    values = [outcome[key] for outcome in outcomes if outcome.get(key) is not None]
    return statistics.median(values) if values else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20, help="steps per epoch (2 epochs per run)")
    args = parser.parse_args()
    equal: dict[int, list[dict]] = {1: [], 2: [], 3: []}
    spe: dict[int, list[dict]] = {1: [], 10: []}
    load = []
    with tempfile.TemporaryDirectory(prefix="bench-trainer-") as tmp:
        state, data = Path(tmp) / "state", Path(tmp) / "data"
        subprocess.run([sys.executable, "-m", "trainer.create_tfrecords", "--synthetic", "--out", str(data)],
                       cwd=REPO, check=True, capture_output=True)
        env = {**os.environ, "INVOKE_TFCLUSTER_STATE_DIR": str(state), "INVOKE_TFCLUSTER_DATA_DIR": str(data),
               "TF_CPP_MIN_LOG_LEVEL": "2", "COLUMNS": "200"}
        subprocess.run([sys.executable, "-m", "invoke", "up", "--workers", "3"], cwd=REPO, env=env, check=True,
                       capture_output=True)
        try:
            for round_index in range(args.rounds):
                order = (1, 2, 3) if round_index % 2 == 0 else (3, 2, 1)
                for workers in order:
                    load.append(os.getloadavg()[0])
                    outcome = one_run(env, state, workers, args.steps,
                                      ("--batch-size", str(GLOBAL_BATCH // workers)))
                    equal[workers].append(outcome)
                    print(f"round {round_index + 1}: {workers} worker(s) at global batch {GLOBAL_BATCH}: "
                          f"{outcome['wall_images_per_second']:.0f} img/s by wall clock, "
                          f"{outcome['images_per_second']:.0f} at the median step", flush=True)
                for per_call in ((1, 10) if round_index % 2 == 0 else (10, 1)):
                    load.append(os.getloadavg()[0])
                    outcome = one_run(env, state, SPE_WORKERS, args.steps, ("--steps-per-execution", str(per_call)))
                    spe[per_call].append(outcome)
                    print(f"round {round_index + 1}: --steps-per-execution {per_call}: "
                          f"{outcome['wall_images_per_second']:.0f} img/s by wall clock, "
                          f"{outcome['images_per_second']:.0f} at the median step", flush=True)
        finally:
            subprocess.run([sys.executable, "-m", "invoke", "down"], cwd=REPO, env=env, capture_output=True)
    print(f"\n{args.rounds} rounds, medians; {CORES} cores; load average at the runs' starts "
          f"{min(load):.1f} to {max(load):.1f}\n")
    print(f"Equal global work (global batch {GLOBAL_BATCH}, 2 x {args.steps} steps):\n")
    print("| workers | per-replica batch | images/s (wall clock) | speed-up | efficiency | images/s (median step) "
          "| speed-up | efficiency |")
    print("|---|---|---|---|---|---|---|---|")
    one_wall, one_step = median(equal[1], "wall_images_per_second"), median(equal[1], "images_per_second")
    for workers, outcomes in equal.items():
        wall, step = median(outcomes, "wall_images_per_second"), median(outcomes, "images_per_second")
        print(f"| {workers} | {GLOBAL_BATCH // workers} | {wall:.0f} | {wall / one_wall:.2f}x | "
              f"{wall / one_wall / workers:.2f} | {step:.0f} | {step / one_step:.2f}x | {step / one_step / workers:.2f} |")
    print(f"\nSteps per execution ({SPE_WORKERS} workers, per-replica batch 32, 2 x {args.steps} steps):\n")
    print("| --steps-per-execution | images/s (wall clock) | images/s (median step) | vs 1 (wall clock) |")
    print("|---|---|---|---|")
    base = median(spe[1], "wall_images_per_second")
    for per_call, outcomes in spe.items():
        wall = median(outcomes, "wall_images_per_second")
        print(f"| {per_call} | {wall:.0f} | {median(outcomes, 'images_per_second'):.0f} | {wall / base:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
