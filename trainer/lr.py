"""The learning rate that follows the global batch: the scaling rule and its warm-up.

``--learning-rate`` is the rate for the *reference batch*, ``--batch-size`` on one replica (what
``invoke tune`` trains a trial with). With R replicas in sync the global batch is R times that,
and the effective rate follows it:

- ``linear``: rate x R. Goyal et al. 2017, "Accurate, Large Minibatch SGD: Training ImageNet in
  1 Hour" (arXiv:1706.02677), for SGD with momentum, with a gradual warm-up from the reference
  rate to the scaled one over the first 5 epochs (their section 2.2).
- ``sqrt``: rate x sqrt(R). Malladi et al. 2022, "On the SDEs and Scaling Rules for Adaptive
  Gradient Algorithms" (NeurIPS 2022, arXiv:2205.10287): the square-root rule keeps Adam's and
  RMSprop's dynamics when the batch grows.
- ``none``: the reference rate whatever the batch (the trainer's behaviour before this rule).

The warm-up is a ``LearningRateSchedule`` of the optimiser's own step counter, which
BackupAndRestore saves with the optimiser: a resumed run continues at the rate it had reached.
It is tf_keras's built-in ``PolynomialDecay`` with power 1 rising from the reference rate to the
effective one (decay towards a larger end value is a linear ramp, then flat), so a saved model
loads anywhere without a custom class.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

OPTIMIZERS = ("adam", "rmsprop", "sgd")
RULES = ("linear", "sqrt", "none")
# The rule each optimiser gets unless --lr-scaling says otherwise (see the module docstring).
DEFAULT_RULE = {"adam": "sqrt", "rmsprop": "sqrt", "sgd": "linear"}
# Warm-up epochs unless --warmup-epochs says otherwise: Goyal et al.'s 5 for linear-scaled SGD;
# none for the adaptive optimisers, whose sqrt rule changes the rate far less.
DEFAULT_WARMUP_EPOCHS = {"adam": 0, "rmsprop": 0, "sgd": 5}
# SGD "with momentum", as Goyal et al. train it.
SGD_MOMENTUM = 0.9


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
    # Epochs over which the rate rises from the reference to the effective rate (0 = none).
    warmup_epochs: float
    # Training steps per epoch, to turn warm-up epochs into optimiser steps.
    steps_per_epoch: int

    @property
    def factor(self) -> float:
        return scale_factor(self.rule, self.replicas)

    @property
    def effective(self) -> float:
        """The rate after the warm-up, at the global batch."""
        return self.reference * self.factor

    @property
    def warmup_steps(self) -> int:
        """Optimiser steps of the warm-up; 0 when there is none or nothing to ramp."""
        if self.factor == 1.0 or self.warmup_epochs <= 0:
            return 0
        return max(1, round(self.warmup_epochs * self.steps_per_epoch))

    def rate_at(self, step: int) -> float:
        """The rate the optimiser uses at its step ``step`` (0-based), as the schedule computes it."""
        if not self.warmup_steps or step >= self.warmup_steps:
            return self.effective
        return self.reference + (self.effective - self.reference) * step / self.warmup_steps

    def describe(self) -> str:
        """The rate for the run's header and summary, e.g. "0.003464 (adam, sqrt: 0.002 at batch 32 x 1
        replica, x sqrt(3 replicas))"."""
        replicas = f"{self.replicas} replica{'s' if self.replicas > 1 else ''}"
        formula = {"linear": f"x {replicas}", "sqrt": f"x sqrt({replicas})", "none": f"not scaled to {replicas}"}
        text = (f"{self.effective:.4g} ({self.optimizer}, {self.rule}: {self.reference:.4g} at batch "
                f"{self.batch_size} x 1 replica, {formula[self.rule]}")
        if self.warmup_steps:
            text += f"; warm-up from {self.reference:.4g} over {self.warmup_epochs:g} epochs ({self.warmup_steps} steps)"
        return text + ")"

    def as_event(self) -> dict:
        return {"optimizer": self.optimizer, "reference": self.reference, "rule": self.rule,
                "replicas": self.replicas, "factor": self.factor, "effective": self.effective,
                "warmup_epochs": self.warmup_epochs, "warmup_steps": self.warmup_steps}


def plan(optimizer: str, reference: float, rule: str | None, replicas: int, batch_size: int,
         warmup_epochs: float | None, steps_per_epoch: int) -> LearningRatePlan:
    """The plan with each optimiser's defaults for what is None."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; use one of: {', '.join(OPTIMIZERS)}")
    return LearningRatePlan(
        optimizer=optimizer, reference=reference, rule=rule or DEFAULT_RULE[optimizer], replicas=replicas,
        batch_size=batch_size, steps_per_epoch=steps_per_epoch,
        warmup_epochs=DEFAULT_WARMUP_EPOCHS[optimizer] if warmup_epochs is None else warmup_epochs)


def schedule(keras, lr_plan: LearningRatePlan):
    """What the optimiser gets as its learning rate: a float, or the warm-up schedule of its step."""
    if not lr_plan.warmup_steps:
        return lr_plan.effective
    return keras.optimizers.schedules.PolynomialDecay(
        initial_learning_rate=lr_plan.reference, decay_steps=lr_plan.warmup_steps,
        end_learning_rate=lr_plan.effective, power=1.0)


def build_optimizer(keras, lr_plan: LearningRatePlan):
    """The tf_keras optimiser of ``lr_plan`` (call inside strategy.scope())."""
    rate = schedule(keras, lr_plan)
    if lr_plan.optimizer == "adam":
        return keras.optimizers.Adam(rate)
    if lr_plan.optimizer == "rmsprop":
        return keras.optimizers.RMSprop(rate)
    return keras.optimizers.SGD(rate, momentum=SGD_MOMENTUM)


def current_rate(optimizer) -> float:
    """The rate of the optimiser's last step. tf_keras keeps it in a variable that ``learning_rate``
    returns when the rate is a schedule (set to schedule(iterations) at each step)."""
    return float(optimizer.learning_rate.numpy())
