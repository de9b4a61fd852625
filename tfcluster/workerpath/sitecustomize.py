"""Put on every worker's PYTHONPATH by the launcher: SIGUSR1 makes the worker write every
thread's Python stack into its log (stderr), which is how a stalled run shows where it waits
(tfcluster/stall.py), and TensorFlow's line naming the strategy's all-reduce is logged
(tfcluster/collective.py). Python imports ``sitecustomize`` at start-up, so user scripts get it
unchanged. A sitecustomize further down sys.path (a distribution's own) still runs."""

import faulthandler
import importlib.util
import os
import signal
import sys

if hasattr(signal, "SIGUSR1"):
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True, chain=False)


def _strategy_line() -> None:
    """TensorFlow logs which all-reduce a MultiWorkerMirroredStrategy uses at INFO
    ("... local_devices = (...), communication = CommunicationImplementation.AUTO"), and a script's
    ``tensorflow`` logger drops INFO (tf_logging.get_logger: WARNING unless interactive). The logger is
    raised to INFO for that one line; every other record passes as it did (the root logger's level
    decides). A script that sets the logger's level itself gets exactly what it asked for."""
    import logging

    logger = logging.getLogger("tensorflow")
    if logger.level != logging.NOTSET:
        return
    root = logging.getLogger()

    def keep(record) -> bool:
        return record.levelno >= root.getEffectiveLevel() or "MultiWorkerMirroredStrategy with" in str(record.msg)

    def set_level(level) -> None:
        logger.removeFilter(keep)
        del logger.setLevel  # The class's own method again.
        logger.setLevel(level)

    logger.setLevel(logging.INFO)
    logger.addFilter(keep)
    logger.setLevel = set_level


_strategy_line()


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
