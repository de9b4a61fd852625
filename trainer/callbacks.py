"""The trainer's Keras callbacks: backups, progress events, and the best epoch (with early stopping).

With ``steps_per_execution`` N, tf_keras runs N steps per call of its compiled function and calls a
callback's batch hooks once per call: ``on_train_batch_begin`` with the call's first step,
``on_train_batch_end`` with its last (tf_keras/src/engine/training.py, ``fit``: ``end_step = step +
data_handler.step_increment``). Each callback here counts steps from those two numbers, so its
figures are the same whatever N.
"""

from __future__ import annotations

import threading

from trainer import lr
from trainer.events import emit

MONITOR = "val_accuracy"  # The score the best epoch and early stopping follow (higher is better).


def backup_callback(keras, backup_dir: str, every_steps: int | None, steps_per_epoch: int, on_gpu: bool):
    """tf_keras BackupAndRestore, backing up at epoch ends, or every N steps and at each epoch's last step.

    With an int save_freq, tf_keras backs up only on step counts (counted across epochs), never at
    epoch end; a backup at the epoch's last step (batch steps_per_epoch - 1) is what its restore
    reads as "epoch finished" (WorkerTrainingState.maybe_load_initial_counters_from_ckpt), so that
    one is added. tf_keras counts hook calls as steps and records the step a call *began* at, which
    with steps_per_execution would back up every N x save_freq steps and resume inside a call that
    had finished; this one counts steps and records the call's last step. On GPU VMs
    save_before_preemption=True also backs up when the metadata server announces the VM's
    termination (instance/maintenance-event); TensorFlow does nothing with it on CPU-only
    machines, where the step backups are what limits the work lost.
    """
    class Backup(keras.callbacks.BackupAndRestore):
        def on_train_batch_begin(self, batch, logs=None):
            self._call_began = int(batch)  # The batch is recorded at the call's end instead.

        def on_train_batch_end(self, batch, logs=None):
            batch = int(batch)  # After a step-level restore, tf_keras passes a numpy integer.
            self._training_state._ckpt_saved_batch.assign(batch)
            self._training_state.backup_if_preempted()
            if not every_steps:
                return
            self._batches_count += batch - getattr(self, "_call_began", batch) + 1
            if self._batches_count >= self.save_freq or (batch == steps_per_epoch - 1 and self._batches_count):
                self._batches_count = 0  # The next N steps count from this backup.
                self._backup(epoch=self._current_epoch, batch=batch)

        def _backup(self, epoch, batch=0):
            super()._backup(epoch, batch)
            if every_steps:
                emit("backup", epoch=int(epoch) + 1, batch=int(batch))  # Progress for the stall limit.

    return Backup(backup_dir=backup_dir, save_freq=every_steps or "epoch", save_before_preemption=on_gpu)


class ImageCounter:
    """Counts the images this worker's held-out pipeline hands to evaluation: a py_function per
    batch, after the pipeline's last stage, no collective. Each worker reports its own count in its
    events; together they are the images the cluster scored (an empty batch MultiWorkerMirroredStrategy
    makes up for a worker whose share ended comes from no pipeline, and counts nothing)."""

    def __init__(self):
        self._count = 0
        self._lock = threading.Lock()

    def counted(self, tf, dataset):
        def add(images) -> int:
            with self._lock:
                self._count += int(images)
            return 0

        def mark(images, labels):
            token = tf.py_function(add, [tf.shape(images)[0]], tf.int64)
            with tf.control_dependencies([token]):
                return tf.identity(images), tf.identity(labels)

        return dataset.map(mark)

    def take(self) -> int:
        """The images counted since the last take."""
        with self._lock:
            count, self._count = self._count, 0
        return count


def event_callback(keras, epochs: int, steps_per_epoch: int, global_batch: int, gpu_sampler=None,
                   held_out: ImageCounter | None = None):
    """A Keras callback that reports progress as TFCLUSTER_EVENT lines: the first step of each
    process (with the epoch and step it starts at: after a restore, where the backup left off),
    about ten steps per epoch, and each epoch's begin and end. Step events carry the global batch
    (images per step, for throughput); epoch ends carry the rate of the epoch's last step, the
    held-out images this worker scored in the epoch (``held_out_images``) and, with a sampler, the
    GPU utilisation."""
    every = max(1, steps_per_epoch // 10)

    class _Events(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self._first_step_seen = False
            self._epoch = 0
            self._last = 0  # The last step reported in this epoch.

        def on_train_batch_end(self, batch, logs=None):
            step = int(batch) + 1  # After a step-level restore, tf_keras passes a numpy integer.
            if not self._first_step_seen:
                self._first_step_seen = True
                emit("first_step", epoch=self._epoch, step=step, steps=steps_per_epoch, batch=global_batch)
            elif step // every > self._last // every:  # Crossed a multiple (one call may run several steps).
                emit("step", epoch=self._epoch, step=step, steps=steps_per_epoch, batch=global_batch)
            self._last = step

        def on_test_batch_end(self, batch, logs=None):
            if (int(batch) + 1) % every == 0:  # Validation is progress too (tfcluster/stall.py).
                emit("val_step", epoch=self._epoch, step=int(batch) + 1)

        def on_epoch_begin(self, epoch, logs=None):
            self._epoch = epoch + 1
            self._last = 0
            emit("epoch_begin", epoch=epoch + 1, epochs=epochs)

        def on_epoch_end(self, epoch, logs=None):
            metrics = {key: float(value) for key, value in (logs or {}).items()}
            extra = {"gpu": gpu_sampler.take_epoch()} if gpu_sampler else {}
            if held_out is not None:
                extra["held_out_images"] = held_out.take()
            emit("epoch_end", epoch=epoch + 1, epochs=epochs, metrics=metrics,
                 learning_rate=lr.current_rate(self.model.optimizer), **extra)

    return _Events()


class BestEpoch:
    """Keeps the weights of the epoch with the best validation accuracy, and with ``patience``
    stops training after that many epochs without a better one (``--early-stopping``).

    Every worker sees the same (all-reduced) validation score, so every worker keeps the same
    epoch and stops at the same one. The weights are kept in memory: after a resume, the best is
    among the epochs since the resume. Without a validation set the last epoch is the best.
    """

    def __init__(self, keras, patience: int | None = None):
        outer = self
        self.patience = patience
        self.best: float | None = None
        self.epoch: int | None = None  # 1-based.
        self.stopped_at: int | None = None
        self.weights = None

        class _Watch(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                outer.observe(self.model, epoch + 1, (logs or {}).get(MONITOR))

        self.callback = _Watch()

    def observe(self, model, epoch: int, score) -> None:
        if score is None:
            self.epoch, self.weights = epoch, None  # Nothing to compare: the last epoch stands.
            return
        if self.best is None or float(score) > self.best:
            self.best, self.epoch, self.weights = float(score), epoch, model.get_weights()
        elif self.patience and epoch - self.epoch >= self.patience:
            model.stop_training = True
            self.stopped_at = epoch
            emit("early_stop", epoch=epoch, best_epoch=self.epoch, best=self.best, patience=self.patience)

    def restore(self, model) -> None:
        """Put the best epoch's weights back (a no-op when the last epoch was the best)."""
        if self.weights is not None:
            model.set_weights(self.weights)


def evaluate(model, dataset, callbacks=None) -> dict:
    """One pass of ``model`` over ``dataset`` (finite, of unknown size), whatever the model's
    steps_per_execution: tf_keras refuses a dataset of unknown size when that is above 1
    (data_adapter.DataHandler._validate_data_handler, "TODO(b/152094471): Support this with
    DistIter.get_next_as_optional"), so it is 1 for the pass (the model's ``_steps_per_execution``
    variable, which tf_keras reads when it builds the handler and the test function)."""
    steps = model._steps_per_execution
    before = int(steps.numpy())
    steps.assign(1)
    try:
        return model.evaluate(dataset, verbose=0, return_dict=True, callbacks=callbacks)
    finally:
        steps.assign(before)


def validation_callback(keras, dataset, callbacks=()):
    """Validation for steps_per_execution above 1, where fit's own cannot run (see ``evaluate``):
    one pass over ``dataset`` at each epoch's end, its figures added to the epoch's logs as
    ``val_*`` for the callbacks after this one (put it first)."""
    class _Validate(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            scored = evaluate(self.model, dataset, list(callbacks))
            if logs is not None:
                logs.update({f"val_{key}": float(value) for key, value in scored.items()})

    return _Validate()
