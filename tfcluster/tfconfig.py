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
