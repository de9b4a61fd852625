"""A tf_keras script that reports its steps with tfcluster.progress and backs up every few steps.

With --hang-step N, worker --hang-worker blocks in Python at global step N, once (the marker file
records it; a retry runs through): its process and heartbeats live on while its peers wait in the
all-reduce without an error, which only the launcher's stall limit catches. It blocks before it
reports step N, or with --hang-after-report after: then every worker's last progress is step N.
"""
import argparse
import os
import threading
import time

import numpy as np
import tensorflow as tf
import tf_keras as keras

import tfcluster

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20, help="steps per epoch")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--backup-every", type=int, default=5, help="steps between backups")
parser.add_argument("--hang-step", type=int, default=0, help="global step to hang at (0: never)")
parser.add_argument("--hang-worker", type=int, default=1)
parser.add_argument("--step-seconds", type=float, default=0.0, help="extra time each step takes")
parser.add_argument("--hang-after-report", action="store_true", help="report step N, then hang")
args = parser.parse_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
worker = int(os.environ["TFCLUSTER_WORKER_INDEX"])
# The run's folder: local, or gs:// on cloud VMs (tf.io.gfile reads and writes both).
marker = os.environ["AIP_CHECKPOINT_DIR"].rsplit("/", 2)[0] + "/hung-once"

batch = 4 * strategy.num_replicas_in_sync
rng = np.random.default_rng(0)
x = rng.random((args.steps * batch, 8), dtype=np.float32)
y = (x.sum(axis=1) > 4).astype(np.int64)
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).repeat()

with strategy.scope():
    model = keras.Sequential([keras.layers.Dense(2, input_shape=(8,))])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


class Steps(keras.callbacks.Callback):
    """The global step of each batch end (after a restore, tf_keras continues the epoch's count)."""

    epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        Steps.epoch = epoch

    @staticmethod
    def of(batch) -> int:
        return Steps.epoch * args.steps + int(batch) + 1


class Hang(Steps):
    def on_train_batch_end(self, batch, logs=None):
        if worker == args.hang_worker and self.of(batch) == args.hang_step and not tf.io.gfile.exists(marker):
            with tf.io.gfile.GFile(marker, "w") as handle:
                handle.write(str(args.hang_step))
            print(f"hanging at step {args.hang_step}", flush=True)
            threading.Event().wait()  # Blocked in Python: the process and its heartbeats live on.


class Progress(Steps):
    def on_train_batch_end(self, batch, logs=None):
        if args.step_seconds:
            time.sleep(args.step_seconds)
        tfcluster.progress(self.of(batch))


backup = keras.callbacks.BackupAndRestore(os.environ["AIP_CHECKPOINT_DIR"], save_freq=args.backup_every)
reporting = [Progress(), Hang()] if args.hang_after_report else [Hang(), Progress()]
model.fit(dataset, epochs=args.epochs, steps_per_epoch=args.steps, verbose=0,
          callbacks=[Steps(), backup, *reporting])
print("hung_at_step done", flush=True)
