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

import re

# len(...['cluster']['worker']): the tutorial's count, which leaves out the chief.
_WORKER_LIST = re.compile(r"len\(\s*[\w.]+\s*\[\s*['\"]cluster['\"]\s*\]\s*\[\s*['\"]worker['\"]\s*\]\s*\)")
# NUM_WORKERS = 2, num_workers = 2 (a literal count).
_LITERAL = re.compile(r"^\s*(num_workers|n_workers|workers)\s*=\s*(\d+)\s*(?:#.*)?$", re.IGNORECASE | re.MULTILINE)

ADVICE = ("count every task, chief included: sum(len(tasks) for tasks in tf_config['cluster'].values()), or "
          "use strategy.num_replicas_in_sync (or $TFCLUSTER_REPLICAS)")


def worker_count_note(script_name: str, text: str, workers: int) -> str | None:
    """One line when ``text`` counts the workers otherwise than this run of ``workers`` has them."""
    if _WORKER_LIST.search(text):
        return (f"{script_name} counts the workers as len(TF_CONFIG['cluster']['worker']), which is {workers - 1} "
                f"on this run of {workers}: TF_CONFIG names the chief apart (cluster: chief 1, worker "
                f"{workers - 1}), so a global batch sized by that count is one worker short; {ADVICE}")
    for match in _LITERAL.finditer(text):
        if int(match.group(2)) != workers:
            return (f"{script_name} sets {match.group(1)} = {match.group(2)}, and this run has {workers} workers "
                    f"(TF_CONFIG); {ADVICE}")
    return None
