"""Put on every worker's PYTHONPATH by the launcher: SIGUSR1 makes the worker write every
thread's Python stack into its log (stderr), which is how a stalled run shows where it waits
(tfcluster/stall.py). Python imports ``sitecustomize`` at start-up, so user scripts get it
unchanged. A sitecustomize further down sys.path (a distribution's own) still runs."""

import faulthandler
import importlib.util
import os
import signal
import sys

if hasattr(signal, "SIGUSR1"):
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True, chain=False)


def _chain() -> None:
    """Run the next sitecustomize on sys.path, the one ours shadows."""
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_tfcluster_next_sitecustomize", candidate)
            if spec and spec.loader:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


_chain()
