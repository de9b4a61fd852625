"""The table a run ends with: throughput per epoch, then workers, learning rate, scaling,
attempts, preemptions and maintenance, metrics and where the model is."""

from __future__ import annotations

import time
from pathlib import Path

from tfcluster import launch, ui
from tfcluster.commands.common import console
from tfcluster.state import RunRecord


def print_summary(run: RunRecord, progress: launch.Progress, wall: float, tensorboard=None,
                  cost: str | None = None) -> None:
    _print_throughput(run.summary["throughput"])
    table = ui.table(f"Run {run.run_id}: {run.outcome}", ["", ""])
    table.show_header = False
    table.add_row("workers", str(run.workers))
    table.add_row("replicas in sync", str(progress.replicas_in_sync or "n/a"))
    table.add_row("collective", run.summary.get("collective") or progress.collective.describe(progress.strategy))
    rate = run.summary.get("learning_rate")
    table.add_row("learning rate", rate["text"] if rate else "n/a (the script's code names no optimizer with a "
                  "rate readable before the run)" if "script" in run.summary else "n/a")
    speed = run.summary["throughput"]
    if speed["global_images_per_second"]:
        table.add_row("throughput", _speed_line(speed))
    elif speed.get("steps_per_second"):  # A script's Keras bars, without a global batch read from its code.
        table.add_row("throughput", f"{speed['steps_per_second']:g} steps/s ({speed['median_step_seconds'] * 1000:.0f} "
                      "ms/step, Keras's); images/s needs the global batch, which the script's code does not "
                      "give as a number (.batch(N) or fit(batch_size=N))")
    else:
        table.add_row("throughput", "n/a")
    scaling = run.summary.get("scaling")
    if scaling:
        table.add_row("scaling efficiency",
                      f"{scaling['efficiency']:.2f} ({scaling['speedup']:.2f}x the 1-worker run "
                      f"{scaling['reference_run']}, {scaling['reference_images_per_second']:.0f} images/s)")
    elif run.workers > 1:
        table.add_row("scaling efficiency", "n/a (no 1-worker run of the same configuration yet)")
    if tensorboard:
        table.add_row("throughput in TensorBoard", str(tensorboard))
    if progress.epochs:
        table.add_row("epochs", f"{progress.last_epoch}/{progress.epochs}")
    resumed = {a: e for a, e in progress.resumed_at.items() if a > 1}
    table.add_row("attempts", str(run.attempts))
    for item in progress.preemptions:
        table.add_row("preempted", f"{item['worker']} ({item['address']}) at "
                      f"{time.strftime('%H:%M:%S', time.localtime(item['at']))}, attempt {item['attempt']}")
    for item in progress.maintenance:
        table.add_row("host maintenance", f"{item['worker']} ({item['event']}), attempt {item['attempt']}")
    for attempt, epoch in sorted(resumed.items()):
        redo = f"epochs 1-{epoch - 1} not redone" if epoch > 1 else "no checkpoint yet, started over"
        table.add_row(f"attempt {attempt}", f"resumed at epoch {epoch} ({redo})")
    if progress.metrics:
        table.add_row("final metrics", ui.format_metrics(progress.metrics))
    if "val_accuracy" in progress.metrics and progress.chance:
        table.add_row("validation accuracy",
                      f"{progress.metrics['val_accuracy']:.3f} (chance {progress.chance:.3f})")
    table.add_row("model", progress.keras_path or progress.saved_model_path or "n/a")
    if progress.saved_model_path:
        table.add_row("SavedModel", progress.saved_model_path)
    table.add_row("wall time", ui.duration(wall))
    if cost:
        table.add_row("cost", cost)
    ui.show(table)
    if progress.signatures:
        console.print(f"Signatures of {progress.saved_model_path}:", soft_wrap=True)
        console.print(progress.signatures, markup=False, highlight=False, soft_wrap=True)


def _speed_line(speed: dict) -> str:
    """Wall clock beside the median step, then each worker's own (tfcluster/throughput.py)."""
    wall = speed.get("wall_images_per_second")
    text = (f"{wall:.0f} images/s by wall clock, " if wall else "") + \
        f"{speed['global_images_per_second']:.0f} at the median step ({speed['median_step_seconds'] * 1000:.1f} ms)"
    mine = speed.get("per_worker_wall_images_per_second") or speed["per_worker_images_per_second"]
    if speed.get("source") == "keras":
        text += f" by Keras's time per step, global batch {speed['global_batch']} read from the script's code"
    return text + "; per worker: " + "  ".join(f"w{w} {v:.0f}" for w, v in mine.items())


def _print_throughput(speed: dict) -> None:
    """Per epoch: the chief's median step time, images/s for all workers (wall clock and median step)
    and each worker's by its own wall clock, GPU use."""
    if not speed.get("epochs"):
        return
    gpu = any(record.get("gpu_utilization") for record in speed["epochs"])
    table = ui.table("Throughput per epoch", ["epoch", "median step", "images/s (median step)",
                                              "images/s (wall clock)", "wall clock per worker",
                                              *(["GPU utilisation per worker"] if gpu else [])])
    for record in speed["epochs"]:
        step = record["median_step_seconds"]
        wall = record.get("wall_images_per_second")
        row = [str(record["epoch"]), f"{step * 1000:.1f} ms" if step else "n/a",
               f"{record['global_images_per_second']:.0f}" if record["global_images_per_second"] else "n/a",
               f"{wall:.0f}" if wall else "n/a",
               "  ".join(f"w{w} {v:.0f}" for w, v in (record.get("per_worker_wall_images_per_second") or {}).items())
               or "n/a"]
        if gpu:
            row.append("  ".join(f"w{w} {v:.0f}%" for w, v in (record.get("gpu_utilization") or {}).items())
                       or "n/a")
        table.add_row(*row)
    ui.show(table)


def saved_in(folder: Path) -> tuple[str | None, str | None]:
    """(a Keras file, a SavedModel folder) a script saved in its model folder (AIP_MODEL_DIR), which its
    events do not name: the first ``*.keras`` (or ``*.h5``) file, and the folder itself or the first
    one under it holding ``saved_model.pb``."""
    files = sorted([*folder.rglob("*.keras"), *folder.rglob("*.h5")])
    saved = sorted(path.parent for path in folder.rglob("saved_model.pb"))
    return (str(files[0]) if files else None), (str(saved[0]) if saved else None)
