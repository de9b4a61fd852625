"""tfcluster: run a TensorFlow MultiWorkerMirroredStrategy job on a cluster and clean up after it.

Layers, each importing only those below it: commands (what a user does) → launch (the shared
run loop) and backends (where machines come from) → state, config, errors, tfconfig, ui.
tests/test_layout.py enforces it.

On the workers this file is also the script helper, staged beside a ``--script`` on every backend
(so ``import tfcluster`` works there): ``tfcluster.progress(step)`` tells the launcher (and the VM
watchdog) that training advanced, so its stall limit follows steps rather than output lines
(tfcluster/stall.py); ``tfcluster.scaled_learning_rate(base, optimizer)`` applies the bundled
trainer's learning-rate rule. It imports only the standard library, because the workers have
nothing else of tfcluster."""

import json as _json
import math as _math
import os as _os
import sys as _sys
import time as _time

__version__ = "0.1.0"


def progress(step: int, total=None) -> None:
    """Report that training reached global ``step`` (call it every step or every few; it prints one
    line, the protocol of trainer/events.py); ``total``, the run's steps, lets `train --budget`
    project its cost."""
    record = {"event": "progress", "step": int(step), "time": round(_time.time(), 3)}
    if total:
        record["total"] = int(total)
    _sys.stdout.write("TFCLUSTER_EVENT " + _json.dumps(record, sort_keys=True) + "\n")
    _sys.stdout.flush()


# The bundled trainer's rule (trainer/lr.py, which does not import tfcluster: the two are kept equal
# by tests/test_scripts.py): the rate follows the replicas in sync linearly for SGD, by their square
# root for the adaptive optimisers.
_DEFAULT_RULE = {"adam": "sqrt", "adamw": "sqrt", "rmsprop": "sqrt", "sgd": "linear"}


def replica_count() -> int:
    """Replicas in sync as the launcher counts them: ``TFCLUSTER_REPLICAS``, each worker's environment
    (workers x GPUs per VM on gcp, one per worker on local and own hosts); 1 outside a run."""
    return int(_os.environ.get("TFCLUSTER_REPLICAS", "1"))


def scaled_learning_rate(base: float, optimizer: str = "adam", replicas: int | None = None,
                         rule: str | None = None) -> float:
    """``base``, the rate that suits one replica at your per-replica batch, scaled to the global batch
    as `invoke train`'s bundled trainer does: x replicas for ``sgd`` (Goyal et al. 2017), x
    sqrt(replicas) for ``adam``, ``adamw`` and ``rmsprop`` (the square-root heuristic); ``rule``
    ("linear", "sqrt", "none") overrides. ``replicas``: pass ``strategy.num_replicas_in_sync`` when
    you have the strategy (it counts every GPU); the default is ``TFCLUSTER_REPLICAS``."""
    count = replica_count() if replicas is None else int(replicas)
    chosen = rule or _DEFAULT_RULE.get(optimizer)
    if chosen not in ("linear", "sqrt", "none") or count < 1:
        raise ValueError(f"scaled_learning_rate: optimizer one of {', '.join(_DEFAULT_RULE)} or rule one of "
                         f"linear, sqrt, none, and replicas >= 1 (got {optimizer!r}, {rule!r}, {count})")
    return base * {"linear": count, "sqrt": _math.sqrt(count), "none": 1.0}[chosen]
