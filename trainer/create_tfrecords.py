"""Turn an image folder (one sub-folder per class) into TFRecord shards.

    python -m trainer.create_tfrecords --src IMAGES --out DATA [--shards 16] [--processes N]
    python -m trainer.create_tfrecords --synthetic --out DATA

Each record holds the image resized to ``--image-size`` plus its label: raw RGB bytes (the
default: the training pipeline only parses and normalises) or, with ``--encoding jpeg``, the
resized image re-encoded as JPEG (about 10x fewer bytes to upload and read, decoded in the
pipeline). Corrupt or unreadable images are skipped and counted. ``DATA/manifest.json``
describes the result and is written last.

It streams: images are decoded by ``--processes`` worker processes, in order, and each is
written to its shard as soon as it comes back, so memory stays flat whatever the folder's size.
"""

import argparse
import io
import json
import multiprocessing
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

MANIFEST = "manifest.json"
SPLITS = ("train", "val")
ENCODINGS = ("raw", "jpeg")
DEFAULT_SHARDS = 16
JPEG_QUALITY = 95
# Images handed to a worker process at a time: enough to hide the hand-over, few enough in flight.
CHUNK = 16
# Below this many images a pool's start-up (about 1.5 s here) costs more than it saves.
POOL_FROM = 1000


def list_images(src: Path) -> tuple[list[str], list[tuple[Path, int]]]:
    """Classes (sorted sub-folder names) and (path, label) for every file below them."""
    classes = sorted(p.name for p in src.iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(classes) < 2:
        raise ValueError(f"{src} needs at least 2 class sub-folders (found {len(classes)})")
    items = []
    for label, name in enumerate(classes):
        for path in sorted((src / name).rglob("*")):
            if path.is_file() and not path.name.startswith("."):
                items.append((path, label))
    return classes, items


def load_image(path: Path, size: int) -> np.ndarray:
    """The image as size x size x 3 uint8; raises ValueError if it is unreadable."""
    try:
        with Image.open(path) as image:
            if image.format == "JPEG" and min(image.size) >= 2 * size:
                # Let libjpeg decode at 1/2, 1/4 or 1/8 scale when that is still larger than
                # the target: the same result after the resize below, several times faster.
                image.draft("RGB", (size, size))
            image.load()
            rgb = image.convert("RGB")
            if rgb.size != (size, size):
                rgb = rgb.resize((size, size), Image.BILINEAR)
            return np.asarray(rgb, dtype=np.uint8)
    except (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError) as err:
        raise ValueError(f"{type(err).__name__}: {err}") from err


def decode(job: tuple[str, int, int, str]) -> tuple[int, bytes | None, str | None]:
    """In a worker process: (path, label, size, encoding) -> (label, stored image bytes, error)."""
    path, label, size, encoding = job
    try:
        pixels = load_image(Path(path), size)
    except ValueError as err:
        return label, None, str(err)
    if encoding == "raw":
        return label, pixels.tobytes(), None
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=JPEG_QUALITY)
    return label, buffer.getvalue(), None


def _example(tf, stored: bytes, size: int, label: int) -> bytes:
    feature = {
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[stored])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
        "height": tf.train.Feature(int64_list=tf.train.Int64List(value=[size])),
        "width": tf.train.Feature(int64_list=tf.train.Int64List(value=[size])),
    }
    # deterministic: map fields in key order. Otherwise the order follows the process's string
    # hashing, and a re-run writes other bytes: a resumed upload would find every shard changed.
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString(deterministic=True)


def _decoded(jobs: list, processes: int):
    """The decoded images in the order of ``jobs``, from ``processes`` worker processes."""
    if processes == 1:
        yield from map(decode, jobs)
        return
    # spawn, not fork: this process has TensorFlow's threads running.
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        yield from pool.imap(decode, jobs, chunksize=CHUNK)


def goes_to_val(index: int, val_fraction: float) -> bool:
    """Whether the index-th readable image is a validation one: spread evenly over the (shuffled)
    stream, so that of any first N images round(N x fraction) are validation ones."""
    return round((index + 1) * val_fraction) > round(index * val_fraction)


def convert(src: Path, out: Path, image_size: int = 32, shards: int = DEFAULT_SHARDS,
            val_fraction: float = 0.2, seed: int = 0, processes: int | None = None,
            encoding: str = "raw") -> dict:
    """Write train/val shards and the manifest into ``out``; returns the manifest.

    ``processes`` decode in parallel (spawned: a script that calls this needs the usual
    ``if __name__ == "__main__":`` guard); None picks one per core for large folders."""
    import tensorflow as tf  # Imported here so --help and argument errors stay instant.

    if encoding not in ENCODINGS:
        raise ValueError(f"unknown encoding {encoding!r}; valid: {', '.join(ENCODINGS)}")
    classes, items = list_images(src)
    order = np.random.default_rng(seed).permutation(len(items))
    jobs = [(str(items[i][0]), items[i][1], image_size, encoding) for i in order]
    expected_val = round(len(jobs) * val_fraction)
    n_shards = {"train": max(1, min(shards, len(jobs) - expected_val)),
                "val": max(1, min(max(1, shards // 4), expected_val))}
    out.mkdir(parents=True, exist_ok=True)
    names = {split: [f"{split}-{i:05d}-of-{n:05d}.tfrecord" for i in range(n)] for split, n in n_shards.items()}
    writers = {split: [tf.io.TFRecordWriter(str(out / name)) for name in names[split]] for split in SPLITS}
    written = {split: [0] * n_shards[split] for split in SPLITS}
    counts = {split: [0] * len(classes) for split in SPLITS}
    skipped, readable = [], 0
    try:
        if processes is None:
            processes = (os.cpu_count() or 1) if len(jobs) >= POOL_FROM else 1
        for job, (label, stored, error) in zip(jobs, _decoded(jobs, processes)):
            if stored is None:
                skipped.append({"path": job[0], "error": error})
                continue
            split = "val" if goes_to_val(readable, val_fraction) and len(jobs) > 1 else "train"
            readable += 1
            shard = sum(counts[split]) % n_shards[split]
            writers[split][shard].write(_example(tf, stored, image_size, label))
            written[split][shard] += 1
            counts[split][label] += 1
    finally:
        for split in SPLITS:
            for writer in writers[split]:
                writer.close()
    if not readable:
        raise ValueError(f"no readable images under {src} ({len(skipped)} skipped)")
    manifest = {"image_size": image_size, "encoding": encoding, "classes": classes, "shards": {},
                "counts": {}, "skipped": skipped, "source": str(src)}
    for split in SPLITS:
        # Skipped images can leave a shard empty: it is removed, and not listed.
        for name, count in zip(names[split], written[split]):
            if not count:
                (out / name).unlink()
        manifest["shards"][split] = [name for name, count in zip(names[split], written[split]) if count]
        manifest["counts"][split] = dict(zip(classes, counts[split]))
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
                        help=f"number of train shards (default {DEFAULT_SHARDS}; val gets a quarter)")
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
