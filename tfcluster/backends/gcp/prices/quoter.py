"""Quoter: the hourly prices of a cluster's VMs, for every part of the gcp backend that needs them (`up`'s
plan, the budget's rate and deadline, the cost ledger's prices, `status`'s cost so far).

Which VMs: those Terraform made, as its applied variables say (``applied``: a resumed or restarted cluster
is priced as it is, not as today's settings would make it), else those the settings are about to make.
Catalog prices are cached per region for the day in the state folder's cache/ (cost.quote)."""

from __future__ import annotations

from tfcluster.backends.gcp.cloud.compute import gpu_type
from tfcluster.backends.gcp.prices.cost import Quote, quote
from tfcluster.provisioning import FLEX_START


class Quoter:
    """The Quote (on-demand, Spot and Flex-start per hour, and which is in use) of a cluster's VMs."""

    def __init__(self, store):
        # The state folder's StateStore: cost.quote keeps the catalog's prices per region for the day
        # in its cache/ (read when a quote is asked for).
        self._store = store

    def quote(self, settings, project: str, zone: str, workers: int, spot: bool, applied: dict | None = None) -> Quote:
        """On-demand and Spot per hour for ``workers`` VMs in ``zone``: those Terraform made (``applied``, its
        variables) or is about to make (``settings``)."""
        made = applied or {}
        flex = made.get("provisioning_model", "FLEX_START" if settings.provisioning == FLEX_START else "") == "FLEX_START"
        return quote(project, zone, made.get("machine_type", settings.machine_type),
                     made.get("gpu_type") or gpu_type(settings.gpu), made.get("gpu_count", settings.gpu_count),
                     made.get("boot_disk_gb", settings.boot_disk_gb), workers, spot and not flex,
                     self._store.root / "cache", made.get("boot_disk_type", settings.boot_disk_type), flex_start=flex)
