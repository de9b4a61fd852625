"""The multi-worker tutorial's script: tf.keras, a model compiled in strategy.scope(), model.fit."""
import numpy as np
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
print("replicas in sync:", strategy.num_replicas_in_sync, flush=True)

rng = np.random.default_rng(0)
x = rng.random((96, 8), dtype=np.float32)
y = (x.sum(axis=1) > 4).astype(np.int64)
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8 * strategy.num_replicas_in_sync)

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(2)])
    model.compile(optimizer="sgd", metrics=["accuracy"],
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
history = model.fit(dataset, epochs=2, verbose=2)
print("fit done, loss", round(history.history["loss"][-1], 4), flush=True)
