"""Whether the bundled trainer's data fills its global batch: 49 training images under a global batch
of 96 (32 a replica x 3) train one step an epoch, and the rest of each epoch is dropped
(`drop_remainder`, trainer/data.py), without a word. `train` says so once, before the run, from the
data's manifest and the batch the run will use.

May import: nothing of tfcluster (a manifest and numbers in, one line out).
"""

from __future__ import annotations

import json
from pathlib import Path

# trainer/flags.py's --batch-size default: per replica.
DEFAULT_BATCH_SIZE = 32


def batch_size(trainer_args: list[str]) -> int:
    """--batch-size among the trainer's arguments (either spelling), else the trainer's default."""
    for index, word in enumerate(trainer_args):
        value = word.split("=", 1)[1] if word.startswith("--batch-size=") else (
            trainer_args[index + 1] if word == "--batch-size" and index + 1 < len(trainer_args) else None)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return DEFAULT_BATCH_SIZE  # The trainer refuses it in its own words.
    return DEFAULT_BATCH_SIZE


def short_data_note(data_dir: Path | None, trainer_args: list[str], replicas: int) -> str | None:
    """One line when the training images give fewer than two full global batches an epoch."""
    manifest = data_dir / "manifest.json" if data_dir else None
    if manifest is None or not manifest.exists() or "--steps-per-epoch" in " ".join(trainer_args):
        return None
    try:
        images = sum(json.loads(manifest.read_text())["counts"]["train"].values())
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    per_replica = batch_size(trainer_args)
    global_batch = per_replica * replicas
    if images >= 2 * global_batch:
        return None
    steps = max(1, images // global_batch)  # trainer/task.py's steps per epoch.
    return (f"the data has {images} training images and the global batch is {global_batch} ({per_replica} x "
            f"{replicas} replicas): an epoch is {steps} step(s), too few to learn from; use a smaller --batch-size "
            "after `--`, fewer --workers, or more data")
