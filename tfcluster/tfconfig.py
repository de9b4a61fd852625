"""TF_CONFIG rendering: one chief plus workers, the same cluster spec everywhere.

Worker i of N runs task ``chief:0`` for i == 0 and ``worker:i-1`` otherwise, which is
the layout TensorFlow's multi-worker tutorial and Vertex AI use.
"""

from __future__ import annotations

import json


def task_of(index: int) -> tuple[str, int]:
    """(task type, task index) for worker ``index`` (0-based)."""
    if index < 0:
        raise ValueError(f"worker index must be >= 0 (got {index})")
    return ("chief", 0) if index == 0 else ("worker", index - 1)


def cluster_spec(endpoints: list[str]) -> dict[str, list[str]]:
    """{"chief": [e0], "worker": [e1, ...]} from "host:port" endpoints in worker order."""
    if not endpoints:
        raise ValueError("a cluster needs at least one endpoint")
    if len(set(endpoints)) != len(endpoints):
        raise ValueError(f"endpoints must be distinct: {endpoints}")
    spec = {"chief": [endpoints[0]]}
    if len(endpoints) > 1:
        spec["worker"] = list(endpoints[1:])
    return spec


def render(endpoints: list[str], index: int) -> dict:
    """The TF_CONFIG dict for worker ``index``."""
    if not 0 <= index < len(endpoints):
        raise ValueError(f"worker index {index} is outside 0..{len(endpoints) - 1}")
    task_type, task_index = task_of(index)
    return {"cluster": cluster_spec(endpoints), "task": {"type": task_type, "index": task_index}}


def render_all(endpoints: list[str]) -> list[str]:
    """TF_CONFIG JSON strings, one per worker, compact as TensorFlow expects in the env."""
    return [json.dumps(render(endpoints, i), separators=(",", ":")) for i in range(len(endpoints))]


# compute.v1 Instance.resourceStatus.physicalHostTopology, from the widest level to the narrowest: "the
# global name of the Compute Engine cluster", then block, sub-block and host ("Instances on the same
# host experience the lowest possible network latency"), per the discovery document's descriptions.
TOPOLOGY_LEVELS = ("cluster", "block", "subblock", "host")


def topology_order(topologies: list[dict | None]) -> list[int]:
    """The VMs' indices in TF_CONFIG order: sorted by their physicalHostTopology when Compute filled it
    for every VM (neighbours in the ring are neighbours on the network; ties keep the VM index), else
    by the VM's index (most VMs without a compact placement policy report none). The order is a
    function of where the VMs are, so the chief stays the chief across restarts on the same hosts."""
    complete = [topology for topology in topologies if topology and all(topology.get(level) for level in
                                                                         TOPOLOGY_LEVELS)]
    if len(complete) != len(topologies):
        return list(range(len(topologies)))
    return sorted(range(len(topologies)),
                  key=lambda index: (tuple(str(topologies[index][level]) for level in TOPOLOGY_LEVELS), index))


def spread(topologies: list[dict | None]) -> str:
    """`status`'s line: "3 VMs on 1 block, 2 sub-blocks" ("" when Compute reports no topology)."""
    known = [topology for topology in topologies if topology and topology.get("block")]
    if not known:
        return ""
    blocks = {(t.get("cluster"), t["block"]) for t in known}
    subblocks = {(t.get("cluster"), t["block"], t.get("subblock")) for t in known}
    def count(n: int, word: str, plural: str) -> str:
        return f"{n} {word if n == 1 else plural}"
    return (f"{count(len(topologies), 'VM', 'VMs')} on {count(len(blocks), 'block', 'blocks')}, "
            f"{count(len(subblocks), 'sub-block', 'sub-blocks')}")
