"""GPU hosts checked before they train: one bad GPU slows every step of every worker.

Each host with an ``nvidia-smi`` answers two queries (NVIDIA's nvidia-smi manual,
https://docs.nvidia.com/deploy/nvidia-smi: ``--query-gpu`` and ``--query-remapped-rows`` print one
CSV line per GPU, the fields in the order asked):

    nvidia-smi --query-gpu=index,name,ecc.errors.uncorrected.volatile.total,retired_pages.pending --format=csv,noheader
    nvidia-smi --query-remapped-rows=gpu_bus_id,remapped_rows.pending,remapped_rows.failure --format=csv,noheader

and is refused when:
- it has fewer GPUs than expected, or another model (gcp: the cluster's GPUs per VM and model; own
  hosts: as many as the host with the most, of the model most GPUs have);
- a GPU counts uncorrectable ECC errors since the driver loaded;
- a page retirement is pending (Dynamic Page Retirement, GPUs before A100:
  https://docs.nvidia.com/deploy/dynamic-page-retirement/), or a row remapping is pending or failed
  (A100 and newer: "Row remapping pending Boolean", "Row remapping failure Boolean",
  https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/user-visible-statistics.html).
``[N/A]`` and ``[Not Supported]`` ("Any unsupported data is indicated by a "N/A"", the manual) mean
the field does not apply to that GPU, never a failure: ECC turned off, page retirement on a GPU that
remaps rows, or a remapper query the GPU cannot answer. A host without ``nvidia-smi`` has no GPU to check.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Callable

from tfcluster.errors import ClusterError

GPU_FIELDS = ("index", "name", "ecc.errors.uncorrected.volatile.total", "retired_pages.pending")
REMAP_FIELDS = ("gpu_bus_id", "remapped_rows.pending", "remapped_rows.failure")
GPU_QUERY = ["nvidia-smi", f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader"]
REMAP_QUERY = ["nvidia-smi", f"--query-remapped-rows={','.join(REMAP_FIELDS)}", "--format=csv,noheader"]
NOT_APPLICABLE = ("[N/A]", "[Not Supported]", "N/A")
# nvidia-smi writes a pending flag as Yes/No; 1/0 is accepted too (the manual does not show the CSV form).
TRUE = ("yes", "1", "true")
NO_NVIDIA_SMI = 127


@dataclass(frozen=True)
class GpuFault:
    """One reason a host must not train."""

    host: str
    # The GPU's index as nvidia-smi numbers it ("" for the host as a whole: a missing GPU).
    index: str
    field: str
    value: str
    meaning: str
    # The worker's record name (the machine a backend can replace; "" when not known).
    worker: str = ""

    def line(self) -> str:
        gpu = f"GPU {self.index}" if self.index else "its GPUs"
        return f"{self.host} {gpu}: {self.field} is {self.value} ({self.meaning})"


@dataclass
class HostGpus:
    """What one host's nvidia-smi answered (``rows``: the --query-gpu lines, split)."""

    host: str
    rows: list[list[str]]
    remapped: list[list[str]]
    # The worker's record name (GpuFault.worker).
    worker: str = ""


def rows_of(text: str, width: int) -> list[list[str]]:
    return [cells for cells in ([cell.strip() for cell in line.split(",")] for line in text.splitlines()
                                if line.strip()) if len(cells) == width]


def applicable(value: str) -> bool:
    return value not in NOT_APPLICABLE


def faults(gpus: HostGpus, count: int | None, model_words: tuple[str, ...]) -> list[GpuFault]:
    """Every fault of one host; ``count`` and ``model_words`` (each in the name) are what is expected."""
    found = []
    if count is not None and len(gpus.rows) < count:
        found.append(GpuFault(gpus.host, "", "count", str(len(gpus.rows)),
                              f"expected {count}: a GPU is missing from the machine"))
    for index, name, ecc, retired in gpus.rows:
        if model_words and not all(word.lower() in name.lower() for word in model_words):
            found.append(GpuFault(gpus.host, index, "name", name, f"expected {' '.join(model_words)}"))
        if applicable(ecc) and ecc.isdigit() and int(ecc) > 0:
            found.append(GpuFault(gpus.host, index, "ecc.errors.uncorrected.volatile.total", ecc,
                                  "uncorrectable ECC errors since the driver loaded"))
        if applicable(retired) and retired.lower() in TRUE:
            found.append(GpuFault(gpus.host, index, "retired_pages.pending", retired,
                                  "a page retirement waits for a GPU reset"))
    # The remapper lists the GPUs in the same order as --query-gpu (both enumerate by index).
    for (index, *_), (bus, pending, failure) in zip(gpus.rows, gpus.remapped):
        if applicable(pending) and pending.lower() in TRUE:
            found.append(GpuFault(gpus.host, index, "remapped_rows.pending", pending,
                                  f"a row remapping at {bus} waits for a GPU reset"))
        if applicable(failure) and failure.lower() in TRUE:
            found.append(GpuFault(gpus.host, index, "remapped_rows.failure", failure,
                                  f"row remapping failed at {bus}: the GPU needs service"))
    return [replace(fault, worker=gpus.worker) for fault in found]


def probe(host) -> HostGpus | None:
    """The host's answers (a WorkerHost), or None when it has no nvidia-smi. A refused query or a
    timeout is an answer: a GPU host whose nvidia-smi cannot answer is not fit to train."""
    name = f"{host.record.name} ({host.record.address})"
    result = host.run_command(GPU_QUERY, timeout=60)
    if result.code == NO_NVIDIA_SMI:
        return None
    if result.code != 0:
        raise ClusterError(f"{name}: `nvidia-smi --query-gpu` failed ({result.last_line}); check its driver "
                           "(a GPU host must answer before it trains)")
    remap = host.run_command(REMAP_QUERY, timeout=60)
    remapped = rows_of(remap.stdout, len(REMAP_FIELDS)) if remap.code == 0 else []  # Not every GPU has one.
    return HostGpus(name, rows_of(result.stdout, len(GPU_FIELDS)), remapped, host.record.name)


def check_hosts(hosts: list, count: int | None = None, model_words: tuple[str, ...] = ()) -> list[GpuFault]:
    """Every fault of every host with GPUs. Without ``count``, the host with the most GPUs sets it and
    the model most GPUs have sets the model (own hosts: nobody declared them)."""
    with ThreadPoolExecutor(max_workers=min(32, max(1, len(hosts)))) as pool:
        answers = [answer for answer in pool.map(_probe_reachable, hosts) if answer is not None]
    if not answers:
        return []
    if count is None:
        count = max(len(answer.rows) for answer in answers)
        names = Counter(row[1] for answer in answers for row in answer.rows)
        model_words = (names.most_common(1)[0][0],) if names else ()
    return [fault for answer in answers for fault in faults(answer, count, model_words)]


def _probe_reachable(host):
    """probe(host), or None for a host that cannot be reached or verified (a changed host key, a cut
    link): the preflight's own per-host check, right after, names it with every other failed host."""
    try:
        return probe(host)
    except ClusterError:
        return None


class GpuCheckFailed(ClusterError):
    """Some hosts' GPUs are not fit to train (``faults``, each naming its worker)."""

    def __init__(self, message: str, faults: list[GpuFault]):
        super().__init__(message)
        self.faults = faults

    @property
    def workers(self) -> list[str]:
        """The failed workers' record names, in order, each once."""
        return list(dict.fromkeys(fault.worker for fault in self.faults if fault.worker))


def require_healthy(hosts: list, count: int | None = None, model_words: tuple[str, ...] = ()) -> None:
    """Raise one error naming every failed host, GPU and field; nothing when every GPU is fit."""
    found = check_hosts(hosts, count, model_words)
    if found:
        raise GpuCheckFailed("GPU check failed, so nothing was started: " + "; ".join(f.line() for f in found)
                           + ". Repair or replace that host (a GPU reset or a reboot clears pending "
                           "retirements and remappings), or leave it out of the cluster", found)


def checked_replacing(preflight: Callable[[], None], replace_workers: Callable[[list[str]], None] | None,
                      retries: int, announce: Callable[[str], None]) -> int:
    """``preflight()``; when GPUs fail it and the backend can replace machines (``replace_workers``: a
    cloud VM is re-created as a deleted one is, on new hardware), those workers are replaced and checked
    again, at most ``retries`` times (`--retries`); else the GpuCheckFailed stands, as on own hosts.
    Returns how many replacements it took."""
    for replaced in range(retries + 1):
        try:
            preflight()
            return replaced
        except GpuCheckFailed as failed:
            if replace_workers is not None and retries == 0:
                raise GpuCheckFailed(f"{failed}, or run again with --retries 1 to re-create it on other hardware",
                                     failed.faults) from None
            if replace_workers is None or replaced == retries or not failed.workers:
                raise
            announce(f"GPU check failed on {', '.join(failed.workers)} ({'; '.join(f.line() for f in failed.faults)}); "
                     f"re-creating it on other hardware (--retries: {replaced + 1} of {retries})")
            replace_workers(failed.workers)
    return retries


def model_words(gpu_name: str) -> tuple[str, ...]:
    """The words nvidia-smi's name of a tfcluster GPU holds: "l4" -> ("L4",), "a100-80gb" ->
    ("A100", "80GB") (names as Compute's VMs report them: "NVIDIA L4", "NVIDIA A100-SXM4-80GB",
    "Tesla T4")."""
    return tuple(part.upper() for part in gpu_name.split("-"))


def applied_expectation(variables: dict) -> tuple[int | None, tuple[str, ...]]:
    """The GPUs every VM of a gcp cluster must have: the ``gpu_count`` GPUs of ``gpu_type`` that `up`
    applied (terraform.tfvars.json's ``variables``); (None, ()) for a cluster without GPUs."""
    from tfcluster.gpus import BY_ACCELERATOR

    model = BY_ACCELERATOR.get(variables.get("gpu_type", ""))
    if not variables.get("gpu_count") or model is None:
        return None, ()
    return int(variables["gpu_count"]), model_words(model.name)
