"""A custom training loop under TensorFlow's own PreemptionCheckpointHandler, configured as
TensorFlow configures it on a GPU VM of Compute Engine (failure_handling.py:
_complete_config_for_environment, GcpGpuTerminationConfig).

Its watcher thread polls the metadata server's instance/maintenance-event every second
(failure_handling_util.termination_watcher_function_gce); on TERMINATE_ON_HOST_MAINTENANCE the
workers agree on a step, each saves a checkpoint to AIP_CHECKPOINT_DIR (the bucket on gcp) and
exits 143 (gce_exit_fn). A new attempt restores it. TensorFlow picks this configuration by itself
only where it finds a GPU (on a CPU VM of Compute Engine it refuses to run the handler at all), so
the script names it; the grace period is 0 instead of a GPU VM's 3600 s, which only delays the save
and exit until near the termination.
"""
import argparse
import os
import time

import tensorflow as tf
from tensorflow.python.distribute.failure_handling import failure_handling_util as gce

import tfcluster

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--step-seconds", type=float, default=0.1, help="extra time each step takes")
args = parser.parse_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    total = tf.Variable(0.0)  # Grows by the number of replicas at every step.
checkpoint = tf.train.Checkpoint(total=total)
on_gpu_vm = tf.distribute.experimental.TerminationConfig(
    termination_watcher_fn=gce.termination_watcher_function_gce, exit_fn=gce.gce_exit_fn, grace_period=0)
handler = tf.distribute.experimental.PreemptionCheckpointHandler(
    strategy.cluster_resolver, checkpoint, os.environ["AIP_CHECKPOINT_DIR"], on_gpu_vm)
print(f"starting at step {handler.total_run_calls}", flush=True)


@tf.function
def train_step():
    def one_replica():
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, 1.0)

    total.assign_add(strategy.experimental_local_results(strategy.run(one_replica))[0])


while handler.total_run_calls < args.steps:
    handler.run(train_step)
    tfcluster.progress(handler.total_run_calls)
    time.sleep(args.step_seconds)
print(f"done at step {handler.total_run_calls}, total {float(total.numpy()):.0f}", flush=True)
