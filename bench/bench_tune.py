"""Trials per hour of `invoke tune`: 3 tuners against 1 on the same search, side by side.

    python bench/bench_tune.py [--rounds 2] [--trials 6]

One local cluster of 3 workers; each round runs `invoke tune --workers 1` and `invoke tune
--workers 3` (alternating which goes first) on the same bundled search (same seed, same
trials, 1 epoch of 10 steps each), through the CLI as a user would. Per search:
- wall time from go to the launcher's exit, and trials per hour from it;
- the machine's CPU time during it (every process, from /proc/stat, as bench_ssh.py), and
  that over the cores: the floor below which no schedule can go on this machine;
- the launcher's own CPU time (the `invoke` process and what it waits for: rusage of the child);
- the search span: the oracle's first trial start to its last trial end, so wall minus span
  is start-up (TensorFlow imports in every process) plus collecting.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.conftest import events_of  # noqa: E402

CORES = os.cpu_count() or 1


def machine_cpu_seconds() -> float:
    """CPU time used by the whole machine so far (every process)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, idle, iowait, irq, softirq = (int(x) for x in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def invoke(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=1800)


def one_search(env: dict, state: Path, tuners: int, trials: int) -> dict:
    before_children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_before = machine_cpu_seconds()
    started = time.perf_counter()
    result = invoke(env, "tune", "--workers", str(tuners), "--max-trials", str(trials),
                    "--", "--epochs", "1", "--steps-per-epoch", "10", "--seed", "3")
    wall = time.perf_counter() - started
    cpu = machine_cpu_seconds() - cpu_before
    after_children = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"bench_tune: tune failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    runs = sorted((state / "runs" / "default").iterdir(), key=lambda p: p.stat().st_mtime)
    run_dir = runs[-1]
    run = json.loads((run_dir / "run.json").read_text())
    done = sum(t["status"] == "COMPLETED" for t in run["summary"]["trials"])
    assert done == trials, (done, trials)
    events = events_of((run_dir / "oracle.log").read_text())
    first = min(e["time"] for e in events if e["event"] == "trial_start")
    last = max(e["time"] for e in events if e["event"] == "trial_end")
    launcher_cpu = (after_children.ru_utime - before_children.ru_utime
                    + after_children.ru_stime - before_children.ru_stime)
    return {"wall": wall, "cpu": cpu, "launcher_cpu": launcher_cpu, "span": last - first, "trials": done}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--trials", type=int, default=6)
    options = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tfcluster-bench-tune-"))
    state = tmp / "state"
    env = {**os.environ, "INVOKE_TFCLUSTER_STATE_DIR": str(state), "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-m", "trainer.create_tfrecords", "--synthetic", "--out", str(tmp / "data")],
                   cwd=REPO, check=True, capture_output=True)
    env["INVOKE_TFCLUSTER_DATA_DIR"] = str(tmp / "data")
    assert invoke(env, "up", "--workers", "3").returncode == 0
    results: dict[int, list[dict]] = {1: [], 3: []}
    try:
        for round_ in range(options.rounds):
            for tuners in ((1, 3) if round_ % 2 == 0 else (3, 1)):
                row = one_search(env, state, tuners, options.trials)
                results[tuners].append(row)
                print(f"  round {round_ + 1}, {tuners} tuner(s): wall {row['wall']:.1f}s, span {row['span']:.1f}s, "
                      f"machine CPU {row['cpu']:.1f}s, launcher CPU {row['launcher_cpu']:.2f}s", flush=True)
    finally:
        invoke(env, "down")
    print()
    print(f"| tuners | trials | wall (median of {options.rounds}) | trials/hour | vs 1 tuner | search span "
          f"(first trial start to last end) | machine CPU | CPU / {CORES} cores (floor) | launcher's own CPU |")
    print("|---|---|---|---|---|---|---|---|---|")
    base = None
    for tuners in (1, 3):
        rows = results[tuners]
        wall = statistics.median(r["wall"] for r in rows)
        cpu = statistics.median(r["cpu"] for r in rows)
        per_hour = options.trials / wall * 3600
        base = base or per_hour
        print(f"| {tuners} | {options.trials} | {wall:.1f} s | {per_hour:.0f} | {per_hour / base:.2f}x | "
              f"{statistics.median(r['span'] for r in rows):.1f} s | {cpu:.1f} s | {cpu / CORES:.1f} s | "
              f"{statistics.median(r['launcher_cpu'] for r in rows):.2f} s |")


if __name__ == "__main__":
    main()
