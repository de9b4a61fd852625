"""Time to first step with `--image` against without, 3 local workers, side by side in one run.

    python bench/bench_image.py [--rounds 3] [--image TAG]

Each round runs `invoke train --workers 3` once on the host's Python and once with `--image`
(the test image of tests/imagelab.py unless --image is given), alternating which goes first, on
the same pre-generated data. "Time to first step" is from "go" (the `invoke train` start) to the
chief's first completed training step; it includes the image preflight (Docker, image present,
TensorFlow importable in it) and the container starts. Needs root and Docker (tests/imagelab.py
starts dockerd and builds the image when missing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests import imagelab  # noqa: E402
from trainer import events  # noqa: E402

TRAINER_ARGS = ["--epochs", "1", "--steps-per-epoch", "3"]


def first_step(log: str) -> float:
    for line in log.splitlines():
        event = events.parse(line)
        if event and event["event"] == "first_step":
            return event["time"]
    raise SystemExit("no first_step event in the chief's log")


def time_to_first_step(state: Path, data: Path, image: str | None) -> float:
    env = {**os.environ, "INVOKE_TFCLUSTER_STATE_DIR": str(state), "INVOKE_TFCLUSTER_DATA_DIR": str(data),
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    invoke = [sys.executable, "-m", "invoke"]
    subprocess.run(invoke + ["up", "--workers", "3"], cwd=REPO, env=env, check=True, capture_output=True)
    go = time.time()
    extra = ["--image", image] if image else []
    result = subprocess.run(invoke + ["train", "--workers", "3", *extra, "--", *TRAINER_ARGS], cwd=REPO,
                            env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"invoke train {' '.join(extra)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-2000:]}")
    run_dir = max((state / "runs" / "default").iterdir(), key=lambda p: p.stat().st_mtime)
    seconds = first_step((run_dir / "worker-0.log").read_text()) - go
    subprocess.run(invoke + ["down"], cwd=REPO, env=env, check=True, capture_output=True)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--image", default=None)
    args = parser.parse_args()
    reason = imagelab.ensure_dockerd()
    if reason:
        raise SystemExit(reason)
    image = args.image or imagelab.build()[0][0]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        data = tmp / "data"
        subprocess.run([sys.executable, "-m", "trainer.create_tfrecords", "--synthetic", "--out", str(data)],
                       cwd=REPO, check=True, capture_output=True)
        host, boxed = [], []
        for i in range(args.rounds):
            order = [(None, host), (image, boxed)] if i % 2 == 0 else [(image, boxed), (None, host)]
            for which, into in order:
                into.append(time_to_first_step(tmp / f"state-{i}-{'image' if which else 'host'}", data, which))
            print(f"  round {i + 1}: host python {host[-1]:.2f}s  --image {boxed[-1]:.2f}s", flush=True)
    result = {"rounds": args.rounds, "image": image, "host_median_s": round(statistics.median(host), 2),
              "image_median_s": round(statistics.median(boxed), 2),
              "ratio": round(statistics.median(boxed) / statistics.median(host), 3),
              "host_s": [round(x, 2) for x in host], "image_s": [round(x, 2) for x in boxed],
              "load_avg_1m_end": os.getloadavg()[0]}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
