"""A Spot preemption, end to end on the stand-ins: from Google's notice to training running again,
and the steps done again, with epoch-only backups and with step backups, side by side in one run.

    sudo python bench/bench_spot.py   # root, like the tests: namespace hosts, real sshd, real TF

The world is the tests' (tests/test_spot.py): 3 real TensorFlow workers on namespace hosts,
gs:// on the emulator, the Compute stand-in, whose start takes FakeCompute.start_seconds (2 s;
a real GPU VM takes about a minute) and then boots the host again on a new address. Each
round trains --epochs 3 --steps-per-epoch 20 and preempts worker-2 in epoch 2, right after the
chief reported step 14 or later. Times, all on this machine's clock:
- detection: notice (the stand-in marks the VM preempted and kills its processes) -> the
  launcher has recognised the preemption from the Compute API;
- stop + prepare: -> the start request (survivors' processes stopped, boot nonce and deadline set);
- VM start: the start operation, as long as the stand-in makes it (not ours);
- readiness: start DONE -> addresses re-read, host key pinned again, connections fresh;
- resume: -> the chief's first step of the next attempt (staging checked, TF started, backup read).
Steps redone: the chief's last reported step before the preemption (it reports every 2 steps,
and cannot pass a step without worker-2) minus the step it resumed after.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("TFCLUSTER_TESTLAB_NET", "22")

from tests.conftest import events_of, wait_for  # noqa: E402
from tests.hostlab import available  # noqa: E402
from tests.test_spot import _remote_log, spot_cli_in  # noqa: E402
from tests.world.names import GoogleWorld  # noqa: E402

STEPS = 20
EVERY = 5


def _stamp(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def one_preemption(cli, world, tmp: Path, extra: list[str]) -> dict:
    before = {run.name for run in cli.runs()}
    launcher = cli.popen("train", "--retries", "1", "--", "--epochs", "3", "--steps-per-epoch", str(STEPS), *extra)
    try:
        run_dir = wait_for(lambda: [r for r in cli.runs() if r.name not in before], 60, what="the run")[0]
        log = _remote_log(cli.lab, run_dir.name, 0)

        def deep_in_epoch_2():
            found = [e for e in events_of(log.read_text()) if e["event"] == "step"] if log.exists() else []
            return found and found[-1]["epoch"] == 2 and found[-1]["step"] >= 14

        wait_for(deep_in_epoch_2, 600, interval=0.05, what="epoch 2, step 14")
        notice = time.time()
        cli.spot.preempt(2)
        output, _ = launcher.communicate(timeout=900)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, output[-3000:]
    run = json.loads((run_dir / "run.json").read_text())
    [preemption] = run["summary"]["preemptions"]
    start = [op["json"] for op in world.compute.state.operations.values()
             if op["json"]["operationType"] == "start" and "error" not in op["json"]][-1]
    chief = (run_dir / "worker-0.log").read_text()
    first, second = chief.split("attempt 2 on", 1)
    last = [e for e in events_of(first) if e["event"] in ("step", "first_step")][-1]
    resumed = next(e for e in events_of(second) if e["event"] == "first_step")
    reached = (last["epoch"] - 1) * STEPS + last["step"]
    restored = (resumed["epoch"] - 1) * STEPS + resumed["step"] - 1
    return {
        "detection": preemption["noticed_at"] - notice,
        "stop + prepare": _stamp(start["insertTime"]) - preemption["noticed_at"],
        "VM start": _stamp(start["endTime"]) - _stamp(start["insertTime"]),
        "readiness": preemption["restarted_at"] - _stamp(start["endTime"]),
        "resume": resumed["time"] - preemption["restarted_at"],
        "total": resumed["time"] - notice,
        "steps redone": reached - restored,
        "reached": f"epoch {last['epoch']} step {last['step']}",
        "resumed after": f"epoch {resumed['epoch']} step {resumed['step'] - 1}",
    }


def main() -> int:
    reason = available()
    if reason:
        print(f"cannot run: {reason}")
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="bench-spot-"))
    data = tmp / "data" / "shapes"
    subprocess.run([sys.executable, "-m", "trainer.create_tfrecords", "--synthetic", "--out", str(data)],
                   cwd=REPO, check=True, capture_output=True)
    world = GoogleWorld(tmp / "world")
    os.environ.update(world.env())
    rows = []
    try:
        with world.resolving(), spot_cli_in(tmp, world, data) as cli:
            up = cli.run("up", timeout=300)
            assert up.returncode == 0, up.stdout + up.stderr
            for label, extra in (("epoch-only backups", []),
                                 (f"step backups every {EVERY} steps", ["--backup-every-steps", str(EVERY)])):
                rows.append((label, one_preemption(cli, world, tmp, extra)))
    finally:
        world.close()
    keys = ["detection", "stop + prepare", "VM start", "readiness", "resume", "total"]
    print("| backups | " + " | ".join(keys) + " | ours (all but VM start) | steps redone | reached -> resumed after |")
    print("|---" * (len(keys) + 4) + "|")
    for label, row in rows:
        ours = row["total"] - row["VM start"]
        print(f"| {label} | " + " | ".join(f"{row[k]:.1f} s" for k in keys)
              + f" | {ours:.1f} s | {row['steps redone']} | {row['reached']} -> {row['resumed after']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
