"""tfcluster: run a TensorFlow MultiWorkerMirroredStrategy job on a cluster and clean up after it.

Layers, each importing only those below it: commands (what a user does) → launch (the shared
run loop) and backends (where machines come from) → state, config, errors, tfconfig, ui.
tests/test_layout.py enforces it.

On the workers this file is also the script helper: ``tfcluster.progress(step)`` tells the
launcher (and the VM watchdog) that training advanced, so its stall limit follows steps rather
than output lines (tfcluster/stall.py). It imports only the standard library, because the
workers have nothing else of tfcluster."""

import json as _json
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
