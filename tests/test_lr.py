"""The learning rate that follows the global batch (trainer/lr.py): the rule, its defaults, the
warm-up, the decay after it, a resume in the middle of the warm-up, and the flags' mistakes."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO
from trainer import lr


def test_one_replica_trains_at_the_reference_rate_whatever_the_rule():
    for optimizer in lr.OPTIMIZERS:
        for rule in lr.RULES:
            plan = lr.plan(optimizer, 2e-3, rule, replicas=1, batch_size=32, warmup_epochs=None,
                           steps_per_epoch=50)
            assert plan.effective == 2e-3 and plan.warmup_steps == 0  # Nothing to ramp.


def test_three_replicas_scale_by_the_rule_of_the_optimiser():
    adam = lr.plan("adam", 2e-3, None, replicas=3, batch_size=32, warmup_epochs=None, steps_per_epoch=50)
    assert adam.rule == "sqrt" and adam.effective == pytest.approx(2e-3 * math.sqrt(3))
    assert adam.warmup_epochs == 1 and adam.warmup_steps == 50  # The scaled rate is reached after an epoch.
    assert lr.plan("rmsprop", 1e-3, None, 3, 32, None, 50).rule == "sqrt"
    sgd = lr.plan("sgd", 0.1, None, replicas=3, batch_size=32, warmup_epochs=None, steps_per_epoch=50)
    assert sgd.rule == "linear" and sgd.effective == pytest.approx(0.3)
    assert sgd.warmup_epochs == 5 and sgd.warmup_steps == 250  # Goyal et al.: 5 epochs.
    assert ("0.003464 (adam, sqrt: 0.002 at batch 32 x 1 replica, x sqrt(3 replicas); warm-up from 0 over 1 epochs "
            "(50 steps)), constant") == adam.describe()


def test_two_workers_with_four_gpus_each_are_eight_replicas():
    # num_replicas_in_sync on 2 VMs x 4 GPUs is 8: the rule sees replicas, not workers.
    sgd = lr.plan("sgd", 0.1, None, replicas=2 * 4, batch_size=64, warmup_epochs=None, steps_per_epoch=100)
    assert sgd.effective == pytest.approx(0.8) and sgd.warmup_steps == 500
    adam = lr.plan("adam", 1e-3, None, replicas=2 * 4, batch_size=64, warmup_epochs=None, steps_per_epoch=100)
    assert adam.effective == pytest.approx(1e-3 * 2 * math.sqrt(2))


def test_none_keeps_the_reference_rate_and_constant_is_a_plain_float():
    plan = lr.plan("adam", 2e-3, "none", replicas=3, batch_size=32, warmup_epochs=0, steps_per_epoch=50)
    assert plan.effective == 2e-3 and plan.warmup_steps == 0
    # Constant without a warm-up: the plain float Adam got before there was a schedule.
    assert lr.schedule(keras=None, lr_plan=plan) == 2e-3


def test_adaptive_optimisers_warm_up_from_zero_on_request_sgd_from_the_reference():
    for optimizer in ("adam", "adamw", "rmsprop"):
        plan = lr.plan(optimizer, 1e-3, None, replicas=1, batch_size=32, warmup_epochs=2, steps_per_epoch=10)
        assert plan.warmup_start == 0.0 and plan.warmup_steps == 20  # One replica still ramps.
        assert [plan.rate_at(step) for step in (0, 10, 20)] == pytest.approx([0.0, 5e-4, 1e-3])
    sgd = lr.plan("sgd", 0.1, None, replicas=1, batch_size=32, warmup_epochs=2, steps_per_epoch=10)
    assert sgd.warmup_steps == 0  # From the reference to itself: nothing to ramp.
    assert lr.plan("adamw", 1e-3, None, 4, 32, None, 10).rule == "sqrt"


def test_cosine_after_the_warm_up_by_default_and_step_drops_tenfold_twice():
    cosine = lr.plan("sgd", 0.1, None, replicas=4, batch_size=32, warmup_epochs=1, steps_per_epoch=10,
                     schedule="cosine", total_steps=50)
    assert (cosine.warmup_steps, cosine.decay_steps) == (10, 40)
    assert [round(cosine.rate_at(step), 6) for step in (0, 5, 10, 30, 50, 60)] == [0.1, 0.25, 0.4, 0.2, 0.0, 0.0]
    assert cosine.describe().endswith("; warm-up from 0.1 over 1 epochs (10 steps)), then cosine decay to 0 "
                                      "over 40 steps")
    step = lr.plan("adam", 1e-3, None, replicas=1, batch_size=32, warmup_epochs=0, steps_per_epoch=10,
                   schedule="step", total_steps=40)
    assert step.step_boundaries == [20, 30]
    assert [step.rate_at(s) for s in (0, 19, 20, 29, 30, 39)] == pytest.approx([1e-3, 1e-3, 1e-4, 1e-4, 1e-5, 1e-5])
    assert step.describe().endswith(", then x 0.1 at step 20 and step 30")


SCHEDULES = """
import json, os, sys
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import tf_keras as keras
from trainer import lr
plans = [lr.plan("sgd", 0.1, None, 4, 32, 1, 10, "cosine", 50), lr.plan("adam", 1e-3, None, 3, 32, 2, 10, "cosine", 50),
         lr.plan("adamw", 1e-3, None, 2, 32, 1, 10, "step", 40), lr.plan("adam", 1e-3, None, 1, 32, 0, 10, "step", 40),
         lr.plan("sgd", 0.1, None, 2, 32, 2, 10, "constant", 40), lr.plan("rmsprop", 1e-3, None, 1, 32, 0, 10, "cosine", 40)]
steps = [0, 1, 5, 10, 19, 20, 21, 30, 39, 40, 49, 50, 60]
out = []
for plan in plans:
    schedule = lr.schedule(keras, plan)
    out.append([float(schedule(step)) if callable(schedule) else float(schedule) for step in steps])
optimizer = lr.build_optimizer(keras, plans[2], weight_decay=0.01)
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.LayerNormalization()])
optimizer.build(model.trainable_variables)
print(json.dumps({"rates": out, "steps": steps, "type": type(optimizer).__name__, "decay": optimizer.weight_decay,
                  "decayed": sorted(v.name for v in model.trainable_variables if optimizer._use_weight_decay(v))}))
"""


def test_tf_keras_schedules_compute_what_the_plan_says(tmp_path):
    """The schedules the optimiser gets (tf_keras's CosineDecay and PolynomialDecay, our StepDecay)
    give rate_at's rate at every step; AdamW decays the kernels only."""
    result = subprocess.run([sys.executable, "-c", SCHEDULES], cwd=REPO, capture_output=True, text=True,
                            timeout=300, env={"TF_CPP_MIN_LOG_LEVEL": "2", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr[-3000:]
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    plans = [lr.plan("sgd", 0.1, None, 4, 32, 1, 10, "cosine", 50), lr.plan("adam", 1e-3, None, 3, 32, 2, 10, "cosine", 50),
             lr.plan("adamw", 1e-3, None, 2, 32, 1, 10, "step", 40), lr.plan("adam", 1e-3, None, 1, 32, 0, 10, "step", 40),
             lr.plan("sgd", 0.1, None, 2, 32, 2, 10, "constant", 40), lr.plan("rmsprop", 1e-3, None, 1, 32, 0, 10, "cosine", 40)]
    for plan, rates in zip(plans, answer["rates"]):
        assert rates == pytest.approx([plan.rate_at(step) for step in answer["steps"]], rel=1e-5, abs=1e-7), plan
    assert answer["type"] == "AdamW" and answer["decay"] == 0.01
    assert len(answer["decayed"]) == 1 and "kernel" in answer["decayed"][0]  # Not the bias, gamma, beta.


def test_warm_up_ramps_from_the_reference_to_the_scaled_rate():
    plan = lr.plan("sgd", 0.1, "linear", replicas=4, batch_size=32, warmup_epochs=2, steps_per_epoch=10)
    assert plan.warmup_steps == 20
    assert [round(plan.rate_at(step), 6) for step in (0, 10, 20, 500)] == [0.1, 0.25, 0.4, 0.4]


RESUME = """
import json, os, sys
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import numpy as np, tensorflow as tf, tf_keras as keras
from trainer import lr
from trainer.callbacks import backup_callback

backup_dir = sys.argv[1]
# Linear-scaled SGD on 3 replicas: 0.01 -> 0.03 over 2 epochs of 10 steps.
plan = lr.plan("sgd", 0.01, None, replicas=3, batch_size=8, warmup_epochs=2, steps_per_epoch=10)
data = tf.data.Dataset.from_tensor_slices((np.ones((80, 4), "float32"), np.zeros((80, 1), "float32")))
data = data.batch(8).repeat()

class Preempted(Exception):
    pass

class Record(keras.callbacks.Callback):
    def __init__(self, name, crash_after=None):
        super().__init__()
        self.name, self.crash_after = name, crash_after

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        print(json.dumps({"attempt": self.name, "steps_done": step,
                          "rate": lr.current_rate(self.model.optimizer)}), flush=True)
        if step == self.crash_after:
            raise Preempted()

for name, crash_after in (("first", 17), ("resumed", None)):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=lr.build_optimizer(keras, plan), loss="mse")
    callbacks = [backup_callback(keras, backup_dir, 5, 10, on_gpu=False), Record(name, crash_after)]
    try:
        model.fit(data, epochs=3, steps_per_epoch=10, callbacks=callbacks, verbose=0)
    except Preempted:
        pass
"""


def test_resume_in_the_middle_of_the_warm_up_keeps_the_rate(tmp_path):
    """The warm-up is a schedule of the optimiser's step, which BackupAndRestore restores: the first
    step after a resume runs at the rate the interrupted run had reached, not at the start rate."""
    result = subprocess.run([sys.executable, "-c", RESUME, str(tmp_path / "backup")], cwd=REPO,
                            capture_output=True, text=True, timeout=300,
                            env={"TF_CPP_MIN_LOG_LEVEL": "2", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    first = {line["steps_done"]: line["rate"] for line in lines if line["attempt"] == "first"}
    resumed = [line for line in lines if line["attempt"] == "resumed"]
    plan = lr.plan("sgd", 0.01, None, 3, 8, 2, 10)
    # The first attempt ramps as planned (the step that made steps_done = n ran at rate_at(n - 1)).
    for done, rate in first.items():
        assert rate == pytest.approx(plan.rate_at(done - 1), rel=1e-5)
    # Backed up after step 15, interrupted after 17: the resumed run's first step is the 16th, at
    # the 16th step's rate (0.025), in the middle of the warm-up.
    assert resumed[0]["steps_done"] == 16
    assert resumed[0]["rate"] == pytest.approx(first[16], rel=1e-6) == pytest.approx(0.025, rel=1e-5)
    assert resumed[-1]["steps_done"] == 30 and resumed[-1]["rate"] == pytest.approx(0.03, rel=1e-5)


@pytest.mark.parametrize("flags, named", [
    (["--lr-scaling", "cubic"], "argument --lr-scaling: invalid choice: 'cubic' (choose from 'linear', 'sqrt', 'none')"),
    (["--optimizer", "adagrad"], "argument --optimizer: invalid choice: 'adagrad' (choose from 'adam', 'adamw', "
                                 "'rmsprop', 'sgd')"),
    (["--lr-schedule", "linear"], "argument --lr-schedule: invalid choice: 'linear' (choose from 'cosine', 'step', "
                                  "'constant')"),
    (["--precision", "float16"], "argument --precision: invalid choice: 'float16' (choose from 'auto', 'float32', "
                                 "'mixed_float16', 'mixed_bfloat16')"),
    (["--weight-decay", "0.1"], "--weight-decay goes with --optimizer adamw (got --optimizer adam)"),
    (["--warmup-epochs", "-1"], "argument --warmup-epochs: must be >= 0 (got -1.0)"),
])
def test_a_wrong_flag_is_one_error_line_naming_the_valid_values(tmp_path, flags, named):
    (tmp_path / "manifest.json").write_text("{}")
    result = subprocess.run([sys.executable, "-m", "trainer.task", "--data-dir", str(tmp_path), *flags],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == f"trainer.task: error: {named}"
    assert "Traceback" not in result.stderr


def test_tunes_best_trial_command_reproduces_the_searched_reference_rate(tmp_path):
    """A trial trains on one replica at its batch: the rate it found is the trainer's reference rate.
    The best trial's command gives it back exactly, and `train` on one replica trains at it."""
    from tfcluster.commands.tune_loop import _train_command
    from tfcluster.commands.tune_plans import Trial

    searched = 0.0031234567891234567
    trial = Trial("03", "tuner0", "COMPLETED", 0.9,
                  {"learning_rate": searched, "batch_size": 32, "width": 16, "depth": 3, "dropout": 0.2})
    command = _train_command(trial)
    assert command.startswith("invoke train -- ") and command.endswith("--dropout 0.2")
    (tmp_path / "manifest.json").write_text("{}")
    parse = ("import sys; from trainer.task import parse_args; "
             "a = parse_args(sys.argv[1:]); print(repr(a.learning_rate), a.batch_size)")
    result = subprocess.run([sys.executable, "-c", parse, "--data-dir", str(tmp_path),
                             *command.split(" -- ", 1)[1].split()], cwd=REPO, capture_output=True, text=True)
    rate, batch = result.stdout.split()
    assert float(rate) == searched and batch == "32"
    assert lr.plan("adam", float(rate), None, 1, int(batch), None, 10).effective == searched


def test_auto_precision_follows_the_compute_capability_of_every_gpu():
    from trainer.model import choose_precision

    assert choose_precision("auto", []) == ("float32", "auto: no GPU")
    assert choose_precision("auto", [(8, 0), (8, 0)])[0] == "mixed_bfloat16"  # A100.
    assert choose_precision("auto", [(9, 0)])[0] == "mixed_bfloat16"  # H100.
    assert choose_precision("auto", [(8, 9)])[0] == "mixed_bfloat16"  # L4.
    assert choose_precision("auto", [(7, 5)]) == ("mixed_float16", "auto: compute capability 7.5")  # T4.
    assert choose_precision("auto", [(7, 0)])[0] == "mixed_float16"  # V100.
    assert choose_precision("auto", [(6, 0)])[0] == "float32"  # P100: no tensor cores.
    assert choose_precision("auto", [(8, 0), (7, 5)])[0] == "mixed_float16"  # The slowest GPU decides.
    assert choose_precision("mixed_bfloat16", []) == ("mixed_bfloat16", "as asked")
