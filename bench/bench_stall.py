"""A hung worker, end to end on a 2-worker local cluster: how long after the run's last progress the
launcher calls the stall, against the limit, and what the stall costs besides.

    python bench/bench_stall.py [ROUNDS]   # default 2

Each round runs tests/scripts/hung_at_step.py with `--stall-minutes 1 --retries 1`: worker-1 blocks in
Python at step 13 (backups every 5 steps) while its process and heartbeats live on, so the chief waits
in the all-reduce with no error. Times, all on this machine's clock:
- detection: the chief's last progress event before the hang (its own time stamp) -> the launcher
  prints "Stalled" (read as it comes, from the launcher's output); the limit is 60 s;
- dump: "Stalled" -> "Stopping every worker" (SIGUSR1 to each worker, every stack read back from
  the logs);
- resume: "Stopping" -> the chief's first progress event of attempt 2 (processes stopped, TF started
  again, backup read).
Steps redone: the chief's last step of attempt 1 minus the step its backup left it at.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.conftest import Cli, events_of  # noqa: E402
from tests.test_stall import _progress_steps  # noqa: E402

SCRIPT = REPO / "tests" / "scripts" / "hung_at_step.py"
LIMIT = 60.0


def one_round(cli: Cli) -> dict:
    launcher = cli.popen("train", "--script", str(SCRIPT), "--stall-minutes", "1", "--retries", "1", "--",
                         "--hang-step", "13", "--backup-every", "5")
    seen: dict[str, float] = {}
    for line in launcher.stdout:  # Stamped as the launcher prints them.
        for key, pattern in (("stalled", "⏸ Stalled"), ("stopping", "Stopping every worker (stalled)")):
            if pattern in line and key not in seen:
                seen[key] = time.time()
    launcher.wait(timeout=60)
    run_dir, run = cli.latest_run()
    log = (run_dir / "worker-0.log").read_text()
    attempt, times = 0, {1: [], 2: []}
    for line in log.splitlines():
        header = re.search(r"=== tfcluster: .* attempt (\d+) on ", line)
        attempt = int(header.group(1)) if header else attempt
        times.setdefault(attempt, []).extend(e["time"] for e in events_of(line) if e["event"] == "progress")
    steps = _progress_steps(log)
    reached = max(step for a, step in steps if a == 1)
    resumed = min(step for a, step in steps if a == 2)
    return {"outcome": run["outcome"], "detection": seen["stalled"] - max(times[1]),
            "launcher_quiet": run["summary"]["stalls"][0]["quiet_seconds"],
            "dump": seen["stopping"] - seen["stalled"], "resume": min(times[2]) - seen["stopping"],
            "redone": reached - (resumed - 1)}


def main(rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cli = Cli(Path(tmp) / "state", None)
        cli.env["TF_CPP_MIN_LOG_LEVEL"] = "2"
        assert cli.run("up", "--workers", "2").returncode == 0
        try:
            results = [one_round(cli) for _ in range(rounds)]
        finally:
            cli.run("down", timeout=120)
    print(json.dumps(results, indent=1))
    print(f"| round | limit | detection (ratio) | dump | resume | steps redone (backup every 5) |")
    print("|---|---|---|---|---|---|")
    for index, r in enumerate(results, 1):
        print(f"| {index} | {LIMIT:.0f} s | {r['detection']:.1f} s ({r['detection'] / LIMIT:.3f}) | {r['dump']:.1f} s "
              f"| {r['resume']:.1f} s | {r['redone']} |")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
