"""tfcluster: run a TensorFlow MultiWorkerMirroredStrategy job on a cluster and clean up after it.

Layers, each importing only those below it: commands (what a user does) → launch (the shared
run loop) and backends (where machines come from) → state, config, errors, tfconfig, ui.
tests/test_layout.py enforces it."""

__version__ = "0.1.0"
