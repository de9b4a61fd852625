"""The cluster's dollar budget (`up --budget USD`, tfcluster.budget) as a hypervisor deadline.

At the first `up` and at every restart each VM's max_run_duration is the time the budget still
buys at the cluster's hourly rate, never more than max_run_hours: Compute Engine stops (or
deletes) the VMs then, laptop or not, so the cluster cannot bill past the budget while it runs.
A stop clears the deadline's clock and setScheduling only works on a stopped VM, so restart.py
writes it again before each start (https://cloud.google.com/compute/docs/instances/limit-vm-runtime).
What stays billing while the VMs are stopped (disks, the bucket) is outside this deadline.
"""

from __future__ import annotations

import math
import time
from datetime import datetime

from tfcluster.errors import ConfigError

# Less budget left than this buys is no run at all: `up` refuses instead of a VM that stops at once
# (Compute Engine also takes no max_run_duration under 30 s).
MIN_RUN_SECONDS = 60


def spent_so_far(instances: list, per_vm_rate: float, now: float | None = None) -> float:
    """USD the cluster's VMs billed so far, from Compute's timestamps and the prices in use: each
    VM's current (or last) run, lastStartTimestamp to now, or to lastStopTimestamp once stopped.
    The stand-in for the cost ledger (it misses runs before the last start); 0 at the first `up`.
    ``instances``: the Compute instances (None for a deleted one)."""
    now = time.time() if now is None else now
    seconds = 0.0
    for vm in instances:
        started = vm and (vm.last_start_timestamp or vm.creation_timestamp)
        if not started:
            continue
        if vm.status == "RUNNING":
            end = now
        elif vm.last_stop_timestamp:
            end = datetime.fromisoformat(vm.last_stop_timestamp).timestamp()
        else:
            continue  # Stopped with no stop time known: nothing counted.
        seconds += max(0.0, end - datetime.fromisoformat(started).timestamp())
    return per_vm_rate * seconds / 3600


def max_run_seconds(budget: float | None, max_run_hours: int, cluster_rate: float, spent: float) -> int:
    """Each VM's max_run_duration in seconds: what ``budget`` minus ``spent`` buys at ``cluster_rate``
    (USD per hour, every VM running), at most max_run_hours. Raises ConfigError when it buys too little."""
    cap = max_run_hours * 3600
    if not budget:
        return cap
    left = budget - spent
    seconds = math.floor(left / cluster_rate * 3600) if cluster_rate > 0 else cap
    if seconds < MIN_RUN_SECONDS:
        raise ConfigError(f"the cluster has spent ${spent:.2f} of its --budget ${budget:.2f}: less than a minute "
                          f"is left at ${cluster_rate:.2f}/hour; raise --budget (tfcluster.budget) or "
                          "`invoke down`")
    return min(cap, seconds)


def describe(budget: float | None, seconds: int, max_run_hours: int) -> str:
    """The deadline for `up`'s safety line."""
    if not budget or seconds >= max_run_hours * 3600:
        return f"{max_run_hours} h"
    return f"{seconds / 3600:.2f} h (what --budget ${budget:.2f} buys; max_run_hours {max_run_hours})"


def restart_seconds(settings, cluster, api, terraform, prices) -> int:
    """The deadline restart.py writes before each start: max_run_hours, or what the cluster's budget
    still buys after spent_so_far. Also kept as the tfvars' budget_run_seconds, so a VM re-created by
    a targeted apply gets the same. ``prices(applied)``: the cost.Estimate in use for the applied variables."""
    if not settings.budget:
        terraform.set_variables({"budget_run_seconds": 0})
        return settings.max_run_hours * 3600
    rate = prices(terraform.variables())
    spent = spent_so_far([api.instance_or_none(cluster.zone, record.instance) for record in cluster.hosts],
                         rate.per_vm)
    seconds = max_run_seconds(settings.budget, settings.max_run_hours, rate.total, spent)
    terraform.set_variables({"budget_run_seconds": seconds})
    return seconds
