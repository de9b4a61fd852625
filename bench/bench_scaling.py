"""Scaling efficiency of 1 -> 3 local workers, against this machine's CPU floor, side by side in one run.

    python bench/bench_scaling.py [--rounds 2] [--steps 20]

Each round trains the bundled trainer with 1, 2 and 3 workers of one local cluster, through the CLI,
on the same data and per-replica batch (2 epochs of --steps steps). The figures are the run
summary's own: global images/s (the median step time of tfcluster/steptime.py over the chief's
step events) and the scaling efficiency against the 1-worker run of the same round (the product
finds it as "the last 1-worker run of the same configuration").

The CPU floor: every local worker shares this machine's cores, so N workers can only beat one
if one leaves cores idle. A sampler reads the workers' CPU time (/proc/<pid>/stat utime+stime)
between the chief's first and last step events; CPU seconds per image then give the images/s the
job would reach on all cores with no waiting: cores / (CPU s per image). "of floor" is the
measured rate over that; near 100 % means the cores were busy with this job's work all along.
"efficiency the CPU floor allows" is that floor over N x the 1-worker rate: the best scaling
efficiency any schedule could reach here, beside the measured one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from trainer import events  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
CORES = os.cpu_count() or 1


def cpu_seconds(pid: int) -> float | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw[raw.rfind(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime (proc(5)).


def sample_workers(run_dir_of, stop: threading.Event, samples: list[tuple[float, float]]) -> None:
    """(time, CPU seconds of every worker so far) every 0.1 s; a worker that exited keeps its last value."""
    last: dict[int, float] = {}
    while not stop.is_set():
        run_dir = run_dir_of()
        if run_dir is not None:
            for pid_file in run_dir.glob("worker-*.attempt1.pid"):
                try:
                    pid = int(pid_file.read_text())
                except ValueError:
                    continue
                value = cpu_seconds(pid)
                if value is not None:
                    last[pid] = value
            samples.append((time.time(), sum(last.values())))
        stop.wait(0.1)


def cpu_between(samples: list[tuple[float, float]], start: float, end: float) -> float:
    """Worker CPU seconds between two times, from the samples nearest them."""
    def at(moment: float) -> float:
        return min(samples, key=lambda sample: abs(sample[0] - moment))[1]
    return at(end) - at(start)


def one_run(env: dict, state: Path, workers: int, steps: int, extra: tuple[str, ...] = ()) -> dict:
    runs = state / "runs" / "default"
    before = set(runs.glob("*")) if runs.exists() else set()

    def run_dir_of():
        new = [path for path in runs.glob("*") if path not in before] if runs.exists() else []
        return new[0] if new else None

    samples: list[tuple[float, float]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample_workers, args=(run_dir_of, stop, samples), daemon=True)
    sampler.start()
    result = subprocess.run([sys.executable, "-m", "invoke", "train", "--workers", str(workers), "--",
                             "--epochs", "2", "--steps-per-epoch", str(steps), *extra],
                            cwd=REPO, env=env, capture_output=True, text=True)
    stop.set()
    sampler.join()
    if result.returncode != 0:
        raise SystemExit(f"bench: train --workers {workers} failed:\n{result.stdout[-3000:]}{result.stderr[-2000:]}")
    run_dir = run_dir_of()
    summary = json.loads((run_dir / "run.json").read_text())["summary"]
    chief = [e for e in map(events.parse, (run_dir / "worker-0.log").read_text().splitlines()) if e]
    timed = [e for e in chief if e["event"] in ("first_step", "step")]
    first, last = timed[0], timed[-1]
    steps_done = (last["epoch"] - first["epoch"]) * last["steps"] + last["step"] - first["step"]
    images = steps_done * last["batch"]
    cpu = cpu_between(samples, first["time"], last["time"])
    floor = CORES * images / cpu if cpu > 0 else None
    speed = summary["throughput"]
    return {"workers": workers, "images_per_second": speed["global_images_per_second"],
            "wall_images_per_second": speed.get("wall_images_per_second"),
            "per_worker": statistics.mean(speed["per_worker_images_per_second"].values()),
            "median_step_ms": speed["median_step_seconds"] * 1000,
            "efficiency": (summary.get("scaling") or {}).get("efficiency"),
            "reference": (summary.get("scaling") or {}).get("reference_run"),
            "cpu_seconds_per_image": cpu / images if images else None, "floor_images_per_second": floor,
            "run_id": json.loads((run_dir / "run.json").read_text())["run_id"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20, help="steps per epoch (2 epochs per run)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as tmp:
        state, data = Path(tmp) / "state", Path(tmp) / "data"
        subprocess.run([sys.executable, "-m", "trainer.create_tfrecords", "--synthetic", "--out", str(data)],
                       cwd=REPO, check=True, capture_output=True)
        env = {**os.environ, "INVOKE_TFCLUSTER_STATE_DIR": str(state), "INVOKE_TFCLUSTER_DATA_DIR": str(data),
               "TF_CPP_MIN_LOG_LEVEL": "2", "COLUMNS": "200"}
        subprocess.run([sys.executable, "-m", "invoke", "up", "--workers", "3"], cwd=REPO, env=env, check=True,
                       capture_output=True)
        results: dict[int, list[dict]] = {1: [], 2: [], 3: []}
        load = []
        try:
            for round_index in range(args.rounds):
                for workers in (1, 2, 3):  # The 1-worker run first: the round's scaling reference.
                    load.append(os.getloadavg()[0])
                    outcome = one_run(env, state, workers, args.steps)
                    if workers > 1:
                        assert outcome["reference"] == results[1][-1]["run_id"], outcome
                    results[workers].append(outcome)
                    print(f"round {round_index + 1}: {workers} worker(s) {outcome['images_per_second']:.0f} img/s, "
                          f"efficiency {outcome['efficiency']}, floor {outcome['floor_images_per_second']:.0f} img/s",
                          flush=True)
        finally:
            subprocess.run([sys.executable, "-m", "invoke", "down"], cwd=REPO, env=env, capture_output=True)
    print(f"\n{args.rounds} rounds, medians; {CORES} cores; load average at the starts "
          f"{min(load):.1f} to {max(load):.1f}\n")
    print("| workers | images/s (all) | images/s per worker | median step | scaling efficiency (summary) "
          "| worker CPU per image | images/s at the CPU floor | of floor | efficiency the CPU floor allows |")
    print("|---|---|---|---|---|---|---|---|---|")
    one_rate = statistics.median(o["images_per_second"] for o in results[1])
    for workers, outcomes in results.items():
        def med(key):
            values = [o[key] for o in outcomes if o[key] is not None]
            return statistics.median(values) if values else None
        efficiency = med("efficiency")
        rate, floor = med("images_per_second"), med("floor_images_per_second")
        print(f"| {workers} | {rate:.0f} | {med('per_worker'):.0f} | {med('median_step_ms'):.0f} ms | "
              f"{'1 (reference)' if workers == 1 else f'{efficiency:.2f}'} | {med('cpu_seconds_per_image') * 1000:.2f} ms | "
              f"{floor:.0f} | {100 * rate / floor:.0f} % | {'-' if workers == 1 else f'{floor / (workers * one_rate):.2f}'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
