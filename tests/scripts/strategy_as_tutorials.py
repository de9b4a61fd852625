"""A script as TensorFlow's tutorials write it: MultiWorkerMirroredStrategy() with TensorFlow's default
logging; ``--nccl`` builds it with NCCL, as the warning's fix says."""
import os
import sys

import tensorflow as tf

if "--nccl" in sys.argv:
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.NCCL)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
else:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
print(f"replicas in sync: {strategy.num_replicas_in_sync}, NCCL_DEBUG={os.environ.get('NCCL_DEBUG')} "
      f"NCCL_DEBUG_SUBSYS={os.environ.get('NCCL_DEBUG_SUBSYS')}", flush=True)
