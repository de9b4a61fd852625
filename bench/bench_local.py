"""Benchmarks for the embedded local cluster, each measured side by side in one run.

    python bench/bench_local.py [--rounds 3]

1. Orchestration overhead: seconds from "go" to the chief's first training step,
   `invoke train --workers 3` against 3 hand-started processes with hand-written
   TF_CONFIG running the same trainer. Rounds alternate the two to share machine noise.
2. Input pipeline: images/s of trainer/data.py's TFRecord pipeline against a naive
   one (per-file PNG decode, no parallel map, no prefetch) over the same images.
3. Peak RSS (VmHWM) of each worker during the invoke run.
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

from tfcluster.ports import free_ports  # noqa: E402
from trainer import events  # noqa: E402

TRAINER_ARGS = ["--epochs", "1", "--steps-per-epoch", "3"]
# The bundled pipeline over the converted shards against the naive per-file one (docs/benchmarks.md).
PIPELINE_TARGET = 1.5


def first_step_time(text: str) -> float | None:
    for line in text.splitlines():
        event = events.parse(line)
        if event and event["event"] == "first_step":
            return event["time"]
    return None


def peak_rss_sampler(pids_fn, stop: threading.Event, peaks: dict[int, int]) -> None:
    while not stop.is_set():
        for pid in pids_fn():
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        peaks[pid] = max(peaks.get(pid, 0), int(line.split()[1]) * 1024)
            except (FileNotFoundError, ProcessLookupError):
                pass
        stop.wait(0.2)


def run_invoke(state: Path, data: Path) -> tuple[float, dict[int, int]]:
    env = {**os.environ, "INVOKE_TFCLUSTER_STATE_DIR": str(state), "INVOKE_TFCLUSTER_DATA_DIR": str(data),
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    invoke = [sys.executable, "-m", "invoke"]
    subprocess.run(invoke + ["up", "--workers", "3"], cwd=REPO, env=env, check=True, capture_output=True)
    runs_before = set((state / "runs" / "default").glob("*")) if (state / "runs").exists() else set()
    peaks: dict[int, int] = {}
    stop = threading.Event()

    def worker_pids():
        new = [p for p in (state / "runs" / "default").glob("*") if p not in runs_before] \
            if (state / "runs" / "default").exists() else []
        pids = []
        for run_dir in new:
            for pid_file in run_dir.glob("worker-*.attempt1.pid"):
                try:
                    pids.append(int(pid_file.read_text()))
                except ValueError:
                    pass
        return pids

    sampler = threading.Thread(target=peak_rss_sampler, args=(worker_pids, stop, peaks), daemon=True)
    sampler.start()
    go = time.time()
    result = subprocess.run(invoke + ["train", "--workers", "3", "--", *TRAINER_ARGS], cwd=REPO, env=env,
                            capture_output=True, text=True)
    stop.set()
    sampler.join()
    if result.returncode != 0:
        raise SystemExit(f"invoke train failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    run_dir = max((state / "runs" / "default").glob("*"), key=lambda p: p.stat().st_mtime)
    first = first_step_time((run_dir / "worker-0.log").read_text())
    subprocess.run(invoke + ["down"], cwd=REPO, env=env, check=True, capture_output=True)
    return first - go, peaks


def run_bare(data: Path, out: Path) -> float:
    """The tutorial way: three processes, TF_CONFIG written by hand."""
    ports = free_ports(3)
    spec = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{p}" for p in ports[1:]]}
    tasks = [{"type": "chief", "index": 0}, {"type": "worker", "index": 0}, {"type": "worker", "index": 1}]
    go = time.time()
    procs = []
    for task in tasks:
        env = {**os.environ, "TF_CONFIG": json.dumps({"cluster": spec, "task": task}),
               "AIP_MODEL_DIR": str(out / "model"), "AIP_CHECKPOINT_DIR": str(out / "ckpt"),
               "AIP_TENSORBOARD_LOG_DIR": str(out / "tb"), "PYTHONPATH": str(REPO),
               "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
        procs.append(subprocess.Popen([sys.executable, "-u", "-m", "trainer.task", "--data-dir", str(data),
                                       *TRAINER_ARGS], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, cwd=out))
    outputs = [proc.communicate()[0] for proc in procs]
    if any(proc.returncode for proc in procs):
        raise SystemExit("bare run failed:\n" + outputs[0][-3000:])
    return first_step_time(outputs[0]) - go


def bench_overhead(rounds: int, data: Path, tmp: Path) -> dict:
    invoke_times, bare_times, peaks_all = [], [], []
    for i in range(rounds):
        bare_times.append(run_bare(data, Path(tempfile.mkdtemp(dir=tmp))))
        seconds, peaks = run_invoke(tmp / f"state{i}", data)
        invoke_times.append(seconds)
        peaks_all.append(peaks)
        print(f"  round {i + 1}: bare {bare_times[-1]:.2f}s  invoke {invoke_times[-1]:.2f}s", flush=True)
    return {"bare": statistics.median(bare_times), "invoke": statistics.median(invoke_times),
            "peaks": peaks_all}


def bench_pipeline(tmp: Path, images: int = 4000, source_size: int = 256, size: int = 128,
                   passes: int = 2) -> dict:
    """Photos larger than the training size, as in a real image folder: the naive pipeline
    decodes and resizes every JPEG on every epoch; ours reads the shards converted once."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from trainer import create_tfrecords, data
    from trainer.synthetic import CLASSES, write_image_folder

    folder = write_image_folder(tmp / "images", per_class=images // len(CLASSES), size=source_size,
                                suffix="jpg")
    records = tmp / "records"
    create_tfrecords.convert(folder, records, image_size=size, shards=8, val_fraction=0.0)
    batch = 64
    files = sorted(str(p) for p in folder.rglob("*.jpg"))
    labels = [CLASSES.index(Path(f).parent.name) for f in files]

    def naive():
        def load(path, label):
            image = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
            image = tf.image.resize(tf.cast(image, tf.float32) / 255.0, [size, size])
            return image, label
        return tf.data.Dataset.from_tensor_slices((files, labels)).map(load).batch(batch)

    def ours():
        return data.make_dataset(str(records), "train", batch, size).take(len(files) // batch)

    def rate(make) -> float:
        best = 0.0
        for _ in range(passes):
            count, start = 0, time.perf_counter()
            for images_batch, _ in make():
                count += int(images_batch.shape[0])
            best = max(best, count / (time.perf_counter() - start))
        return best

    return {"naive": rate(naive), "ours": rate(ours), "images": len(files), "size": size,
            "source_size": source_size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tfcluster-bench-") as tmp_name:
        tmp = Path(tmp_name)
        data = tmp / "shapes"
        subprocess.run([sys.executable, "-m", "trainer.create_tfrecords", "--synthetic", "--out", str(data)],
                       cwd=REPO, check=True, capture_output=True)
        print(f"Orchestration overhead, {args.rounds} alternating rounds (time to first training step):")
        overhead = bench_overhead(args.rounds, data, tmp)
        print("Input pipeline throughput:")
        pipeline = bench_pipeline(tmp)
    peaks = [v for round_peaks in overhead["peaks"] for v in round_peaks.values()]
    ratio = overhead["invoke"] / overhead["bare"]
    print()
    print("| benchmark | tfcluster | baseline | ratio | target |")
    print("|---|---|---|---|---|")
    print(f"| time to first step, 3 local workers (median of {args.rounds}) | {overhead['invoke']:.2f} s "
          f"(`invoke train`) | {overhead['bare']:.2f} s (hand-started) | {ratio:.3f} | <= 1.15 |")
    print(f"| input pipeline, {pipeline['images']} JPEGs {pipeline['source_size']}px -> {pipeline['size']}px "
          f"| {pipeline['ours']:.0f} img/s "
          f"(TFRecord, parallel map, prefetch) | {pipeline['naive']:.0f} img/s (per-file decode+resize, serial) "
          f"| {pipeline['ours'] / pipeline['naive']:.2f}x | >= {PIPELINE_TARGET}x |")
    if peaks:
        print(f"| peak RSS per worker (max of {len(peaks)}) | {max(peaks) / 2**30:.2f} GiB "
              f"(median {statistics.median(peaks) / 2**30:.2f}) | | | |")
    if pipeline["ours"] < pipeline["naive"]:
        print(f"WARNING: the input pipeline is slower than the naive one ({pipeline['ours']:.0f} vs "
              f"{pipeline['naive']:.0f} images/s): look at trainer/data.py's per-batch work")


if __name__ == "__main__":
    main()
