"""TensorFlow's multi-worker Keras tutorial, as tfcluster runs it unchanged but for one line: the
worker count (https://www.tensorflow.org/tutorials/distribute/multi_worker_with_keras).

    tfcluster up --workers 3
    tfcluster train --script examples/keras_script/train.py --code-dir examples/keras_script \
        --requirements examples/keras_script/requirements.txt -- --epochs 3

Every worker gets TF_CONFIG (chief 0, then workers), the AIP_* output folders and TFCLUSTER_REPLICAS.
The tutorial counts `len(tf_config['cluster']['worker'])`, which leaves out tfcluster's chief (and
Vertex AI's): the count below sums every task, so the global batch is per-worker x all workers.
"""

import argparse
import json
import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--per-worker-batch", type=int, default=64)
args = parser.parse_args()

tf_config = json.loads(os.environ["TF_CONFIG"])
num_workers = sum(len(tasks) for tasks in tf_config["cluster"].values())  # The chief included.
global_batch = args.per_worker_batch * num_workers

strategy = tf.distribute.MultiWorkerMirroredStrategy()

# Stand-in data, the same on every worker (the tutorial downloads MNIST): 28x28 images, 10 classes.
rng = np.random.default_rng(0)
images = rng.random((20 * global_batch, 28, 28), dtype=np.float32)
labels = (images.mean(axis=(1, 2)) * 10).astype(np.int64) % 10
dataset = tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(10_000).repeat().batch(global_batch)

with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(28, 28)),
        tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(32, 3, activation="relu"),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=tf.keras.optimizers.SGD(learning_rate=0.001), metrics=["accuracy"])

model.fit(dataset, epochs=args.epochs, steps_per_epoch=20)

# Saving takes part in the collectives, so every worker saves (the tutorial's pattern): the chief where
# Vertex AI (and tfcluster, which brings it back) expects the model, the others to a scratch folder
# they remove.
if tf_config["task"]["type"] == "chief":
    model.save(os.path.join(os.environ["AIP_MODEL_DIR"], "model.keras"))
else:
    scratch = tempfile.mkdtemp()
    model.save(os.path.join(scratch, "model.keras"))
    shutil.rmtree(scratch)
