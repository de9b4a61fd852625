"""The cluster's dollar budget (`up --budget USD`, tfcluster.budget) as a hypervisor deadline.

At the first `up` and at every restart each VM's max_run_duration is the time the budget still
buys at the cluster's hourly rate, never more than max_run_hours: Compute Engine stops (or
deletes) the VMs then, laptop or not, so the cluster cannot bill past the budget while it runs.
A stop clears the deadline's clock and setScheduling only works on a stopped VM, so restart.py
writes it again before each start (https://cloud.google.com/compute/docs/instances/limit-vm-runtime).
What stays billing while the VMs are stopped (disks, the bucket) is outside this deadline.

The rate a budget is held to is cost.Quote.for_budget: the live catalog's for the cluster's region,
else the table's on-demand rate even for Spot VMs (said in one line), and no budget at all outside
the regions whose list prices the table holds (us-central1, us-east1, us-west1) without live
prices: refusing is better than a guessed factor.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from tfcluster.backends.gcp.vms import vm_control
from tfcluster.backends.gcp.cloud.errors import translated
from tfcluster.backends.gcp.cloud.terraform import Terraform

from tfcluster.errors import ConfigError
from tfcluster.ledger import Ledger, cluster_spent_usd
from tfcluster.state import ClusterState

if TYPE_CHECKING:
    from tfcluster.backends.gcp.cloud.compute import ComputeApi
    from tfcluster.backends.gcp.prices.cost import Quote
    from tfcluster.backends.gcp.spend.ledger_events import SpendTracker

# Less budget left than this buys is no run at all: `up` refuses instead of a VM that stops at once
# (Compute Engine also takes no max_run_duration under 30 s).
MIN_RUN_SECONDS = 60


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


def budget_rate(quote, announce=None) -> float:
    """USD per hour a --budget is held to (cost.Quote.for_budget), saying so when Spot is held to on-demand."""
    rate = quote.for_budget.total
    note = quote.budget_note()
    if note and announce is not None:
        announce(note)
    return rate


def describe(budget: float | None, seconds: int, max_run_hours: int) -> str:
    """The deadline for `up`'s safety line."""
    if not budget or seconds >= max_run_hours * 3600:
        return f"{max_run_hours} h"
    return f"{seconds / 3600:.2f} h (what --budget ${budget:.2f} buys; max_run_hours {max_run_hours})"


def kept_run_seconds(previous: dict, computed: int) -> int:
    """The deadline a resumed `up` writes: the first one (``previous`` tfvars), not one from the day's rate.
    scheduling.max_run_duration is ForceNew in the provider (resource_compute_instance.go; issue
    hashicorp/terraform-provider-google#26148): a new value would replace every VM the first `up` made."""
    first = int(previous.get("budget_run_seconds") or 0)
    return first if first > 0 else computed


def restart_seconds(settings, terraform, prices, spent) -> int:
    """The deadline restart.py writes before each start: max_run_hours, or what the cluster's budget
    still buys after ``spent()`` (the cost ledger's total since the first `up`: every start and stop
    across restarts, and storage). Also kept as the tfvars' budget_run_seconds, so a VM re-created by a
    targeted apply gets the same. ``prices(applied)``: the cost.Estimate in use for the applied variables."""
    if not settings.budget:
        terraform.set_variables({"budget_run_seconds": 0})
        return settings.max_run_hours * 3600
    rate = prices(terraform.variables())
    seconds = max_run_seconds(settings.budget, settings.max_run_hours, rate.total, spent())
    terraform.set_variables({"budget_run_seconds": seconds})
    return seconds


class Budget:
    """The cluster's --budget, held by GcpBackend: each VM's hypervisor deadline at every restart
    (``max_run_seconds``: what the budget still buys after what the ledger says was spent), the rate
    `train --budget` is held to (``hourly_rate``), and a run's budget end time on the VMs (``set_end``).

    It needs: ``store``, the state folder's StateStore (whose cost ledgers it reads); ``spend``, the SpendTracker that
    brings a ledger up to date first; ``quote(settings, project, zone, workers, spot, applied)``, the
    cost.Quote of the cluster's VMs (prices.Quoter.quote); ``api(cluster)``, its ComputeApi;
    ``workdir(name)``, its terraform folder; ``announce(line)``, where a line for the user goes."""

    def __init__(self, store, spend: SpendTracker, quote: Callable[..., Quote],
                 api: Callable[[ClusterState], ComputeApi], workdir: Callable[[str], Path],
                 announce: Callable[[str], None]):
        self._store, self._spend, self._quote = store, spend, quote
        self._api, self.workdir, self._announce = api, workdir, announce

    def max_run_seconds(self, cluster, settings, terraform) -> int:
        """max_run_hours, or sooner: what the cluster's --budget still buys (budget.py)."""
        def spent() -> float:  # The ledger brought up to date first: the stops just seen count.
            self._spend.sync(cluster, settings, Ledger(self._store.root, cluster.name))
            return cluster_spent_usd(self._store.root, cluster.name, since=cluster.created_at, for_budget=True)

        return restart_seconds(settings, terraform, lambda applied: self._quote(
            settings, cluster.project, cluster.zone, len(cluster.hosts), bool(applied.get("spot")),
            applied).for_budget, spent)

    def hourly_rate(self, cluster, settings) -> float | None:
        """The rate `train --budget` is held to (cost.Quote.for_budget)."""
        applied = Terraform(self.workdir(cluster.name), project=cluster.project).variables()
        quote = self._quote(settings, cluster.project, cluster.zone, len(cluster.hosts), bool(applied.get("spot")),
                            applied)
        return budget_rate(quote, self._announce)

    def set_end(self, cluster, end: float | None) -> None:
        """The run's budget end time in every VM's metadata: each watchdog halts its VM then."""
        with translated(cluster.project, "train"):
            vm_control.set_budget_end(self._api(cluster), cluster, end)
