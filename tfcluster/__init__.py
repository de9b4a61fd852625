"""tfcluster: run a TensorFlow MultiWorkerMirroredStrategy job on a cluster and clean up after it."""

__version__ = "0.1.0"
