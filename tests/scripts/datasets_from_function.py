"""Input with strategy.distribute_datasets_from_function: each worker builds and shards its own pipeline."""
import numpy as np
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
print("replicas in sync:", strategy.num_replicas_in_sync, flush=True)
GLOBAL_BATCH = 8 * strategy.num_replicas_in_sync


def dataset_fn(context: tf.distribute.InputContext):
    batch = context.get_per_replica_batch_size(GLOBAL_BATCH)
    print(f"input pipeline {context.input_pipeline_id} of {context.num_input_pipelines}", flush=True)
    rng = np.random.default_rng(context.input_pipeline_id)
    x = rng.random((64, 8), dtype=np.float32)
    y = (x.sum(axis=1) > 4).astype(np.int64)
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
    return dataset.batch(batch).repeat()


with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
distributed = strategy.distribute_datasets_from_function(dataset_fn)
model.fit(distributed, epochs=2, steps_per_epoch=2, verbose=2)
print("distributed fit done", flush=True)
