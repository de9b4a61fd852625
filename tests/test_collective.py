"""The bundled trainer's all-reduce: NCCL on GPU workers, TensorFlow's ring on CPU ones, as built.

The strategy is built for real (TensorFlow on this CPU machine); a GPU worker is one whose
``tf.config.list_physical_devices("GPU")`` lists GPUs, here a list of PhysicalDevice records as
TensorFlow returns them on a one-GPU machine. What is asserted is the CommunicationOptions the
strategy holds: that is what TensorFlow turns into the collective's hint ("nccl" or "ring").
"""

from __future__ import annotations

import pytest

from trainer.collective import choose_collective, communication_of, strategy_for
from trainer.flags import parse_args


@pytest.fixture  # TensorFlow, imported once per process (sys.modules); nothing shared between tests.
def tf():
    import tensorflow
    return tensorflow


def _gpus(tf, count: int) -> list:
    return [tf.config.PhysicalDevice(name=f"/physical_device:GPU:{index}", device_type="GPU") for index in range(count)]


def test_gpu_workers_all_reduce_with_nccl_and_cpu_workers_with_the_ring(tf):
    strategy, collective, why = strategy_for(tf, "auto", _gpus(tf, 2))
    assert (collective, why) == ("nccl", "auto: 2 GPUs")
    options = strategy.extended._communication_options
    assert options.implementation == tf.distribute.experimental.CommunicationImplementation.NCCL
    assert communication_of(strategy) == "NCCL"

    strategy, collective, why = strategy_for(tf, "auto", tf.config.list_physical_devices("GPU"))  # This CPU host.
    assert (collective, why) == ("ring", "auto: no GPU")
    assert strategy.extended._communication_options.implementation == \
        tf.distribute.experimental.CommunicationImplementation.RING


def test_the_collective_flag_overrides_the_choice(tf, tmp_path):
    (tmp_path / "manifest.json").write_text("{}")
    assert parse_args(["--data-dir", str(tmp_path)]).collective == "auto"
    assert parse_args(["--data-dir", str(tmp_path), "--collective", "ring"]).collective == "ring"
    strategy, collective, why = strategy_for(tf, "ring", _gpus(tf, 1))
    assert (collective, why, communication_of(strategy)) == ("ring", "as asked", "RING")
    assert choose_collective("nccl", _gpus(tf, 1)) == ("nccl", "as asked")
    with pytest.raises(SystemExit, match="--collective nccl needs GPUs"):
        strategy_for(tf, "nccl", [])
    with pytest.raises(SystemExit):
        parse_args(["--data-dir", str(tmp_path), "--collective", "gloo"])
