"""Turn an image folder (one sub-folder per class) into TFRecord shards.

    python -m trainer.create_tfrecords --src IMAGES --out DATA [--shards 16] [--processes N]
    python -m trainer.create_tfrecords --synthetic --out DATA

Each record holds the image resized to ``--image-size`` plus its label: raw RGB bytes (the
default: the training pipeline only parses and normalises) or, with ``--encoding jpeg``, the
resized image re-encoded as JPEG (about 9x fewer bytes at 224 px to upload and read, decoded in the
pipeline). Corrupt or unreadable images are skipped and counted. ``DATA/manifest.json``
describes the result and is written last.

It streams: ``--processes`` processes each own some of the shards, and decode and write their
images one at a time, so memory stays flat whatever the folder's size. No TensorFlow is needed:
trainer/records.py writes the TFRecord format.
"""

import argparse
import io
import json
import multiprocessing
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from trainer import records

MANIFEST = "manifest.json"
SPLITS = ("train", "val")
ENCODINGS = ("raw", "jpeg")
DEFAULT_SHARDS = 16
JPEG_QUALITY = 95
# Below this many images a pool's start-up (about 1.5 s here) costs more than it saves.
POOL_FROM = 1000


def list_images(src: Path) -> tuple[list[str], list[tuple[str, int]]]:
    """Classes (sorted sub-folder names) and (path, label) for every file below them (paths as
    text: a Path object per file would cost memory in proportion to the folder)."""
    classes = sorted(p.name for p in src.iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(classes) < 2:
        raise ValueError(f"{src} needs at least 2 class sub-folders (found {len(classes)})")
    items = []
    for label, name in enumerate(classes):
        for path in sorted((src / name).rglob("*")):
            if path.is_file() and not path.name.startswith("."):
                items.append((str(path), label))
    return classes, items


def load_image(path: Path, size: int) -> np.ndarray:
    """The image as size x size x 3 uint8; raises ValueError if it is unreadable."""
    try:
        with Image.open(path) as image:
            if image.format == "JPEG" and min(image.size) >= 2 * size:
                # Let libjpeg decode at 1/2, 1/4 or 1/8 scale when that is still larger than
                # the target: nearly the same pixels after the resize below, several times faster.
                image.draft("RGB", (size, size))
            image.load()
            rgb = image.convert("RGB")
            if rgb.size != (size, size):
                rgb = rgb.resize((size, size), Image.BILINEAR)
            return np.asarray(rgb, dtype=np.uint8)
    except (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError) as err:
        raise ValueError(f"{type(err).__name__}: {err}") from err


def stored_image(path: Path, size: int, encoding: str) -> bytes:
    """What a record holds for one image: raw RGB bytes or a JPEG; raises ValueError if unreadable."""
    pixels = load_image(path, size)
    if encoding == "raw":
        return pixels.tobytes()
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=JPEG_QUALITY)
    return buffer.getvalue()


@dataclass
class ShardJob:
    """One process's share: whole shards, so it writes them itself (no pixels travel). Each process
    lists the folder and shuffles it again (the same way): no list of files is handed over."""

    src: str
    out: str
    size: int
    encoding: str
    seed: int
    shards: int
    val_fraction: float
    # This process writes the shards whose index (train first, then val) is worker mod processes.
    worker: int
    processes: int


def shuffled_files(src: Path, seed: int) -> tuple[list[str], list[tuple[str, int]]]:
    """Classes and (path, label) of every file, in the seeded order that decides splits and shards."""
    classes, items = list_images(src)
    return classes, [items[i] for i in np.random.default_rng(seed).permutation(len(items))]


def write_shards(job: ShardJob) -> tuple[dict[str, list[int]], list[tuple[int, str, str]]]:
    """Decode and write ``job``'s images one at a time. Returns the labels written to each shard
    and the (index, path, error) of each unreadable file."""
    _, files = shuffled_files(Path(job.src), job.seed)
    names = shard_names(len(files), job.shards, job.val_fraction)
    owner = {name: i % job.processes for i, name in enumerate(names["train"] + names["val"])}
    labels: dict[str, list[int]] = {}
    writers: dict[str, records.RecordWriter] = {}
    skipped = []
    try:
        for index, ((path, label), name) in enumerate(zip(files, placements(len(files), names, job.val_fraction))):
            if owner[name] != job.worker:
                continue
            try:
                stored = stored_image(Path(path), job.size, job.encoding)
            except ValueError as err:
                skipped.append((index, path, str(err)))
                continue
            if name not in writers:
                writers[name] = records.RecordWriter(os.path.join(job.out, name))
            writers[name].write(records.example({"image": stored, "label": [label], "height": [job.size],
                                                 "width": [job.size]}))
            labels.setdefault(name, []).append(label)
    finally:
        for writer in writers.values():
            writer.close()
    return labels, skipped


def goes_to_val(index: int, val_fraction: float) -> bool:
    """Whether the index-th file of the shuffled list is a validation one: spread evenly, so
    that of any first N files round(N x fraction) are validation ones."""
    return round((index + 1) * val_fraction) > round(index * val_fraction)


def shard_names(count: int, shards: int, val_fraction: float) -> dict[str, list[str]]:
    """The shard files of each split for ``count`` files: ``shards`` each (fewer if there are
    fewer files), so that with as many shards as workers both splits shard by FILE."""
    n_val = round(count * val_fraction) if count > 1 else 0  # What goes_to_val adds up to.
    n_shards = {"train": min(shards, count - n_val), "val": min(shards, n_val)}
    return {split: [f"{split}-{i:05d}-of-{n:05d}.tfrecord" for i in range(n)] for split, n in n_shards.items()}


def placements(count: int, names: dict[str, list[str]], val_fraction: float):
    """The shard name of each of ``count`` shuffled files: round-robin within each split, by
    position in the list (an unreadable file leaves a gap rather than moving the others, so
    each shard can be written on its own)."""
    seen = {split: 0 for split in SPLITS}
    for index in range(count):
        split = "val" if count > 1 and goes_to_val(index, val_fraction) else "train"
        yield names[split][seen[split] % len(names[split])]
        seen[split] += 1


def convert(src: Path, out: Path, image_size: int = 32, shards: int = DEFAULT_SHARDS,
            val_fraction: float = 0.2, seed: int = 0, processes: int | None = None,
            encoding: str = "raw") -> dict:
    """Write train/val shards and the manifest into ``out``; returns the manifest.

    ``processes`` decode and write in parallel, each its own shards (spawned: a script that
    calls this needs the usual ``if __name__ == "__main__":`` guard); None picks one per core
    for large folders. The validation share is a fraction of the files listed."""
    if encoding not in ENCODINGS:
        raise ValueError(f"unknown encoding {encoding!r}; valid: {', '.join(ENCODINGS)}")
    classes, items = list_images(src)
    count = len(items)
    del items  # Each process lists the folder itself.
    names = shard_names(count, shards, val_fraction)
    if processes is None:
        processes = (os.cpu_count() or 1) if count >= POOL_FROM else 1
    processes = max(1, min(processes, len(names["train"]) + len(names["val"])))
    jobs = [ShardJob(str(src), str(out), image_size, encoding, seed, shards, val_fraction, worker, processes)
            for worker in range(processes)]
    out.mkdir(parents=True, exist_ok=True)
    if processes == 1:
        results = [write_shards(jobs[0])]
    else:
        # spawn, not fork: the caller may have TensorFlow's threads running.
        with multiprocessing.get_context("spawn").Pool(processes) as pool:
            results = pool.map(write_shards, jobs, chunksize=1)
    labels = {name: found for result, _ in results for name, found in result.items()}
    skipped = sorted(item for _, failed in results for item in failed)
    if not labels:
        raise ValueError(f"no readable images under {src} ({len(skipped)} skipped)")
    manifest = {"image_size": image_size, "encoding": encoding, "classes": classes, "shards": {},
                "counts": {}, "skipped": [{"path": path, "error": error} for _, path, error in skipped],
                "source": str(src)}
    for split in SPLITS:
        # A shard whose files were all unreadable was never created, and is not listed.
        manifest["shards"][split] = [name for name in names[split] if name in labels]
        counts = np.bincount([label for name in names[split] for label in labels.get(name, [])],
                             minlength=len(classes))
        manifest["counts"][split] = dict(zip(classes, (int(c) for c in counts)))
    # The manifest is written last and atomically: its presence means the set is complete.
    with tempfile.NamedTemporaryFile("w", dir=out, delete=False, suffix=".tmp") as tmp:
        json.dump(manifest, tmp, indent=2)
    os.replace(tmp.name, out / MANIFEST)
    return manifest


def read_manifest(data_dir) -> dict:
    path = os.path.join(str(data_dir), MANIFEST)
    if path.startswith("gs://"):
        import tensorflow as tf  # tf.io.gfile reads gs:// on the VMs.

        with tf.io.gfile.GFile(path) as handle:
            return json.load(handle)
    with open(path) as handle:
        return json.load(handle)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (got {value})")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1) (got {value})")
    return value


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="create_tfrecords", description=__doc__.split("\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--src", type=Path, help="image folder with one sub-folder per class")
    source.add_argument("--synthetic", action="store_true", help="generate the built-in shapes set")
    parser.add_argument("--out", type=Path, required=True, help="output folder for shards + manifest")
    parser.add_argument("--image-size", type=_positive_int, default=32, help="square side in pixels")
    parser.add_argument("--shards", type=_positive_int, default=DEFAULT_SHARDS,
                        help=f"shards per split (default {DEFAULT_SHARDS})")
    parser.add_argument("--processes", type=_positive_int, default=None,
                        help=f"decoding processes (default: one per core from {POOL_FROM} images)")
    parser.add_argument("--encoding", choices=ENCODINGS, default="raw",
                        help="raw pixels (default, fastest to train on) or jpeg (about 10x smaller)")
    parser.add_argument("--val-fraction", type=_fraction, default=0.2)
    parser.add_argument("--per-class", type=_positive_int, default=400,
                        help="images per class for --synthetic")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.src is not None and not args.src.is_dir():
        parser.error(f"--src {args.src} is not a folder")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    options = dict(image_size=args.image_size, shards=args.shards, val_fraction=args.val_fraction,
                   seed=args.seed, processes=args.processes, encoding=args.encoding)
    if args.synthetic:
        from trainer.synthetic import write_image_folder

        with tempfile.TemporaryDirectory(prefix="tfcluster-shapes-") as folder:
            write_image_folder(Path(folder), args.per_class, args.image_size, args.seed)
            manifest = convert(Path(folder), args.out, **options)
        manifest["source"] = "synthetic shapes"
    else:
        try:
            manifest = convert(args.src, args.out, **options)
        except ValueError as err:
            print(f"create_tfrecords: error: {err}", file=sys.stderr)
            return 2
    counts = manifest["counts"]
    print(f"wrote {sum(counts['train'].values())} train / {sum(counts['val'].values())} val "
          f"images in {len(manifest['classes'])} classes to {args.out} "
          f"({len(manifest['shards']['train'])} train shards, {manifest['encoding']}); "
          f"skipped {len(manifest['skipped'])} unreadable")
    for item in manifest["skipped"]:
        print(f"  skipped {item['path']}: {item['error']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
