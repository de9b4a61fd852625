"""Data preparation: flat memory, the parallel speed-up, and raw against JPEG shards, in one run.

    python bench/bench_data.py [--size 224] [--small 2000] [--large 20000] [--stored 224]

1. Memory: peak RSS of create_tfrecords (the process that writes) at --small and --large
   images; streaming keeps the ratio near 1.
2. Speed: images per second with --processes 1 and 2 on the --small folder, in alternating
   rounds of one run (medians), written to memory so that the disk is not what is timed.
3. Encoding: the training input pipeline (trainer/data.py, batches of 32) over raw-pixel shards
   and over JPEG shards of the same images, at 32 px (the default) and at --stored px: images per
   second, and the bytes to upload and read.
4. One huge image (``--huge`` runs only this): the peak RSS of a process that decodes a
   90-megapixel PNG to --stored px, with the converter's decoder (trainer/images.py) and with the
   plain PIL path it replaced (load, convert("RGB"), resize), side by side.

The --large folder repeats the --small one's files (hard links under new names): decoding costs the
same and only the count grows. Each conversion runs in a fresh process; the numbers are printed as
the README's table rows.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# Runs one conversion and reports its time and the peak RSS of the writing process. (Not the
# decoders': getrusage counts a spawned child's pages from before its exec, i.e. the parent's.)
CONVERT = """
import json, resource, sys, time
from pathlib import Path
from trainer import create_tfrecords
if __name__ == "__main__":
    src, out, size, processes, encoding = sys.argv[1:6]
    started = time.perf_counter()
    manifest = create_tfrecords.convert(Path(src), Path(out), image_size=int(size), processes=int(processes),
                                        encoding=encoding)
    seconds = time.perf_counter() - started
    images = sum(manifest["counts"]["train"].values()) + sum(manifest["counts"]["val"].values())
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime  # Includes the listing.
    print(json.dumps({"seconds": seconds, "images": images, "cpu_seconds": cpu,
                      "self_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

PIPELINE = """
import json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
from trainer import data
data_dir, batches = sys.argv[1], int(sys.argv[2])
dataset = data.make_dataset(data_dir, "train", global_batch=32, image_size=data.read_manifest(data_dir)["image_size"])
iterator = iter(dataset)
for _ in range(5):
    next(iterator)  # Warm up: the first batches pay for graph building and file opening.
started = time.perf_counter()
for _ in range(batches):
    next(iterator)
print(json.dumps({"images_per_second": batches * 32 / (time.perf_counter() - started)}))
"""


# Decodes one file to SIZE px in a fresh process and reports its peak RSS: "images" is the converter's
# decoder, "plain" the PIL path it replaced (open, load, convert("RGB"), resize).
DECODE = """
import json, resource, sys
from PIL import Image
path, size, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
Image.MAX_IMAGE_PIXELS = None  # Past PIL's bomb check: the decoding's own cost is measured.
if how == "images":
    from trainer.images import load_image
    pixels = load_image(path, size)
else:
    with Image.open(path) as image:
        image.load()
        pixels = image.convert("RGB").resize((size, size), Image.BILINEAR)
print(json.dumps({"peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""
HUGE_SIDE = 9500  # 90.25 megapixels, just above PIL's 89.5-megapixel warning.
# A smooth RGB picture of that size (it compresses: a 7 MB file).
MAKE_HUGE = """
import sys
import numpy as np
from PIL import Image
path, side = sys.argv[1], int(sys.argv[2])
ramp = np.linspace(0, 255, side, dtype=np.float32)
pixels = np.stack([np.add.outer(ramp, ramp) / 2, np.add.outer(ramp, 255 - ramp) / 2,
                   np.broadcast_to(ramp, (side, side))], axis=-1).astype(np.uint8)
Image.fromarray(pixels).save(path, compress_level=1)
"""


def huge_image(root: Path, stored: int) -> None:
    """Peak RSS decoding one 90-megapixel PNG, the converter's decoder against the plain PIL path.
    The PNG is made in a process of its own: a child's peak RSS counts its parent's pages from
    before its exec, and this one's must stay small."""
    path = root / "huge.png"
    subprocess.run([sys.executable, "-c", MAKE_HUGE, str(path), str(HUGE_SIDE)], check=True)
    print(f"\none {HUGE_SIDE} x {HUGE_SIDE} PNG ({HUGE_SIDE ** 2 / 1e6:.1f} megapixels, "
          f"{path.stat().st_size / 2 ** 20:.0f} MB file) to {stored} px, each in a fresh process:\n")
    print("| decoder | peak RSS |")
    print("|---|---:|")
    for how, label in (("plain", "plain PIL: load, convert(\"RGB\"), resize"), ("images", "trainer/images.py")):
        result = subprocess.run([sys.executable, "-c", DECODE, str(path), str(stored), how], cwd=REPO,
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(result.stderr[-3000:])
        print(f"| {label} | {json.loads(result.stdout.strip().splitlines()[-1])['peak_mb']:.0f} MB |", flush=True)


def make_folder(root: Path, count: int, size: int) -> Path:
    """``count`` JPEG files of the shapes set, ``size`` px, 4 classes."""
    from trainer.synthetic import write_image_folder

    return write_image_folder(root, per_class=count // 4, size=size, seed=0, suffix="jpg")


def repeat_folder(small: Path, root: Path, factor: int) -> Path:
    for folder in small.iterdir():
        (root / folder.name).mkdir(parents=True)
        for path in folder.iterdir():
            for copy in range(factor):
                os.link(path, root / folder.name / f"{copy:02d}-{path.name}")
    return root


def convert(src: Path, out: Path, size: int, processes: int, encoding: str = "raw") -> dict:
    shutil.rmtree(out, ignore_errors=True)
    result = subprocess.run([sys.executable, "-c", CONVERT, str(src), str(out), str(size), str(processes),
                             encoding], cwd=REPO, capture_output=True, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    if result.returncode != 0:
        raise SystemExit(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def pipeline(data_dir: Path, batches: int) -> float:
    result = subprocess.run([sys.executable, "-c", PIPELINE, str(data_dir), str(batches)], cwd=REPO,
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])["images_per_second"]


def shard_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.tfrecord"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=400, help="side of the source JPEGs (photo-like)")
    parser.add_argument("--stored", type=int, default=224, help="side stored in the shards")
    parser.add_argument("--small", type=int, default=2000)
    parser.add_argument("--large", type=int, default=20000)
    parser.add_argument("--batches", type=int, default=60, help="pipeline batches timed per row")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds of the speed comparison")
    parser.add_argument("--huge", action="store_true", help="only the 90-megapixel image")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        root = Path(tmp)
        if args.huge:
            huge_image(root, args.stored)
            return
        started = time.time()
        small = make_folder(root / "small", args.small, args.size)
        large = repeat_folder(small, root / "large", args.large // args.small)
        print(f"made {args.small} JPEGs of {args.size} px in {time.time() - started:.0f} s", flush=True)

        print("\n| images | stored px | peak RSS | seconds |")
        print("|---:|---:|---:|---:|")
        memory = {}
        for name, folder, count in (("small", small, args.small), ("large", large, args.large)):
            run = convert(folder, root / f"out-{name}", args.stored, processes=2)
            memory[name] = run
            print(f"| {count:,} | {args.stored} | {run['self_mb']:.0f} MB | {run['seconds']:.1f} |", flush=True)
        ratio = memory["large"]["self_mb"] / memory["small"]["self_mb"]
        print(f"\nwriter peak RSS, {args.large:,} / {args.small:,} images: {ratio:.2f}x "
              f"(raw pixels alone would be {args.large * args.stored ** 2 * 3 / 2 ** 20:,.0f} MB)")

        # Other jobs share the machine and its load swings within seconds: alternate the two,
        # each round in the other order, and compare medians.
        # Written to memory (/dev/shm): this machine's shared disk takes about 30 MB/s of raw
        # 224 px shards, which would time the disk, not the decoding.
        rates, cores = {1: [], 2: []}, {1: [], 2: []}
        speed_out = Path(tempfile.mkdtemp(prefix="bench-data-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
        for round_ in range(args.rounds):
            for processes in ((1, 2) if round_ % 2 == 0 else (2, 1)):
                run = convert(small, speed_out / "out", args.stored, processes)
                rates[processes].append(run["images"] / run["seconds"])
                cores[processes].append(run["cpu_seconds"] / run["seconds"])
            print(f"round {round_ + 1}: 1 process {rates[1][-1]:.0f}, 2 processes {rates[2][-1]:.0f} images/s; "
                  f"cores busy {cores[1][-1]:.2f}, {cores[2][-1]:.2f}", flush=True)
        shutil.rmtree(speed_out)
        print(f"\n| processes | images/s (median of {args.rounds}) | speed-up | cores busy (CPU s / wall s) |")
        print("|---:|---:|---:|---:|")
        for processes in (1, 2):
            median = statistics.median(rates[processes])
            print(f"| {processes} | {median:.0f} | {median / statistics.median(rates[1]):.2f}x | "
                  f"{statistics.median(cores[processes]):.2f} |")

        print("\n| stored px | shards | bytes | pipeline images/s |")
        print("|---:|---|---:|---:|")
        for stored in (32, args.stored):
            for encoding in ("raw", "jpeg"):
                out = root / f"out-{encoding}-{stored}"
                convert(small, out, stored, processes=2, encoding=encoding)
                rate = pipeline(out, args.batches)
                print(f"| {stored} | {encoding} | {shard_bytes(out) / 2 ** 20:.1f} MB | {rate:,.0f} |", flush=True)
        huge_image(root, args.stored)


if __name__ == "__main__":
    main()
