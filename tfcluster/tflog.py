"""TensorFlow's own output in a worker's log: which lines are start-up noise, what they say about
the devices, and which known failures a log shows.

Only the live console uses this; the log files and `invoke logs` always keep every line.
The patterns were taken from real TF 2.21 workers on a CPU-only machine (see tests/test_console.py);
the GPU and older-release patterns cite the TensorFlow/XLA source file that prints them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tfcluster.nccl import is_nccl_line

# absl/TF C++ log line: severity, MMDD, time, thread id, file:line] message. Before absl is
# initialised the time is "00:00:<epoch seconds>":
# "I0000 00:00:1795357008.749365    9100 port.cc:153] oneDNN custom operations are on. ..."
CPP_LINE = re.compile(r"^(?P<severity>[IWEF])\d{4} [\d:.]+\s+\d+ (?P<source>[\w.-]+):\d+\] (?P<message>.*)$")

# Printed by absl itself before TF initialises logging (TF 2.21 prints it twice per process).
ABSL_PREAMBLE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"

# Error-level lines that are benign on a machine without a GPU, or in every process of some releases.
BENIGN_ERRORS = (
    "failed call to cuInit",  # xla/stream_executor/cuda/cuda_platform.cc: no NVIDIA driver/GPU (TF 2.21).
    "Unable to register cuDNN factory",  # xla/stream_executor/cuda/cuda_dnn.cc (TF 2.15-2.17).
    "Unable to register cuFFT factory",  # xla/stream_executor/cuda/cuda_fft.cc (TF 2.15-2.17).
    "Unable to register cuBLAS factory",  # xla/stream_executor/cuda/cuda_blas.cc (TF 2.15-2.17).
    "computation placer already registered",  # xla/service/computation_placer.cc (TF 2.18-2.19).
)

# Warning-level lines known to be harmless; any other C++ warning is shown.
BENIGN_WARNINGS = (
    "will not be optimized because the dataset does not implement the AsGraphDefInternal",  # dataset.cc
    "TF-TRT Warning: Could not find TensorRT",  # tensorflow/compiler/tf2tensorrt (GPU images without TensorRT).
)

# TensorFlow's Python INFO records (Python's BASIC_FORMAT): the workers' sitecustomize lets the strategy's
# line through (tfcluster/collective.py reads it); a script that raised the logger itself gets more.
PYTHON_INFO = "INFO:tensorflow:"

# Lines without a header that continue the C++ record above them.
CONTINUATIONS = (
    re.compile(r"^To enable the following instructions: .*rebuild TensorFlow"),  # cpu_feature_guard.cc
    re.compile(r"^/job:[\w-]+/replica:\d+/task:\d+$"),  # coordination_service.cc "Example stragglers:"
)

NO_GPU = ("Could not find cuda drivers on your machine", "failed call to cuInit")
# common_runtime/gpu/gpu_device.cc: "Created device /job:.../device:GPU:0 with 13949 MB memory:  ->
# device: 0, name: Tesla T4, pci bus id: 0000:00:04.0, compute capability: 7.5"
GPU_CREATED = re.compile(r"Created device \S*GPU:(?P<index>\d+) .*name: (?P<name>[^,]+)")


@dataclass
class StartupFold:
    """One worker's view for the live console: hides TensorFlow's known noise and counts it."""

    # Lines hidden from the console so far (they stay in the log).
    hidden: int = 0
    # Whether the one-line summary has been printed for this worker.
    announced: bool = False
    # A CPU-only marker was seen (no driver, or cuInit failed).
    cpu_only: bool = False
    # GPU index -> device name, from TensorFlow's "Created device" lines.
    gpus: dict[int, str] = field(default_factory=dict)
    # The previous line was hidden, so a headerless continuation line belongs to it.
    _in_record: bool = False

    def hides(self, line: str) -> bool:
        """True if ``line`` is known TensorFlow noise (it is then counted, not printed)."""
        noise = is_noise(line, self._in_record)
        self._in_record = noise
        if noise:
            self.hidden += 1
            self.cpu_only = self.cpu_only or any(marker in line for marker in NO_GPU)
            created = GPU_CREATED.search(line)
            if created:
                self.gpus[int(created["index"])] = created["name"].strip()
        return noise

    def summary(self) -> str:
        if self.gpus:
            names = sorted(set(self.gpus.values()))
            devices = f"{len(self.gpus)} GPU{'s' if len(self.gpus) > 1 else ''} ({', '.join(names)})"
        else:
            devices = "CPU only" if self.cpu_only else "devices not reported"
        return f"TensorFlow started, {devices} ({self.hidden} start-up lines in the log)"


def is_noise(line: str, after_noise: bool = False) -> bool:
    """Known TensorFlow C++ noise: INFO lines (NCCL's and TensorFlow's Python ones too), known warnings and
    benign errors. A FATAL line,
    any other warning or error, and everything that is not a C++ log line are not noise."""
    if line == ABSL_PREAMBLE or line.startswith(PYTHON_INFO) or is_nccl_line(line):
        return True  # NCCL's INFO lines: NCCL_DEBUG=INFO on GPU workers (tfcluster/nccl.py).
    record = CPP_LINE.match(line)
    if record is None:
        return after_noise and any(pattern.match(line) for pattern in CONTINUATIONS)
    severity, message = record["severity"], record["message"]
    if severity == "I":
        return True
    if severity == "W":
        return any(known in message for known in BENIGN_WARNINGS)
    if severity == "E":
        return any(known in message for known in BENIGN_ERRORS)
    return False


def without_noise(lines: list[str]) -> list[str]:
    """``lines`` minus the known noise (for a failed worker's log tail)."""
    fold = StartupFold()
    return [line for line in lines if not fold.hides(line)]


# keras-team/keras#20585: Keras 3's model.fit under MultiWorkerMirroredStrategy with 2+ workers.
KERAS_20585 = "ValueError: Attempt to convert a value (PerReplica:"


def diagnose(lines: list[str], keras: str) -> str | None:
    """One line naming a known cause and its fix, if the log shows one. ``keras``: "2" or "3"."""
    if not any(KERAS_20585 in line for line in lines):
        return None
    cause = ("Keras 3's model.fit does not work under MultiWorkerMirroredStrategy with 2 or more workers "
             "(keras-team/keras#20585)")
    if keras == "3":
        return (f"{cause}: use --keras 2 (the default: tf.keras is then tf_keras), or train with a "
                "custom loop (strategy.run)")
    return (f"{cause}, and the script imports Keras 3 itself (`import keras`): use tf.keras or "
            "`import tf_keras as keras`, or train with a custom loop (strategy.run)")
