"""Turn an image folder (one sub-folder per class) into TFRecord shards.

    python -m trainer.create_tfrecords --src IMAGES --out DATA
    python -m trainer.create_tfrecords --synthetic --out DATA

Each record holds the image resized to ``--image-size`` as raw RGB bytes plus its
label, so the training pipeline only parses and normalises. Corrupt or unreadable
images are skipped and counted. ``DATA/manifest.json`` describes the result.
"""

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

MANIFEST = "manifest.json"
SPLITS = ("train", "val")


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
            image.load()
            rgb = image.convert("RGB")
            if rgb.size != (size, size):
                rgb = rgb.resize((size, size), Image.BILINEAR)
            return np.asarray(rgb, dtype=np.uint8)
    except (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError) as err:
        raise ValueError(f"{type(err).__name__}: {err}") from err


def _example(tf, pixels: np.ndarray, label: int) -> bytes:
    feature = {
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[pixels.tobytes()])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
        "height": tf.train.Feature(int64_list=tf.train.Int64List(value=[pixels.shape[0]])),
        "width": tf.train.Feature(int64_list=tf.train.Int64List(value=[pixels.shape[1]])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def convert(src: Path, out: Path, image_size: int = 32, shards: int = 4,
            val_fraction: float = 0.2, seed: int = 0) -> dict:
    """Write train/val shards and the manifest into ``out``; returns the manifest."""
    import tensorflow as tf  # Imported here so --help and argument errors stay instant.

    classes, items = list_images(src)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(items))
    loaded, skipped = [], []
    for index in order:
        path, label = items[index]
        try:
            loaded.append((load_image(path, image_size), label))
        except ValueError as err:
            skipped.append({"path": str(path), "error": str(err)})
    if not loaded:
        raise ValueError(f"no readable images under {src} ({len(skipped)} skipped)")

    n_val = int(round(len(loaded) * val_fraction)) if len(loaded) > 1 else 0
    split_items = {"val": loaded[:n_val], "train": loaded[n_val:]}
    out.mkdir(parents=True, exist_ok=True)
    manifest = {"image_size": image_size, "classes": classes, "shards": {}, "counts": {},
                "skipped": skipped, "source": str(src)}
    for split, records in split_items.items():
        n_shards = max(1, min(shards if split == "train" else max(1, shards // 4), len(records)))
        names = [f"{split}-{i:05d}-of-{n_shards:05d}.tfrecord" for i in range(n_shards)]
        writers = [tf.io.TFRecordWriter(str(out / name)) for name in names]
        counts = [0] * len(classes)
        for i, (pixels, label) in enumerate(records):
            writers[i % n_shards].write(_example(tf, pixels, label))
            counts[label] += 1
        for writer in writers:
            writer.close()
        manifest["shards"][split] = names if records else []
        manifest["counts"][split] = dict(zip(classes, counts))
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
    parser.add_argument("--shards", type=_positive_int, default=4, help="number of train shards")
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
    if args.synthetic:
        from trainer.synthetic import write_image_folder

        with tempfile.TemporaryDirectory(prefix="tfcluster-shapes-") as folder:
            write_image_folder(Path(folder), args.per_class, args.image_size, args.seed)
            manifest = convert(Path(folder), args.out, args.image_size, args.shards,
                               args.val_fraction, args.seed)
        manifest["source"] = "synthetic shapes"
    else:
        try:
            manifest = convert(args.src, args.out, args.image_size, args.shards,
                               args.val_fraction, args.seed)
        except ValueError as err:
            print(f"create_tfrecords: error: {err}", file=sys.stderr)
            return 2
    counts = manifest["counts"]
    print(f"wrote {sum(counts['train'].values())} train / {sum(counts['val'].values())} val "
          f"images in {len(manifest['classes'])} classes to {args.out}; "
          f"skipped {len(manifest['skipped'])} unreadable")
    for item in manifest["skipped"]:
        print(f"  skipped {item['path']}: {item['error']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
