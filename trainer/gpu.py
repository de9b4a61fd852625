"""GPU utilisation of this worker's machine, sampled from ``nvidia-smi`` while it trains.

Each sample is one ``nvidia-smi --query-gpu=index,utilization.gpu,memory.used
--format=csv,noheader,nounits`` (NVIDIA's nvidia-smi manual, "--query-gpu": one line per GPU,
the fields comma-separated in the order asked; ``nounits`` drops " %" and " MiB"; a field a GPU
cannot report reads "[N/A]" or "[Not Supported]"). The sampler runs only where an ``nvidia-smi``
is on the PATH and answers; each epoch reports the mean over the samples taken during it.
"""

from __future__ import annotations

import shutil
import subprocess
import threading

QUERY = ["--query-gpu=index,utilization.gpu,memory.used", "--format=csv,noheader,nounits"]
# Seconds between samples: often enough for a minute-long epoch, rare enough to cost nothing.
SAMPLE_SECONDS = 2.0
# One sample may take this long before it is given up (a wedged driver must not hang training).
QUERY_TIMEOUT_SECONDS = 10.0


def parse(text: str) -> dict[int, tuple[float, float]]:
    """GPU index -> (utilisation %, memory used MiB) from the query's output; unreadable lines skipped."""
    found = {}
    for line in text.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != 3:
            continue
        try:
            found[int(parts[0])] = (float(parts[1]), float(parts[2]))
        except ValueError:
            continue  # "[N/A]", "[Not Supported]".
    return found


def query(binary: str) -> dict[int, tuple[float, float]]:
    try:
        result = subprocess.run([binary, *QUERY], capture_output=True, text=True, timeout=QUERY_TIMEOUT_SECONDS)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return parse(result.stdout) if result.returncode == 0 else {}


class GpuSampler:
    """Samples in a daemon thread; ``take_epoch()`` returns the epoch's means and starts the next."""

    def __init__(self, binary: str, interval: float = SAMPLE_SECONDS):
        self._binary = binary
        self._interval = interval
        self._samples: list[dict[int, tuple[float, float]]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)

    @classmethod
    def start_if_available(cls) -> "GpuSampler | None":
        """A running sampler when an nvidia-smi on the PATH reports at least one GPU, else None."""
        binary = shutil.which("nvidia-smi")
        if binary is None or not query(binary):
            return None
        sampler = cls(binary)
        sampler._thread.start()
        return sampler

    def _run(self) -> None:
        while not self._stop.is_set():
            self._record(query(self._binary))
            self._stop.wait(self._interval)

    def _record(self, sample: dict) -> None:
        if sample:
            with self._lock:
                self._samples.append(sample)

    def take_epoch(self) -> dict:
        """This epoch's mean utilisation (%) and peak memory (MiB) per GPU and over all of them.
        An epoch shorter than the interval gets one sample taken now."""
        with self._lock:
            samples, self._samples = self._samples, []
        if not samples:
            samples = [sample for sample in [query(self._binary)] if sample]
        if not samples:
            return {}
        indices = sorted({index for sample in samples for index in sample})
        per_gpu = {index: [s[index][0] for s in samples if index in s] for index in indices}
        memory = {index: max(s[index][1] for s in samples if index in s) for index in indices}
        means = {str(index): round(sum(values) / len(values), 1) for index, values in per_gpu.items()}
        return {"utilization": round(sum(means.values()) / len(means), 1), "per_gpu": means,
                "memory_used_mib": {str(index): value for index, value in memory.items()},
                "samples": len(samples)}

    def stop(self) -> None:
        """Ends the sampling; returns once no query is running (at most one query's timeout)."""
        self._stop.set()
        self._thread.join(QUERY_TIMEOUT_SECONDS + 1)
