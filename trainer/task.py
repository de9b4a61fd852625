"""Multi-worker image-classification training with MultiWorkerMirroredStrategy.

    TF_CONFIG=... python -m trainer.task --data-dir DATA [--model cnn|densenet121|resnet50]

Why tf_keras and not Keras 3: on TF 2.21, Keras 3 ``model.fit`` fails under
MultiWorkerMirroredStrategy with two or more workers (keras-team/keras#20585).
tf_keras (``TF_USE_LEGACY_KERAS=1``) keeps the tutorial's ``model.fit`` path with
``BackupAndRestore`` fault tolerance, which a hand-written loop would re-implement.

Outputs follow Vertex AI's conventions, so the same trainer runs there unchanged:
``AIP_MODEL_DIR`` (model), ``AIP_CHECKPOINT_DIR`` (backup for resume) and
``AIP_TENSORBOARD_LOG_DIR`` (TensorBoard) are the defaults of the matching flags.
Only the chief writes them; other workers write to temp dirs that are removed.
"""

import argparse
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
from trainer.events import emit  # noqa: E402
from trainer.gpu import GpuSampler  # noqa: E402
from trainer.input_watch import InputWatch  # noqa: E402

MODELS = ("cnn", "densenet121", "resnet50")
WEIGHTS = ("none", "imagenet")


def _int_at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum} (got {value})")
        return value
    return parse


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 (got {value})")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (got {value})")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1) (got {value})")
    return value


def parse_args(argv=None) -> argparse.Namespace:
    env = os.environ
    parser = argparse.ArgumentParser(prog="trainer.task", description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default=env.get("TFCLUSTER_DATA_DIR"),
                        help="TFRecords from create_tfrecords (default: $TFCLUSTER_DATA_DIR)")
    parser.add_argument("--model", choices=MODELS, default="cnn")
    parser.add_argument("--weights", choices=WEIGHTS, default="none",
                        help="imagenet needs a download; 'none' trains from scratch")
    parser.add_argument("--epochs", type=_int_at_least(1), default=8)
    parser.add_argument("--batch-size", type=_int_at_least(1), default=32,
                        help="per replica; the global batch is this x replicas in sync")
    parser.add_argument("--learning-rate", type=_positive_float, default=2e-3,
                        help="the rate for the reference batch (--batch-size on 1 replica); "
                             "--lr-scaling makes it follow the replicas in sync")
    parser.add_argument("--optimizer", choices=lr.OPTIMIZERS, default="adam",
                        help=f"sgd is SGD with momentum {lr.SGD_MOMENTUM}")
    parser.add_argument("--lr-scaling", choices=lr.RULES, default=None,
                        help="how the rate follows the replicas: x replicas, x sqrt(replicas), or not "
                             "(default: sqrt for adam and rmsprop, linear for sgd)")
    parser.add_argument("--warmup-epochs", type=_non_negative_float, default=None,
                        help="epochs over which the rate rises from the reference to the scaled one "
                             "(default: 5 for sgd, 0 for adam and rmsprop)")
    parser.add_argument("--width", type=_int_at_least(4), default=32,
                        help="cnn: filters of the first conv block (block i has i x width)")
    parser.add_argument("--depth", type=_int_at_least(1), default=3, help="cnn: conv blocks")
    parser.add_argument("--dropout", type=_fraction, default=0.0, help="cnn: dropout before the dense layer")
    parser.add_argument("--image-size", type=_int_at_least(32), default=None,
                        help="input side in pixels (default: the size stored in the shards)")
    parser.add_argument("--steps-per-epoch", type=_int_at_least(1), default=None,
                        help="default: train images // global batch")
    parser.add_argument("--model-dir", default=env.get("AIP_MODEL_DIR", "output/model"))
    parser.add_argument("--checkpoint-dir", default=env.get("AIP_CHECKPOINT_DIR", "output/checkpoints"))
    parser.add_argument("--tensorboard-dir",
                        default=env.get("AIP_TENSORBOARD_LOG_DIR", "output/tensorboard"))
    parser.add_argument("--seed", type=int, default=0,
                        help="seeds the weights' initialisation, dropout and the shuffle order, so a run can be "
                             "repeated")
    parser.add_argument("--backup-every-steps", type=_int_at_least(1), default=None,
                        help="also back up to the checkpoint dir every N training steps (default: epoch ends only); "
                             "each epoch's last step is always backed up")
    args = parser.parse_args(argv)
    if not args.data_dir:
        parser.error("--data-dir is required (or set TFCLUSTER_DATA_DIR); "
                     "make one with: invoke data --synthetic")
    if not args.data_dir.startswith("gs://") and not os.path.isfile(
            os.path.join(args.data_dir, "manifest.json")):
        parser.error(f"--data-dir {args.data_dir} has no manifest.json; "
                     "make it with: python -m trainer.create_tfrecords --synthetic --out DIR")
    return args


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


def use_mixed_precision(tf) -> bool:
    """mixed_float16 only pays off on tensor cores (compute capability >= 7.0)."""
    for gpu in tf.config.list_physical_devices("GPU"):
        capability = tf.config.experimental.get_device_details(gpu).get("compute_capability")
        if capability and tuple(capability) >= (7, 0):
            return True
    return False


def build_model(keras, name: str, num_classes: int, image_size: int, weights: str,
                width: int = 32, depth: int = 3, dropout: float = 0.0):
    """``width``, ``depth`` and ``dropout`` shape the cnn (the defaults are the demo's 32-64-96)."""
    inputs = keras.Input((image_size, image_size, 3), name="image")  # RGB in [0, 1]
    if name == "cnn":
        x = inputs
        for filters in [width * (block + 1) for block in range(depth)]:
            x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
            x = keras.layers.MaxPooling2D()(x)
        # Flatten, not global pooling: where a corner or an arm sits is the signal
        # (measured: pooling stayed at chance on the shapes set, Flatten reached 0.9).
        x = keras.layers.Flatten()(x)
        if dropout:
            x = keras.layers.Dropout(dropout)(x)
        x = keras.layers.Dense(64, activation="relu")(x)
    else:
        application, preprocess = {
            "densenet121": (keras.applications.DenseNet121, keras.applications.densenet.preprocess_input),
            "resnet50": (keras.applications.ResNet50, keras.applications.resnet50.preprocess_input),
        }[name]
        base = application(include_top=False, input_shape=(image_size, image_size, 3),
                           weights=None if weights == "none" else "imagenet")
        # Transfer learning freezes pretrained features; from scratch, everything trains.
        base.trainable = weights == "none"
        x = preprocess(inputs * 255.0)
        x = base(x, training=weights == "none")
        x = keras.layers.GlobalAveragePooling2D()(x)
        x = keras.layers.Dropout(0.2)(x)
    # Softmax in float32: float16 logits lose precision under mixed precision.
    outputs = keras.layers.Dense(num_classes, activation="softmax", dtype="float32")(x)
    return keras.Model(inputs, outputs, name=f"tfcluster_{name}")


def main(argv=None) -> int:
    args = parse_args(argv)
    import tensorflow as tf
    import tf_keras as keras

    from trainer import data, export
    from trainer.create_tfrecords import read_manifest

    # Created first: MWMS must exist before any other TF op runs.
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    resolver = strategy.cluster_resolver
    task_type, task_id = resolver.task_type, resolver.task_id
    spec = resolver.cluster_spec().as_dict()
    num_workers = max(1, sum(len(tasks) for tasks in spec.values()))
    chief = is_chief(task_type, task_id, "chief" in spec)
    mixed = use_mixed_precision(tf)
    if mixed:
        keras.mixed_precision.set_global_policy("mixed_float16")

    manifest = read_manifest(args.data_dir)
    num_classes = len(manifest["classes"])
    image_size = args.image_size or manifest["image_size"]
    if args.model != "cnn" and image_size < 32:
        raise SystemExit(f"trainer.task: error: --model {args.model} needs --image-size >= 32")
    global_batch = args.batch_size * strategy.num_replicas_in_sync
    train_count = sum(manifest["counts"]["train"].values())
    val_count = sum(manifest["counts"]["val"].values())
    steps_per_epoch = args.steps_per_epoch or max(1, train_count // global_batch)
    validation_steps = max(1, val_count // global_batch) if val_count else None
    lr_plan = lr.plan(args.optimizer, args.learning_rate, args.lr_scaling, strategy.num_replicas_in_sync,
                      args.batch_size, args.warmup_epochs, steps_per_epoch)
    gpus = [tf.config.experimental.get_device_details(gpu).get("device_name", "GPU")
            for gpu in tf.config.list_physical_devices("GPU")]
    emit("strategy", task_type=task_type, task_id=task_id, chief=chief, num_workers=num_workers,
         cluster_spec=spec, hostname=socket.gethostname(),
         replicas_in_sync=strategy.num_replicas_in_sync, global_batch=global_batch,
         local_replicas=len(strategy.extended.worker_devices),
         mixed_precision=mixed, model=args.model, steps_per_epoch=steps_per_epoch,
         shard_policy=data.shard_policy(len(manifest["shards"]["train"]), num_workers).name,
         batch_size=args.batch_size, image_size=image_size, data=data_fingerprint(manifest), gpus=gpus,
         learning_rate={**lr_plan.as_event(), "text": lr_plan.describe()})

    # Counted as training takes its batches: a worker whose input stops is named when a run stalls.
    input_watch = InputWatch(keras)
    train_ds = input_watch.counted(tf, data.make_dataset(args.data_dir, "train", global_batch, image_size,
                                                         num_workers, seed=args.seed))
    val_ds = (data.make_dataset(args.data_dir, "val", global_batch, image_size, num_workers,
                                shuffle=False) if val_count else None)

    # Python's, NumPy's and TensorFlow's global seeds: without them the initial weights differ on
    # every run (measured on the shapes set after 3 epochs: validation accuracy 0.44 to 0.62).
    keras.utils.set_random_seed(args.seed)
    with strategy.scope():
        model = build_model(keras, args.model, num_classes, image_size, args.weights,
                            args.width, args.depth, args.dropout)
        model.compile(optimizer=lr.build_optimizer(keras, lr_plan),
                      loss=keras.losses.SparseCategoricalCrossentropy(),
                      metrics=["accuracy"])

    # Non-chief workers must still write (saving runs collectives) but to a throwaway place.
    scratch = None if chief else tempfile.mkdtemp(prefix=f"tfcluster-{task_type}{task_id}-")
    if scratch:
        emit("scratch_dir", path=scratch)
    tensorboard_dir = args.tensorboard_dir if chief else os.path.join(scratch, "tensorboard")
    gpu_sampler = GpuSampler.start_if_available()
    callbacks = [
        # Every worker passes the same backup dir; tf_keras lets only the chief keep it.
        backup_callback(keras, args.checkpoint_dir, args.backup_every_steps, steps_per_epoch,
                        on_gpu=bool(tf.config.list_physical_devices("GPU"))),
        keras.callbacks.TensorBoard(log_dir=tensorboard_dir),
        EventCallback(keras, args.epochs, steps_per_epoch, global_batch, gpu_sampler),
        input_watch.callback,
    ]
    started = time.time()
    input_watch.start()
    try:
        history = model.fit(train_ds, epochs=args.epochs, steps_per_epoch=steps_per_epoch,
                            validation_data=val_ds, validation_steps=validation_steps,
                            callbacks=callbacks, verbose=2 if chief else 0)
    finally:
        input_watch.stop()
        if gpu_sampler:
            gpu_sampler.stop()

    model_dir = args.model_dir if chief else os.path.join(scratch, "model")
    tf.io.gfile.makedirs(model_dir)
    keras_path = os.path.join(model_dir, "model.keras")
    model.save(keras_path)
    emit("export", path=keras_path if chief else None)  # Each finished save is progress (stall limit).
    # The model ready to serve: raw JPEG/PNG or uint8 in, model_dir/<version>/ (trainer/export.py).
    saved_model_path = export.export(tf, model, model_dir, image_size, manifest["classes"])
    emit("export", path=saved_model_path if chief else None)
    if scratch:
        shutil.rmtree(scratch, ignore_errors=True)
        emit("scratch_removed", path=scratch)

    final = {key: float(values[-1]) for key, values in history.history.items() if values}
    emit("done", chief=chief, model_dir=model_dir if chief else None, keras_path=keras_path if chief else None,
         saved_model_path=saved_model_path if chief else None, metrics=final,
         signatures=export.describe_signatures(tf, saved_model_path) if chief else None,
         chance=1.0 / num_classes, classes=manifest["classes"], train_seconds=round(time.time() - started, 2))
    if chief and "val_accuracy" in final:
        print(f"validation accuracy {final['val_accuracy']:.3f} (chance {1.0 / num_classes:.3f})", flush=True)
    return 0


def backup_callback(keras, backup_dir: str, every_steps: int | None, steps_per_epoch: int, on_gpu: bool):
    """tf_keras BackupAndRestore, backing up at epoch ends, or every N steps and at each epoch's last step.

    With an int save_freq, tf_keras backs up only on step counts (counted across epochs), never at
    epoch end; a backup at the epoch's last step (batch steps_per_epoch - 1) is what its restore
    reads as "epoch finished" (WorkerTrainingState.maybe_load_initial_counters_from_ckpt), so that
    one is added. On GPU VMs save_before_preemption=True also backs up when the metadata server
    announces the VM's termination (instance/maintenance-event); TensorFlow does nothing with it
    on CPU-only machines, where the step backups are what limits the work lost.
    """
    base = keras.callbacks.BackupAndRestore
    if not every_steps:
        return base(backup_dir=backup_dir, save_before_preemption=on_gpu)

    class StepBackup(base):
        def _backup(self, epoch, batch=0):
            super()._backup(epoch, batch)
            emit("backup", epoch=int(epoch) + 1, batch=int(batch))  # Progress for the stall limit.

        def on_train_batch_end(self, batch, logs=None):
            super().on_train_batch_end(batch, logs)
            if batch == steps_per_epoch - 1 and self._batches_count:
                self._batches_count = 0  # The next N steps count from this epoch-end backup.
                self._backup(epoch=self._current_epoch, batch=batch)

    return StepBackup(backup_dir=backup_dir, save_freq=every_steps, save_before_preemption=on_gpu)


def EventCallback(keras, epochs: int, steps_per_epoch: int, global_batch: int, gpu_sampler=None):
    """A Keras callback that reports progress as TFCLUSTER_EVENT lines: the first step of each
    process (with the epoch and step it starts at: after a restore, where the backup left off),
    about ten steps per epoch, and each epoch's begin and end. Step events carry the global batch
    (images per step, for throughput); epoch ends carry the rate of the epoch's last step and, with
    a sampler, the GPU utilisation."""
    every = max(1, steps_per_epoch // 10)

    class _Events(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self._first_step_seen = False
            self._epoch = 0

        def on_train_batch_end(self, batch, logs=None):
            step = int(batch) + 1  # After a step-level restore, tf_keras passes a numpy integer.
            if not self._first_step_seen:
                self._first_step_seen = True
                emit("first_step", epoch=self._epoch, step=step, steps=steps_per_epoch, batch=global_batch)
            elif step % every == 0:
                emit("step", epoch=self._epoch, step=step, steps=steps_per_epoch, batch=global_batch)

        def on_test_batch_end(self, batch, logs=None):
            if (int(batch) + 1) % every == 0:  # Validation is progress too (tfcluster/stall.py).
                emit("val_step", epoch=self._epoch, step=int(batch) + 1)

        def on_epoch_begin(self, epoch, logs=None):
            self._epoch = epoch + 1
            emit("epoch_begin", epoch=epoch + 1, epochs=epochs)

        def on_epoch_end(self, epoch, logs=None):
            metrics = {key: float(value) for key, value in (logs or {}).items()}
            extra = {"gpu": gpu_sampler.take_epoch()} if gpu_sampler else {}
            emit("epoch_end", epoch=epoch + 1, epochs=epochs, metrics=metrics,
                 learning_rate=lr.current_rate(self.model.optimizer), **extra)

    return _Events()


if __name__ == "__main__":
    sys.exit(main())
