"""Which all-reduce a run used, read from its workers' logs: the `collective` row of the summary, and
the one warning a GPU worker whose strategy is not NCCL gets.

Three sources, each the program's own words:
- the wrapper's header line says how many GPUs the host's ``nvidia-smi`` lists (tfcluster/launch.py);
- TensorFlow's strategy line, which it logs at INFO when MultiWorkerMirroredStrategy is built
  (``collective_all_reduce_strategy.py``): "MultiWorkerMirroredStrategy with cluster_spec = {...}, ...,
  local_devices = (...), communication = CommunicationImplementation.AUTO", or for one worker
  "Single-worker MultiWorkerMirroredStrategy with local_devices = (...), communication = ...".
  A script's ``tensorflow`` logger drops INFO (tf_logging.get_logger: WARNING unless interactive), so
  the workers' sitecustomize raises it for that line alone (tfcluster/workerpath/sitecustomize.py);
- NCCL's INIT and NET lines (tfcluster/nccl.py), which the wrapper turns on for GPU workers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tfcluster.nccl import NcclInit

STRATEGY_LINE = re.compile(r"MultiWorkerMirroredStrategy with .*local_devices = (?P<devices>.*), "
                           r"communication = CommunicationImplementation\.(?P<communication>\w+)")
HOST_GPUS = re.compile(r"^=== tfcluster: .* attempt \d+ on .*, (?P<gpus>\d+) GPUs? \(nvidia-smi\) ===$")
# A GPU worker is one whose host's nvidia-smi lists GPUs (NVIDIA's nvidia-smi manual, --query-gpu: one
# line per GPU). There NCCL says which version, network and interfaces it uses (INIT, NET), unless the
# user set these; the header line carries the count, which the launcher reads (tfcluster/collective.py).
# A hung driver must not hold the start: 20 s at most.
GPU_PROBE = """gpus=$(timeout 20 nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | grep -c '^ *[0-9]')
gpu_note=""
if [ "${gpus:-0}" -gt 0 ]; then
  : "${NCCL_DEBUG:=INFO}" "${NCCL_DEBUG_SUBSYS:=INIT,NET}"
  export NCCL_DEBUG NCCL_DEBUG_SUBSYS
  gpu_note=", $gpus GPU$([ "$gpus" -gt 1 ] && echo s) (nvidia-smi)"
fi
"""

# The fix, as code a script can paste.
NCCL_OPTIONS = ("tf.distribute.MultiWorkerMirroredStrategy(communication_options=tf.distribute.experimental."
                "CommunicationOptions(implementation=tf.distribute.experimental.CommunicationImplementation.NCCL))")


@dataclass
class WorkerCollective:
    """One worker's view, from its log."""

    # GPUs its host's nvidia-smi lists (0: none, or no nvidia-smi).
    host_gpus: int = 0
    # TensorFlow's "communication = ..." ("AUTO", "RING", "NCCL"; "" until logged).
    communication: str = ""
    # Whether TensorFlow's local_devices hold a GPU.
    tf_gpus: bool = False
    nccl: NcclInit = field(default_factory=NcclInit)


@dataclass
class CollectiveWatch:
    """Every worker's collective for one run (all its attempts)."""

    workers: dict[int, WorkerCollective] = field(default_factory=dict)
    # The run's one warning has been given.
    warned: bool = False

    def line(self, index: int, name: str, line: str) -> str | None:
        """Take one line of worker ``index``'s log; the run's warning, the first time it holds."""
        worker = self.workers.setdefault(index, WorkerCollective())
        host = HOST_GPUS.match(line)
        if host:
            worker.host_gpus = int(host["gpus"])
        strategy = STRATEGY_LINE.search(line)
        if strategy:
            worker.communication = strategy["communication"]
            worker.tf_gpus = "device:GPU:" in strategy["devices"]
        worker.nccl.observe(line)
        if self.warned or not strategy or not worker.host_gpus or worker.communication == "NCCL":
            return None
        self.warned = True
        gpus = f"{worker.host_gpus} GPU{'s' if worker.host_gpus > 1 else ''}"
        if not worker.tf_gpus:
            return (f"{name}'s host has {gpus} (nvidia-smi) but TensorFlow trains on its CPU (local_devices has "
                    f"no GPU) with the ring (communication = {worker.communication}): install a TensorFlow with "
                    "GPU support there (pip install 'tensorflow[and-cuda]'), and build the strategy with "
                    f"{NCCL_OPTIONS}")
        return (f"{name} has {gpus} but its MultiWorkerMirroredStrategy all-reduces with TensorFlow's ring "
                f"(communication = {worker.communication}; AUTO never picks NCCL): build it with {NCCL_OPTIONS}")

    def describe(self, strategy_event: dict | None = None) -> str:
        """The summary's row: the chief's (or the first worker's that says) collective and transport.
        ``strategy_event``: the bundled trainer's, which names its choice even where TF's line is absent."""
        known = [self.workers[index] for index in sorted(self.workers)]
        nccl = next((worker.nccl for worker in known if worker.nccl.network or worker.nccl.interfaces), None) or \
            next((worker.nccl for worker in known if worker.nccl.seen), None)
        said = next((worker for worker in known if worker.communication), None)
        communication = said.communication if said else (strategy_event or {}).get("communication", "")
        if nccl is not None:
            return nccl.describe()
        if communication == "NCCL":
            return ("NCCL (no NCCL line in the logs yet: NCCL starts at the first all-reduce between GPUs, and "
                    "prints only with NCCL_DEBUG=INFO)")
        if communication:
            on_gpu = said.tf_gpus if said else bool((strategy_event or {}).get("gpus"))
            return f"ring over gRPC ({'GPU: not NCCL' if on_gpu else 'CPU'})"
        return "n/a (no MultiWorkerMirroredStrategy line in the logs)"
