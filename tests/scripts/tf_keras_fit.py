"""A script written for tf_keras (Keras 2) directly."""
import numpy as np
import tensorflow as tf
import tf_keras as keras

strategy = tf.distribute.MultiWorkerMirroredStrategy()
print("replicas in sync:", strategy.num_replicas_in_sync, flush=True)

rng = np.random.default_rng(0)
x = rng.random((96, 8), dtype=np.float32)
y = (x.sum(axis=1) > 4).astype(np.int64)
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8 * strategy.num_replicas_in_sync)

with strategy.scope():
    model = keras.Sequential([keras.layers.Dense(2, input_shape=(8,))])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(dataset, epochs=1, verbose=2)
print("tf_keras fit done", flush=True)
