"""Reads TF_CONFIG itself to count the workers and size the global batch."""
import json
import os

import tensorflow as tf

tf_config = json.loads(os.environ["TF_CONFIG"])
# Count every task: tfcluster's cluster has a "chief" job plus a "worker" job.
num_workers = sum(len(tasks) for tasks in tf_config["cluster"].values())
task = tf_config["task"]
strategy = tf.distribute.MultiWorkerMirroredStrategy()
print(f"{task['type']}:{task['index']} of {num_workers} workers, "
      f"replicas in sync: {strategy.num_replicas_in_sync}", flush=True)

global_batch = 4 * num_workers
dataset = tf.data.Dataset.range(48).batch(global_batch)
total = strategy.reduce(tf.distribute.ReduceOp.SUM,
                        strategy.run(lambda b: tf.reduce_sum(b), args=(next(iter(strategy.experimental_distribute_dataset(dataset))),)),
                        axis=None)
print("first global batch sums to", int(total), flush=True)
