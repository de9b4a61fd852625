"""Vertex AI's multi-worker tutorial shape: model.fit under MultiWorkerMirroredStrategy with tf.keras
(tf_keras), every worker saves (saving runs collectives), the chief to AIP_MODEL_DIR, the others to a
temporary folder beside it that they remove (tf.io.gfile: the folders are on gs://)."""
import os

import numpy as np
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
print("replicas in sync:", strategy.num_replicas_in_sync, flush=True)

rng = np.random.default_rng(0)
x = rng.random((64, 8), dtype=np.float32)
y = (x.sum(axis=1) > 4).astype(np.int64)
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8 * strategy.num_replicas_in_sync)
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(2)])
    model.compile(optimizer="sgd", metrics=["accuracy"],
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(dataset, epochs=2, verbose=2)


def _is_chief(task_type, task_id):
    return task_type == "chief"


def _get_temp_dir(dirpath, task_id):
    temp_dir = os.path.join(dirpath, "workertemp_" + str(task_id))
    tf.io.gfile.makedirs(temp_dir)
    return temp_dir


def write_filepath(filepath, task_type, task_id):
    dirpath = os.path.dirname(filepath)
    base = os.path.basename(filepath)
    if not _is_chief(task_type, task_id):
        dirpath = _get_temp_dir(dirpath, task_id)
    return os.path.join(dirpath, base)


task_type, task_id = strategy.cluster_resolver.task_type, strategy.cluster_resolver.task_id
path = write_filepath(os.environ["AIP_MODEL_DIR"], task_type, task_id)
model.save(path)
if not _is_chief(task_type, task_id):
    tf.io.gfile.rmtree(os.path.dirname(path))
print("saved to", path, flush=True)
