"""The learning rate that follows the global batch: the scaling rule, its warm-up and the decay after.

``--learning-rate`` is the rate for the *reference batch*, ``--batch-size`` on one replica (what
``invoke tune`` trains a trial with). With R replicas in sync the global batch is R times that,
and the effective rate follows it:

- ``linear``: rate x R. Goyal et al. 2017, "Accurate, Large Minibatch SGD: Training ImageNet in
  1 Hour" (arXiv:1706.02677), for SGD with momentum, with a gradual warm-up from the reference
  rate to the scaled one over the first 5 epochs (their section 2.2).
- ``sqrt``: rate x sqrt(R), for Adam, AdamW and RMSprop: the square-root heuristic of Krizhevsky
  2014 ("One weird trick for parallelizing convolutional neural networks", arXiv:1404.5997, sec. 5)
  and Hoffer et al. 2017 ("Train longer, generalize better", arXiv:1705.08741), which keeps the
  gradient noise of the larger batch. Only the rate is scaled: Malladi et al. 2022's square-root
  rule for adaptive methods (arXiv:2205.10287) also rescales Adam's beta1, beta2 and epsilon, which
  this trainer leaves at their defaults.
- ``none``: the reference rate whatever the batch.

Over the run (``--lr-schedule``), after an optional warm-up:

- ``cosine`` (the default): from the effective rate down to 0 at the last step (Loshchilov &
  Hutter 2017, "SGDR", arXiv:1608.03983), tf_keras's ``CosineDecay``.
- ``step``: x 0.1 at 50 % and again at 75 % of the steps after the warm-up (He et al. 2016's
  CIFAR-10 schedule, "Deep Residual Learning", arXiv:1512.03385, sec. 4.2).
- ``constant``: the effective rate to the end.

The warm-up (``--warmup-epochs``) ramps linearly: for SGD from the reference rate to the effective
one (Goyal et al.'s gradual warm-up, 5 epochs by default); for the adaptive optimisers
from 0, one epoch by default with 2+ replicas (the usual warm-up of Adam, whose first steps' variance estimates are poor: Liu et al. 2020,
"On the Variance of the Adaptive Learning Rate and Beyond", arXiv:1908.03265).

Every schedule is a ``LearningRateSchedule`` of the optimiser's own step counter, which
BackupAndRestore saves with the optimiser: a resumed run continues at the rate it had reached.
``constant`` and ``cosine`` are tf_keras's built-in ``PolynomialDecay`` (power 1 towards a larger
end value: a linear ramp, then flat) and ``CosineDecay`` (which has the warm-up), so a saved model
loads anywhere; ``step`` is ``StepDecay`` below, registered as ``tfcluster>StepDecay`` (load a
model.keras trained with it after ``import trainer.lr``, or with ``compile=False``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

OPTIMIZERS = ("adam", "adamw", "rmsprop", "sgd")
RULES = ("linear", "sqrt", "none")
SCHEDULES = ("cosine", "step", "constant")
# The rule each optimiser gets unless --lr-scaling says otherwise (see the module docstring).
DEFAULT_RULE = {"adam": "sqrt", "adamw": "sqrt", "rmsprop": "sqrt", "sgd": "linear"}
# Warm-up epochs unless --warmup-epochs says otherwise: Goyal et al.'s 5 for linear-scaled SGD; one
# for the adaptive optimisers when the rate is scaled up (2+ replicas): without it the quick start's
# Adam at sqrt(3) x its rate ended at 0.47-0.50 validation accuracy, with it above 0.70
# (docs/benchmarks.md). One replica trains at the reference rate from its first step.
DEFAULT_WARMUP_EPOCHS = {"adam": 1, "adamw": 1, "rmsprop": 1, "sgd": 5}
# Where the warm-up starts: SGD from the reference rate (Goyal et al.), the adaptive ones from 0.
WARMUP_FROM_REFERENCE = ("sgd",)
# SGD "with momentum", as Goyal et al. train it.
SGD_MOMENTUM = 0.9
# AdamW's decoupled weight decay unless --weight-decay says otherwise: tf_keras's own default.
# Biases and normalisation scales and offsets are not decayed (Loshchilov & Hutter 2019's AdamW
# decays weights; decaying them is the usual exclusion).
DEFAULT_WEIGHT_DECAY = 0.004
NO_DECAY = ("bias", "gamma", "beta")
# step: the rate is multiplied by STEP_FACTOR at each of these fractions of the steps after the warm-up.
STEP_AT = (0.5, 0.75)
STEP_FACTOR = 0.1


def scale_factor(rule: str, replicas: int) -> float:
    """How much larger than the reference rate the effective rate is with ``replicas`` in sync."""
    if rule not in RULES:
        raise ValueError(f"unknown learning-rate scaling {rule!r}; use one of: {', '.join(RULES)}")
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1 (got {replicas})")
    return {"linear": float(replicas), "sqrt": math.sqrt(replicas), "none": 1.0}[rule]


@dataclass(frozen=True)
class LearningRatePlan:
    """The learning rate of one run, as the header and the events report it."""

    # Optimiser name, one of OPTIMIZERS.
    optimizer: str
    # Rate for the reference batch: the per-replica batch on one replica (--learning-rate).
    reference: float
    # Scaling rule, one of RULES.
    rule: str
    # Replicas in sync (workers x devices per worker).
    replicas: int
    # Per-replica batch (--batch-size); the global batch is this x replicas.
    batch_size: int
    # Epochs over which the rate rises to the effective rate (0 = none).
    warmup_epochs: float
    # Training steps per epoch, to turn warm-up epochs into optimiser steps.
    steps_per_epoch: int
    # What follows the warm-up, one of SCHEDULES.
    schedule: str = "constant"
    # Optimiser steps of the whole run (epochs x steps per epoch): where cosine reaches 0.
    total_steps: int = 0

    @property
    def factor(self) -> float:
        return scale_factor(self.rule, self.replicas)

    @property
    def effective(self) -> float:
        """The rate after the warm-up, at the global batch."""
        return self.reference * self.factor

    @property
    def warmup_start(self) -> float:
        """The rate of the warm-up's first step."""
        return self.reference if self.optimizer in WARMUP_FROM_REFERENCE else 0.0

    @property
    def warmup_steps(self) -> int:
        """Optimiser steps of the warm-up; 0 when there is none or nothing to ramp."""
        if self.warmup_epochs <= 0 or self.warmup_start == self.effective:
            return 0
        return max(1, round(self.warmup_epochs * self.steps_per_epoch))

    @property
    def decay_steps(self) -> int:
        """Steps from the end of the warm-up to the run's last (at least 1)."""
        return max(1, self.total_steps - self.warmup_steps)

    def rate_at(self, step: int) -> float:
        """The rate the optimiser uses at its step ``step`` (0-based), as the schedule computes it."""
        if step < self.warmup_steps:
            return self.warmup_start + (self.effective - self.warmup_start) * step / self.warmup_steps
        after = min(step - self.warmup_steps, self.decay_steps)
        if self.schedule == "cosine":
            return self.effective * 0.5 * (1 + math.cos(math.pi * after / self.decay_steps))
        if self.schedule == "step":
            return self.effective * STEP_FACTOR ** sum(after >= at for at in self.step_boundaries)
        return self.effective

    @property
    def step_boundaries(self) -> list[int]:
        """step: the steps after the warm-up at which the rate drops."""
        return [round(at * self.decay_steps) for at in STEP_AT]

    def describe(self) -> str:
        """The rate for the run's header and summary, e.g. "0.003464 (adam, sqrt: 0.002 at batch 32 x 1
        replica, x sqrt(3 replicas)), then cosine decay to 0 over 300 steps"."""
        replicas = f"{self.replicas} replica{'s' if self.replicas > 1 else ''}"
        formula = {"linear": f"x {replicas}", "sqrt": f"x sqrt({replicas})", "none": f"not scaled to {replicas}"}
        text = (f"{self.effective:.4g} ({self.optimizer}, {self.rule}: {self.reference:.4g} at batch "
                f"{self.batch_size} x 1 replica, {formula[self.rule]}")
        if self.warmup_steps:
            text += (f"; warm-up from {self.warmup_start:.4g} over {self.warmup_epochs:g} epochs "
                     f"({self.warmup_steps} steps)")
        text += ")"
        if self.schedule == "cosine":
            return text + f", then cosine decay to 0 over {self.decay_steps} steps"
        if self.schedule == "step":
            drops = " and ".join(f"step {self.warmup_steps + at}" for at in self.step_boundaries)
            return text + f", then x {STEP_FACTOR:g} at {drops}"
        return text + ", constant"

    def as_event(self) -> dict:
        return {"optimizer": self.optimizer, "reference": self.reference, "rule": self.rule,
                "replicas": self.replicas, "factor": self.factor, "effective": self.effective,
                "warmup_epochs": self.warmup_epochs, "warmup_steps": self.warmup_steps,
                "warmup_start": self.warmup_start, "schedule": self.schedule, "total_steps": self.total_steps,
                "decay_steps": self.decay_steps}


def plan(optimizer: str, reference: float, rule: str | None, replicas: int, batch_size: int,
         warmup_epochs: float | None, steps_per_epoch: int, schedule: str = "constant",
         total_steps: int = 0) -> LearningRatePlan:
    """The plan with each optimiser's defaults for what is None."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; use one of: {', '.join(OPTIMIZERS)}")
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown learning-rate schedule {schedule!r}; use one of: {', '.join(SCHEDULES)}")
    return LearningRatePlan(
        optimizer=optimizer, reference=reference, rule=rule or DEFAULT_RULE[optimizer], replicas=replicas,
        batch_size=batch_size, steps_per_epoch=steps_per_epoch, schedule=schedule, total_steps=total_steps,
        warmup_epochs=default_warmup_epochs(optimizer, replicas) if warmup_epochs is None else warmup_epochs)


def default_warmup_epochs(optimizer: str, replicas: int) -> float:
    """The warm-up without --warmup-epochs: SGD's always; an adaptive optimiser's only when its rate is
    scaled past the reference (2+ replicas in sync)."""
    if optimizer in WARMUP_FROM_REFERENCE or replicas > 1:
        return DEFAULT_WARMUP_EPOCHS[optimizer]
    return 0


def schedule(keras, lr_plan: LearningRatePlan):
    """What the optimiser gets as its learning rate: a float, or a schedule of its step."""
    warmup = lr_plan.warmup_steps
    if lr_plan.schedule == "cosine":
        return keras.optimizers.schedules.CosineDecay(
            initial_learning_rate=lr_plan.warmup_start if warmup else lr_plan.effective,
            decay_steps=lr_plan.decay_steps, alpha=0.0,
            warmup_target=lr_plan.effective if warmup else None, warmup_steps=warmup)
    if lr_plan.schedule == "step":
        return step_decay_class(keras)(lr_plan.warmup_start, lr_plan.effective, warmup,
                                       [warmup + at for at in lr_plan.step_boundaries], STEP_FACTOR)
    if not warmup:
        return lr_plan.effective
    return keras.optimizers.schedules.PolynomialDecay(
        initial_learning_rate=lr_plan.warmup_start, decay_steps=warmup,
        end_learning_rate=lr_plan.effective, power=1.0)


_STEP_DECAY = {}


def step_decay_class(keras):
    """tf_keras's LearningRateSchedule for ``step``: a linear warm-up, then the rate times ``factor``
    at each boundary (global optimiser steps). Made once per keras module, registered for loading."""
    if keras not in _STEP_DECAY:
        import tensorflow as tf

        @keras.saving.register_keras_serializable(package="tfcluster")
        class StepDecay(keras.optimizers.schedules.LearningRateSchedule):
            def __init__(self, start, peak, warmup_steps, boundaries, factor):
                super().__init__()
                self.start, self.peak, self.warmup_steps = start, peak, warmup_steps
                self.boundaries, self.factor = list(boundaries), factor

            def __call__(self, step):
                step = tf.cast(step, tf.float32)
                drops = tf.add_n([tf.cast(step >= at, tf.float32) for at in self.boundaries] or [0.0])
                decayed = self.peak * tf.pow(tf.constant(self.factor, tf.float32), drops)
                if not self.warmup_steps:
                    return decayed
                ramp = self.start + (self.peak - self.start) * step / self.warmup_steps
                return tf.where(step < self.warmup_steps, ramp, decayed)

            def get_config(self):
                return {"start": self.start, "peak": self.peak, "warmup_steps": self.warmup_steps,
                        "boundaries": self.boundaries, "factor": self.factor}

        _STEP_DECAY[keras] = StepDecay
    return _STEP_DECAY[keras]


def build_optimizer(keras, lr_plan: LearningRatePlan, weight_decay: float | None = None):
    """The tf_keras optimiser of ``lr_plan`` (call inside strategy.scope())."""
    rate = schedule(keras, lr_plan)
    if lr_plan.optimizer == "adam":
        return keras.optimizers.Adam(rate)
    if lr_plan.optimizer == "adamw":
        optimizer = keras.optimizers.AdamW(rate, weight_decay=DEFAULT_WEIGHT_DECAY if weight_decay is None
                                           else weight_decay)
        optimizer.exclude_from_weight_decay(var_names=list(NO_DECAY))
        return optimizer
    if lr_plan.optimizer == "rmsprop":
        return keras.optimizers.RMSprop(rate)
    return keras.optimizers.SGD(rate, momentum=SGD_MOMENTUM)


def current_rate(optimizer) -> float:
    """The rate of the optimiser's last step. tf_keras keeps it in a variable that ``learning_rate``
    returns when the rate is a schedule (set to schedule(iterations) at each step)."""
    return float(optimizer.learning_rate.numpy())
