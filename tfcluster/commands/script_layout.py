"""What a user's script assumes about the cluster's layout, checked against the run's before it starts.

TensorFlow's multi-worker tutorial counts the workers as ``len(tf_config['cluster']['worker'])`` and
sizes its global batch by that count. tfcluster's TF_CONFIG names the chief apart (``{"chief": [..],
"worker": [..]}``, as Vertex AI's does), so that count is one short: on three workers the tutorial's
global batch is 128, not 192, and nothing says so. A script that writes its count down
(``NUM_WORKERS = 2``) goes stale the same way when `--workers` changes. The launcher knows the layout:
it says so once, before the run, with what to count instead.

May import: nothing of tfcluster (the script's text in, one line out).
"""

from __future__ import annotations

import ast

# Names a script writes its worker count under.
_COUNT_NAMES = ("num_workers", "n_workers", "workers")

ADVICE = ("count every task, chief included: sum(len(tasks) for tasks in tf_config['cluster'].values()), or "
          "use strategy.num_replicas_in_sync (or $TFCLUSTER_REPLICAS)")


def _key(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _counts_worker_list(node: ast.AST) -> bool:
    """len(<anything>['cluster']['worker']): the tutorial's count, which leaves out the chief."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len" and node.args):
        return False
    inner = node.args[0]
    return (isinstance(inner, ast.Subscript) and _key(inner.slice) == "worker"
            and isinstance(inner.value, ast.Subscript) and _key(inner.value.slice) == "cluster")


def worker_count_note(script_name: str, text: str, workers: int) -> str | None:
    """One line when the script's code (not its comments or strings) counts the workers otherwise than
    this run of ``workers`` has them."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None  # Python says what is wrong when the script runs.
    nodes = list(ast.walk(tree))
    if any(_counts_worker_list(node) for node in nodes):
        return (f"{script_name} counts the workers as len(TF_CONFIG['cluster']['worker']), which is {workers - 1} "
                f"on this run of {workers}: TF_CONFIG names the chief apart (cluster: chief 1, worker "
                f"{workers - 1}), so a global batch sized by that count is one worker short; {ADVICE}")
    for node in nodes:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id.lower() in _COUNT_NAMES and isinstance(node.value, ast.Constant)
                and type(node.value.value) is int and node.value.value != workers):
            return (f"{script_name} sets {node.targets[0].id} = {node.value.value}, and this run has {workers} workers "
                    f"(TF_CONFIG); {ADVICE}")
    return None
