"""Keras 3 with a custom training loop (strategy.run), which works under MultiWorkerMirroredStrategy."""
import os

import keras
import numpy as np
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
# Under --keras 3, tf.keras is Keras 3 too (under the default it would be tf_keras).
print("tf.keras is keras:", tf.keras.Model is keras.Model, "replicas in sync:", strategy.num_replicas_in_sync,
      flush=True)

global_batch = 8 * strategy.num_replicas_in_sync
rng = np.random.default_rng(0)
x = rng.random((96, 8), dtype=np.float32)
y = (x.sum(axis=1) > 4).astype(np.int64)
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
iterator = iter(strategy.experimental_distribute_dataset(dataset))

with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
    optimizer = keras.optimizers.SGD(0.1)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")


@tf.function
def train_step(iterator):
    def step(inputs):
        features, labels = inputs
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_fn(labels, model(features, training=True)),
                                              global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step, args=(next(iterator),)), axis=None)


for step in range(4):
    loss = train_step(iterator)
print("custom loop done, loss", round(float(loss), 4), "task", os.environ["TFCLUSTER_WORKER_INDEX"], flush=True)
