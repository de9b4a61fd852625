"""Which all-reduce the trainer's MultiWorkerMirroredStrategy uses (``--collective``).

TensorFlow's default, ``CommunicationImplementation.AUTO``, never picks NCCL in TF 2.21: the hint
reaches ``collective_param_resolver_local.cc`` (``AssignCollectiveType``) as ``"auto"``, and only
``"nccl"`` selects ``NcclReduce``; everything else is ``RingReduce``, TensorFlow's own ring over gRPC
between workers. TensorFlow's ``CommunicationOptions`` says "NCCL is generally more performant for
GPU, but doesn't work for CPU" (``tensorflow/python/distribute/collective_util.py``). So the
trainer asks for one explicitly: NCCL when this worker has GPUs, RING when it has none.
"""

from __future__ import annotations

COLLECTIVES = ("auto", "nccl", "ring")


def choose_collective(requested: str, gpus: list) -> tuple[str, str]:
    """("nccl" or "ring", why) for ``--collective requested`` on a worker with these GPUs
    (``tf.config.list_physical_devices("GPU")``; empty on CPU)."""
    if requested != "auto":
        return requested, "as asked"
    if gpus:
        return "nccl", f"auto: {len(gpus)} GPU{'s' if len(gpus) > 1 else ''}"
    return "ring", "auto: no GPU"


def build_strategy(tf, collective: str):
    """The strategy, built with ``collective``'s CommunicationOptions (it must come first: no other
    TensorFlow op may run before MultiWorkerMirroredStrategy is created)."""
    implementation = getattr(tf.distribute.experimental.CommunicationImplementation, collective.upper())
    options = tf.distribute.experimental.CommunicationOptions(implementation=implementation)
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def strategy_for(tf, requested: str, gpus: list):
    """(strategy, collective, why) for this worker's GPUs."""
    collective, why = choose_collective(requested, gpus)
    if collective == "nccl" and not gpus:
        raise SystemExit("trainer.task: error: --collective nccl needs GPUs: NCCL \"doesn't work for CPU\" "
                         "(TensorFlow's CommunicationOptions); use --collective ring or auto on CPU workers")
    return build_strategy(tf, collective), collective, why


def communication_of(strategy) -> str:
    """The implementation the strategy was built with ("NCCL", "RING", "AUTO"), as TensorFlow logs it."""
    return strategy.extended._communication_options.implementation.value
