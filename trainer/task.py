"""Multi-worker image-classification training with MultiWorkerMirroredStrategy.

    TF_CONFIG=... python -m trainer.task --data-dir DATA [--model cnn|densenet121|resnet50]

Why tf_keras and not Keras 3: on TF 2.21, Keras 3 ``model.fit`` fails under
MultiWorkerMirroredStrategy with two or more workers (keras-team/keras#20585).
tf_keras (``TF_USE_LEGACY_KERAS=1``) keeps the tutorial's ``model.fit`` path with
``BackupAndRestore`` fault tolerance, which a hand-written loop would re-implement.

Outputs follow Vertex AI's conventions, so the same trainer runs there unchanged:
``AIP_MODEL_DIR`` (model: the SavedModel at its root), ``AIP_CHECKPOINT_DIR`` (backup for resume)
and ``AIP_TENSORBOARD_LOG_DIR`` (TensorBoard) are the defaults of the matching flags.
Only the chief writes them; other workers write to temp dirs that are removed.

Each epoch validates on the whole held-out split, once; the model exported is the epoch with the
best validation accuracy (trainer/callbacks.py), scored at the end on the test split if the data
has one. Flags: trainer/flags.py.
"""

import hashlib
import json
import os
import shutil
import socket
import sys
import tempfile
import time

# Must be set before TensorFlow is imported: it makes tf.keras resolve to tf_keras.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from trainer import lr  # noqa: E402
from trainer import collective as collectives  # noqa: E402
from trainer.callbacks import (BestEpoch, ImageCounter, backup_callback, evaluate, event_callback,  # noqa: E402
                               validation_callback)
from trainer.events import emit  # noqa: E402
from trainer.flags import config_hash, parse_args  # noqa: E402,F401 (parse_args: the trainer's CLI)
from trainer.gpu import GpuSampler  # noqa: E402
from trainer.input_watch import InputWatch  # noqa: E402
from trainer.model import build_model, choose_precision, gpu_capabilities, skip_empty_batches  # noqa: E402


def data_fingerprint(manifest: dict) -> str:
    """Names the data set for "same configuration" comparisons, wherever its copy lives."""
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:12]


def is_chief(task_type, task_id, has_chief_task: bool) -> bool:
    """The chief writes the real outputs (the TF multi-worker tutorial's rule).

    Without a "chief" task in the cluster, worker 0 plays that role.
    """
    if task_type in (None, "chief"):
        return True
    return task_type == "worker" and task_id == 0 and not has_chief_task


def main(argv=None) -> int:
    args = parse_args(argv)
    import tensorflow as tf
    import tf_keras as keras

    from trainer import data, export
    from trainer.create_tfrecords import read_manifest

    # Created first: MWMS must exist before any other TF op runs (listing devices is not an op).
    # NCCL with GPUs, RING without (trainer/collective.py: TensorFlow's AUTO never picks NCCL).
    strategy, collective, collective_why = collectives.strategy_for(tf, args.collective,
                                                                    tf.config.list_physical_devices("GPU"))
    resolver = strategy.cluster_resolver
    task_type, task_id = resolver.task_type, resolver.task_id
    spec = resolver.cluster_spec().as_dict()
    num_workers = max(1, sum(len(tasks) for tasks in spec.values()))
    chief = is_chief(task_type, task_id, "chief" in spec)
    capabilities = gpu_capabilities(tf)
    if args.xla and strategy.num_replicas_in_sync > 1 and not capabilities:
        # tf_keras compiles the all-reduce with the step; XLA compiles collectives for GPUs only.
        raise SystemExit("trainer.task: error: --xla with several replicas needs GPUs: XLA compiles the step's "
                         "all-reduce only there (TensorFlow: \"Collectives are not yet implemented for CPU devices "
                         "when compiling with XLA\"); drop --xla on CPU workers")
    precision, why = choose_precision(args.precision, capabilities)
    keras.mixed_precision.set_global_policy(precision)

    manifest = read_manifest(args.data_dir)
    num_classes = len(manifest["classes"])
    image_size = args.image_size or manifest["image_size"]
    if args.model != "cnn" and image_size < 32:
        raise SystemExit(f"trainer.task: error: --model {args.model} needs --image-size >= 32")
    global_batch = args.batch_size * strategy.num_replicas_in_sync
    counts = {split: sum(manifest["counts"][split].values()) for split in ("train", "val", "test")}
    steps_per_epoch = args.steps_per_epoch or max(1, counts["train"] // global_batch)
    lr_plan = lr.plan(args.optimizer, args.learning_rate, args.lr_scaling, strategy.num_replicas_in_sync,
                      args.batch_size, args.warmup_epochs, steps_per_epoch, args.lr_schedule,
                      total_steps=args.epochs * steps_per_epoch)
    gpus = [tf.config.experimental.get_device_details(gpu).get("device_name", "GPU")
            for gpu in tf.config.list_physical_devices("GPU")]
    policy = data.shard_policy(len(manifest["shards"]["train"]), num_workers)
    # Cached when this worker's records fit in memory and the run reads them more than once.
    share = 1 if policy.name == "DATA" else num_workers
    cache = (args.epochs * steps_per_epoch * global_batch > counts["train"]
             and data.fits_in_memory(data.split_bytes(args.data_dir, "train") // share))
    emit("strategy", task_type=task_type, task_id=task_id, chief=chief, num_workers=num_workers,
         cluster_spec=spec, hostname=socket.gethostname(),
         replicas_in_sync=strategy.num_replicas_in_sync, global_batch=global_batch,
         local_replicas=len(strategy.extended.worker_devices),
         mixed_precision=precision != "float32", precision=precision, xla=args.xla,
         collective=collective, communication=collectives.communication_of(strategy),
         steps_per_execution=args.steps_per_execution, cache=cache, model=args.model,
         steps_per_epoch=steps_per_epoch, shard_policy=policy.name, batch_size=args.batch_size,
         image_size=image_size, data=data_fingerprint(manifest), args=config_hash(args), gpus=gpus,
         learning_rate={**lr_plan.as_event(), "text": lr_plan.describe()})
    if chief:
        print(f"precision {precision} ({why}), all-reduce {collective.upper()} ({collective_why}), "
              f"XLA {'on' if args.xla else 'off'}, "
              f"{args.steps_per_execution} step(s) per execution, training data "
              f"{'cached in memory' if cache else 'read from its files each epoch'}", flush=True)

    # Counted as training takes its batches: a worker whose input stops is named when a run stalls.
    input_watch = InputWatch(keras, steps_per_execution=args.steps_per_execution, steps_per_epoch=steps_per_epoch)
    train_ds = input_watch.counted(tf, data.make_dataset(args.data_dir, "train", global_batch, image_size,
                                                         num_workers, seed=args.seed, cache=cache))
    # The held-out images each worker scores, counted where its pipeline hands them over; the
    # validation batches are watched as the training ones are (a hung read at an epoch's end).
    scored = {split: ImageCounter() for split in ("val", "test")}
    held_out = {split: scored[split].counted(tf, data.make_dataset(args.data_dir, split, global_batch, image_size,
                                                                   num_workers, training=False, cache=cache))
                for split in ("val", "test") if counts[split]}
    if "val" in held_out:
        held_out["val"] = input_watch.counted(tf, held_out["val"])

    # Python's, NumPy's and TensorFlow's global seeds: without them the initial weights differ on
    # every run (measured on the shapes set after 3 epochs: validation accuracy 0.44 to 0.62).
    keras.utils.set_random_seed(args.seed)
    with strategy.scope():
        model = build_model(keras, args.model, num_classes, image_size, args.weights,
                            args.width, args.depth, args.dropout)
        model.compile(optimizer=lr.build_optimizer(keras, lr_plan, args.weight_decay),
                      loss=keras.losses.SparseCategoricalCrossentropy(), metrics=["accuracy"],
                      jit_compile=args.xla, steps_per_execution=args.steps_per_execution)
    skip_empty_batches(keras, tf, model)

    # Non-chief workers must still write (saving runs collectives) but to a throwaway place.
    scratch = None if chief else tempfile.mkdtemp(prefix=f"tfcluster-{task_type}{task_id}-")
    if scratch:
        emit("scratch_dir", path=scratch)
    tensorboard_dir = args.tensorboard_dir if chief else os.path.join(scratch, "tensorboard")
    gpu_sampler = GpuSampler.start_if_available()
    best = BestEpoch(keras, args.early_stopping)
    events = event_callback(keras, args.epochs, steps_per_epoch, global_batch, gpu_sampler, scored["val"])
    # fit validates itself, one full pass each epoch, unless it runs several steps per call (see
    # trainer/callbacks.py's evaluate): then a callback placed first does, for the ones after it.
    own_validation = args.steps_per_execution > 1 and "val" in held_out
    callbacks = [
        *([validation_callback(keras, held_out["val"], [events, input_watch.callback])] if own_validation else []),
        # Every worker passes the same backup dir; tf_keras lets only the chief keep it.
        backup_callback(keras, args.checkpoint_dir, args.backup_every_steps, steps_per_epoch,
                        on_gpu=bool(tf.config.list_physical_devices("GPU"))),
        keras.callbacks.TensorBoard(log_dir=tensorboard_dir),
        events,
        input_watch.callback,
        best.callback,
    ]
    started = time.time()
    input_watch.start()
    try:
        history = model.fit(train_ds, epochs=args.epochs, steps_per_epoch=steps_per_epoch,
                            validation_data=None if own_validation else held_out.get("val"),
                            callbacks=callbacks, verbose=2 if chief else 0)
    finally:
        input_watch.stop()
        if gpu_sampler:
            gpu_sampler.stop()
    train_seconds = round(time.time() - started, 2)

    epochs_run = len(history.epoch)
    # The export is the best epoch's, not the last one's; so are the metrics reported with it.
    at = history.epoch.index(best.epoch - 1) if best.epoch and best.epoch - 1 in history.epoch else -1
    final = {key: float(values[at]) for key, values in history.history.items() if values}
    best.restore(model)
    if "test" in held_out:
        final.update({f"test_{key}": float(value) for key, value in evaluate(model, held_out["test"]).items()})

    model_dir = args.model_dir if chief else os.path.join(scratch, "model")
    keras_path = export.save_keras(tf, model, model_dir)
    emit("export", path=keras_path if chief else None)  # Each finished save is progress (stall limit).
    # The model ready to serve: raw JPEG/PNG or uint8 in, at model_dir's root (trainer/export.py).
    saved_model_path = export.export(tf, model, model_dir, image_size, manifest["classes"])
    emit("export", path=saved_model_path if chief else None)
    # A copy of files (no collective): the chief's alone.
    versioned = export.export_version(tf, saved_model_path, args.export_base) if chief and args.export_base else None
    if versioned:
        emit("export", path=versioned)
    if scratch:
        shutil.rmtree(scratch, ignore_errors=True)
        emit("scratch_removed", path=scratch)

    emit("done", chief=chief, model_dir=model_dir if chief else None, keras_path=keras_path if chief else None,
         saved_model_path=saved_model_path if chief else None, versioned_path=versioned,
         metrics=final, best_epoch=best.epoch, epochs_run=epochs_run, stopped_early=best.stopped_at is not None,
         test_images=scored["test"].take(),  # This worker's share of the test split.
         signatures=export.describe_signatures(tf, saved_model_path) if chief else None,
         chance=1.0 / num_classes, classes=manifest["classes"], train_seconds=train_seconds)
    if chief:
        if best.best is not None:
            stopped = f"; stopped early at epoch {best.stopped_at}" if best.stopped_at else ""
            print(f"validation accuracy {best.best:.3f} (chance {1.0 / num_classes:.3f}) at epoch {best.epoch}, "
                  f"the best of {epochs_run}: exported{stopped}", flush=True)
        if "test_accuracy" in final:
            print(f"test accuracy {final['test_accuracy']:.3f} on the {counts['test']} test images", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
