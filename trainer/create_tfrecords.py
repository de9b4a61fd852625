"""Turn an image folder (one sub-folder per class) into TFRecord shards.

    python -m trainer.create_tfrecords --src IMAGES --out DATA [--shards 16] [--processes N]
    python -m trainer.create_tfrecords --synthetic --out DATA

Each record holds the image resized to ``--image-size`` plus its label: raw RGB bytes (the
default: the training pipeline only parses and normalises) or, with ``--encoding jpeg``, the
resized image re-encoded as JPEG (about 9x fewer bytes at 224 px to upload and read, decoded in the
pipeline). Images are decoded as the served model decodes them (trainer/images.py). Corrupt or
unreadable images are skipped and counted; a class folder with no file is dropped, with a warning.
The files are split into train, val (``--val-fraction``) and, with ``--test-fraction``, test.

The set is written into a temporary folder beside ``DATA`` and swapped in when complete, so
``DATA`` never mixes shards of two conversions (``--shards 8`` then ``--shards 4`` leaves 4).
``DATA/manifest.json`` describes the result.

It streams: ``--processes`` processes each own some of the shards, and decode and write their
images one at a time, so memory stays flat whatever the folder's size. No TensorFlow is needed:
trainer/records.py writes the TFRecord format.
"""

import argparse
import io
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from trainer import records
from trainer.images import load_image

MANIFEST = "manifest.json"
SPLITS = ("train", "val", "test")
ENCODINGS = ("raw", "jpeg")
DEFAULT_SHARDS = 16
JPEG_QUALITY = 95
# Below this many images a pool's start-up (about 1.5 s here) costs more than it saves.
POOL_FROM = 1000


def class_folders(src: Path) -> tuple[list[str], list[str]]:
    """(classes, empty): the sorted sub-folders holding at least one file, and those holding none.
    An empty folder is no class: it would only lower the chance level the summary reports."""
    def has_file(folder: Path) -> bool:
        return any(path.is_file() and not path.name.startswith(".") for path in folder.rglob("*"))

    folders = sorted(p.name for p in src.iterdir() if p.is_dir() and not p.name.startswith("."))
    classes = [name for name in folders if has_file(src / name)]
    if len(classes) < 2:
        raise ValueError(f"{src} needs at least 2 class sub-folders with images (found {len(classes)}"
                         f"{f'; empty: {len(folders) - len(classes)}' if len(folders) > len(classes) else ''})")
    return classes, [name for name in folders if name not in classes]


def list_images(src: Path) -> tuple[list[str], list[tuple[str, int]]]:
    """Classes (sorted sub-folder names with files) and (path, label) for every file below them
    (paths as text: a Path object per file would cost memory in proportion to the folder)."""
    classes, _ = class_folders(src)
    items = []
    for label, name in enumerate(classes):
        for path in sorted((src / name).rglob("*")):
            if path.is_file() and not path.name.startswith("."):
                items.append((str(path), label))
    return classes, items


def stored_image(path: Path, size: int, encoding: str, notes: list[str] | None = None) -> bytes:
    """What a record holds for one image: raw RGB bytes or a JPEG; raises ValueError if unreadable."""
    pixels = load_image(path, size, notes)
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
    test_fraction: float
    # This process writes the shards whose index (train, val, then test) is worker mod processes.
    worker: int
    processes: int


def shuffled_files(src: Path, seed: int) -> tuple[list[str], list[tuple[str, int]]]:
    """Classes and (path, label) of every file, in the seeded order that decides splits and shards."""
    classes, items = list_images(src)
    return classes, [items[i] for i in np.random.default_rng(seed).permutation(len(items))]


def write_shards(job: ShardJob) -> tuple[dict[str, list[int]], list[tuple[int, str, str]], list[tuple[int, str, str]]]:
    """Decode and write ``job``'s images one at a time. Returns the labels written to each shard,
    the (index, path, error) of each unreadable file and the (index, path, warning) of each of PIL's
    warnings."""
    _, files = shuffled_files(Path(job.src), job.seed)
    split = SplitPlan(len(files), job.val_fraction, job.test_fraction)
    names = split.shard_names(job.shards)
    owner = {name: i % job.processes for i, name in enumerate(name for s in SPLITS for name in names[s])}
    labels: dict[str, list[int]] = {}
    writers: dict[str, records.RecordWriter] = {}
    skipped, warned = [], []
    try:
        for index, ((path, label), name) in enumerate(zip(files, split.placements(names))):
            if owner[name] != job.worker:
                continue
            notes: list[str] = []
            try:
                stored = stored_image(Path(path), job.size, job.encoding, notes)
            except ValueError as err:
                skipped.append((index, path, str(err)))
                continue
            finally:
                warned += [(index, path, note) for note in notes]
            if name not in writers:
                writers[name] = records.RecordWriter(os.path.join(job.out, name))
            writers[name].write(records.example({"image": stored, "label": [label], "height": [job.size],
                                                 "width": [job.size]}))
            labels.setdefault(name, []).append(label)
    finally:
        for writer in writers.values():
            writer.close()
    return labels, skipped, warned


def _spread(index: int, fraction: float) -> bool:
    """Whether the index-th item is one of a ``fraction`` spread evenly: of any first N items,
    round(N x fraction) are."""
    return round((index + 1) * fraction) > round(index * fraction)


@dataclass(frozen=True)
class SplitPlan:
    """Which of ``count`` shuffled files goes to which split: the held-out files (val + test
    fractions) are spread evenly over the list, and the test ones evenly among them."""

    count: int
    val_fraction: float
    test_fraction: float = 0.0

    @property
    def _held(self) -> float:
        return self.val_fraction + self.test_fraction if self.count > 1 else 0.0

    def split_of(self, index: int, held_before: int) -> str:
        """The split of the index-th file, ``held_before`` files before it having been held out."""
        if not _spread(index, self._held):
            return "train"
        return "test" if _spread(held_before, self.test_fraction / self._held) else "val"

    def sizes(self) -> dict[str, int]:
        held = round(self.count * self._held)
        test = round(held * (self.test_fraction / self._held)) if held else 0  # As split_of spreads them.
        return {"train": self.count - held, "val": held - test, "test": test}

    def shard_names(self, shards: int) -> dict[str, list[str]]:
        """The shard files of each split: ``shards`` each (fewer if it has fewer files), so that
        with as many shards as workers every split shards by FILE."""
        return {split: [f"{split}-{i:05d}-of-{n:05d}.tfrecord" for i in range(n)]
                for split, n in ((split, min(shards, size)) for split, size in self.sizes().items())}

    def placements(self, names: dict[str, list[str]]):
        """The shard name of each file: round-robin within each split, by position in the list (an
        unreadable file leaves a gap rather than moving the others, so each shard can be written on
        its own)."""
        seen = {split: 0 for split in SPLITS}
        held = 0
        for index in range(self.count):
            split = self.split_of(index, held)
            held += split != "train"
            yield names[split][seen[split] % len(names[split])]
            seen[split] += 1


def convert(src: Path, out: Path, image_size: int = 32, shards: int = DEFAULT_SHARDS,
            val_fraction: float = 0.2, seed: int = 0, processes: int | None = None,
            encoding: str = "raw", test_fraction: float = 0.0) -> dict:
    """Write train/val(/test) shards and the manifest into a new folder, then swap it in at ``out``;
    returns the manifest.

    ``processes`` decode and write in parallel, each its own shards (spawned: a script that
    calls this needs the usual ``if __name__ == "__main__":`` guard); None picks one per core
    for large folders. The validation and test shares are fractions of the files listed."""
    if encoding not in ENCODINGS:
        raise ValueError(f"unknown encoding {encoding!r}; valid: {', '.join(ENCODINGS)}")
    if not 0 <= val_fraction + test_fraction < 1:
        raise ValueError(f"--val-fraction + --test-fraction must be below 1 (got {val_fraction + test_fraction:g})")
    out = Path(out)
    check_replaceable(out)
    classes, empty = class_folders(src)
    _, items = list_images(src)
    count = len(items)
    del items  # Each process lists the folder itself.
    names = SplitPlan(count, val_fraction, test_fraction).shard_names(shards)
    if processes is None:
        processes = (os.cpu_count() or 1) if count >= POOL_FROM else 1
    processes = max(1, min(processes, sum(len(listed) for listed in names.values())))
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        jobs = [ShardJob(str(src), str(work), image_size, encoding, seed, shards, val_fraction, test_fraction,
                         worker, processes) for worker in range(processes)]
        if processes == 1:
            results = [write_shards(jobs[0])]
        else:
            # spawn, not fork: the caller may have TensorFlow's threads running.
            with multiprocessing.get_context("spawn").Pool(processes) as pool:
                results = pool.map(write_shards, jobs, chunksize=1)
        labels = {name: found for result, _, _ in results for name, found in result.items()}
        skipped = sorted(item for _, failed, _ in results for item in failed)
        warned = sorted(item for _, _, notes in results for item in notes)
        if not labels:
            raise ValueError(f"no readable images under {src} ({len(skipped)} skipped)")
        manifest = {"image_size": image_size, "encoding": encoding, "classes": classes, "shards": {},
                    "counts": {}, "skipped": [{"path": path, "error": error} for _, path, error in skipped],
                    "warnings": [{"path": path, "warning": text} for _, path, text in warned],
                    "empty_classes": empty, "source": str(src)}
        for split in SPLITS:
            # A shard whose files were all unreadable was never created, and is not listed.
            manifest["shards"][split] = [name for name in names[split] if name in labels]
            counts = np.bincount([label for name in names[split] for label in labels.get(name, [])],
                                 minlength=len(classes))
            manifest["counts"][split] = dict(zip(classes, (int(c) for c in counts)))
        (work / MANIFEST).write_text(json.dumps(manifest, indent=2))
        swap_in(work, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # Gone already unless something failed.
    return manifest


def check_replaceable(out: Path) -> None:
    """``out`` may be replaced: it does not exist, is empty, or holds an earlier conversion."""
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / MANIFEST).exists())):
        raise ValueError(f"--out {out} exists and is not a TFRecord folder (no {MANIFEST}); "
                         "give a new or empty folder, it is replaced as a whole")


def swap_in(work: Path, out: Path) -> None:
    """Put the finished folder ``work`` at ``out``, removing what was there: two renames (a reader
    in between sees no folder, never a mix of two conversions)."""
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
        os.rename(out, old / out.name)
    os.rename(work, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def read_manifest(data_dir) -> dict:
    """The manifest, with what a set converted before a key existed did not have (no test split)."""
    path = os.path.join(str(data_dir), MANIFEST)
    if path.startswith("gs://"):
        import tensorflow as tf  # tf.io.gfile reads gs:// on the VMs.

        with tf.io.gfile.GFile(path) as handle:
            manifest = json.load(handle)
    else:
        with open(path) as handle:
            manifest = json.load(handle)
    for split in SPLITS:
        manifest["shards"].setdefault(split, [])
        manifest["counts"].setdefault(split, {name: 0 for name in manifest["classes"]})
    return manifest


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
    parser.add_argument("--val-fraction", type=_fraction, default=0.2,
                        help="share of the files held out to validate each epoch (default 0.2)")
    parser.add_argument("--test-fraction", type=_fraction, default=0.0,
                        help="share of the files held out for one final test score (default: none)")
    parser.add_argument("--per-class", type=_positive_int, default=400,
                        help="images per class for --synthetic")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.src is not None and not args.src.is_dir():
        parser.error(f"--src {args.src} is not a folder")
    if args.val_fraction + args.test_fraction >= 1:
        parser.error(f"--val-fraction + --test-fraction must be below 1 (got {args.val_fraction + args.test_fraction:g})")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    options = dict(image_size=args.image_size, shards=args.shards, val_fraction=args.val_fraction,
                   test_fraction=args.test_fraction, seed=args.seed, processes=args.processes,
                   encoding=args.encoding)
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
    report(manifest, args.out)
    return 0


def report(manifest: dict, out: Path) -> None:
    """What the conversion did, one line each for what a user should look at."""
    counts = manifest["counts"]
    test = sum(counts["test"].values())
    print(f"wrote {sum(counts['train'].values())} train / {sum(counts['val'].values())} val "
          f"{f'/ {test} test ' if test else ''}images in {len(manifest['classes'])} classes to {out} "
          f"({len(manifest['shards']['train'])} train shards, {manifest['encoding']}); "
          f"skipped {len(manifest['skipped'])} unreadable")
    for name in manifest["empty_classes"]:
        print(f"warning: class folder {name!r} has no file: dropped (not a class)")
    for name in manifest["classes"]:
        if not sum(counts[split][name] for split in SPLITS):
            print(f"warning: class {name!r} has no readable image: it stays a class the model never sees")
    for item in manifest["skipped"]:
        print(f"  skipped {item['path']}: {item['error']}")
    for item in manifest["warnings"]:
        print(f"warning: {item['path']}: {item['warning']}")


if __name__ == "__main__":
    sys.exit(main())
