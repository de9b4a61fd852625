"""The tutorials' saving pattern: every worker saves (saving runs collectives), only the
chief keeps its copy, the other workers write to a temp dir and remove it."""
import os
import shutil

import numpy as np
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
print("replicas in sync:", strategy.num_replicas_in_sync, flush=True)


def _is_chief(task_type, task_id):
    # The tutorial's note: with a "chief" job in TF_CONFIG (tfcluster has one), the chief is chief.
    return task_type is None or task_type == "chief"


def write_filepath(filepath, task_type, task_id):
    dirpath, base = os.path.dirname(filepath), os.path.basename(filepath)
    if not _is_chief(task_type, task_id):
        dirpath = os.path.join(dirpath, f"workertemp_{task_id}")
    os.makedirs(dirpath, exist_ok=True)
    return os.path.join(dirpath, base)


rng = np.random.default_rng(0)
x = rng.random((48, 8), dtype=np.float32)
y = (x.sum(axis=1) > 4).astype(np.int64)
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(24), epochs=1, verbose=2)

task_type, task_id = strategy.cluster_resolver.task_type, strategy.cluster_resolver.task_id
model_path = os.environ["AIP_MODEL_DIR"] + "/model.keras"
path = write_filepath(model_path, task_type, task_id)
model.save(path)
if not _is_chief(task_type, task_id):
    shutil.rmtree(os.path.dirname(path))
    print("removed temp dir", os.path.dirname(path), flush=True)
else:
    print("chief saved", path, flush=True)
