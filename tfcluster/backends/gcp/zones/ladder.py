"""The capacity ladder as GcpBackend's collaborator: where climbing it keeps what it does.

capacity.py says how a cluster's VMs get their capacity (the steps of --capacity auto, the bounded
Flex-start wait, the Maker that climbs them). Climbing keeps two things of the backend's up to date on
the way: the cluster's record in the state folder (the zone before anything is made there, so `down`
looks where the VMs are; a waiting `up` that `status` shows) and the cost ledger (the minutes of VMs
made and removed on the way). A Ladder holds those, so neither capacity.py nor the backend reaches
into the other.
"""

from __future__ import annotations

from typing import Callable

from tfcluster.backends.gcp.cloud.terraform import Terraform
from tfcluster.backends.gcp.zones import failover
from tfcluster.backends.gcp.zones.capacity import Maker, steps, waiting_record


class Ladder:
    """The capacity ladder (--capacity auto) and the Flex-start wait, as GcpBackend's collaborator: it makes
    a cluster's VMs by the steps of its settings, and brings back Spot VMs that stayed full, keeping the
    cluster's record and its cost ledger on the way."""

    def __init__(self, store, spend, announce: Callable[[str], None], backend: str = "gcp"):
        # The state folder: the cluster's record (a waiting `up` shows in `status`) and the ledger's root.
        self.store = store
        # The cost ledger kept from what Compute shows (spend.ledger_events.SpendTracker).
        self.spend = spend
        # Says a line to the user.
        self.announce = announce
        # The backend's name in the cluster's record.
        self.backend = backend

    def _sync(self, cluster, settings, own: str) -> None:
        from tfcluster.ledger import Ledger

        self.spend.sync(cluster, settings, Ledger(self.store.root, cluster.name), own, "")

    def make(self, settings, terraform: Terraform, api, variables: dict, record: Callable[[str], None],
             began: float, key_file: str) -> str:
        """The zone the cluster's VMs were made in, by the steps of ``settings`` (GcpBackend._create's
        part for --capacity auto and Flex-start): the cost ledger and the cluster's record kept on the way."""
        from tfcluster.state import ClusterState

        def state(zone: str, wait: dict | None = None) -> ClusterState:
            return ClusterState(name=settings.cluster, backend=self.backend, hosts=[], status="provisioning",
                                project=settings.project, zone=zone, ssh_key=key_file, created_at=began,
                                waiting=wait or {})

        maker = Maker(terraform, api, variables, settings, self.announce, record,
                      lambda zone, own: self._sync(state(zone), settings, own),
                      lambda *pending: self.store.save_cluster(state(maker.zone, waiting_record(*pending))))
        return maker.make(steps(settings, api, self.announce)).zone

    def recover(self, cluster, api, terraform: Terraform, full, settings) -> None:
        """--capacity auto, after preempted Spot VMs stayed stopped for lack of Spot capacity (``full``, a
        restart.ZoneFull): the cluster's VMs come back by the rest of its ladder, without Spot (a
        reservation, on-demand, then Flex-start; its own zone first), removed and made anew; the run then
        resumes from its gs:// backup, as after a zone move (failover.move_or_fail)."""
        import dataclasses

        from tfcluster.backends.gcp.zones.restart import new_nonce

        names = ", ".join(full.instances)
        self.announce(f"zone {cluster.zone}: Spot stays full for {names} after {settings.capacity_tries} starts "
                      "(ZONE_RESOURCE_POOL_EXHAUSTED); under --capacity auto the cluster's "
                      f"{len(cluster.hosts)} VM(s) come back without Spot (its checkpoints are in "
                      f"gs://{cluster.bucket}): removed first, then made by the rest of the ladder")
        failover.remove_vms(terraform, api, cluster.zone, cluster.name)
        zones = [cluster.zone] + failover.next_zones(cluster.zone, list(settings.zones) or [cluster.zone])
        rest = steps(dataclasses.replace(settings, spot=False, zone=zones[0], zones=tuple(zones)), api, self.announce)
        variables = terraform.variables()
        variables["boot_nonce"] = new_nonce()  # Readiness counts only the new VMs' own boot.
        terraform.set_variables({"boot_nonce": variables["boot_nonce"]})

        def record(zone: str) -> None:
            cluster.zone = zone  # Recorded before anything is made there: `down` looks where the VMs are.
            self.store.save_cluster(cluster)

        maker = Maker(terraform, api, variables, settings, self.announce, record,
                      lambda zone, own: self._sync(cluster, settings, own), lambda *pending: None)
        step = maker.make(rest)
        count = failover.adopt(cluster, api, terraform, step.zone, variables["boot_nonce"],
                               settings.ready_timeout_seconds)
        self.announce(f"back: the cluster's {count} VM(s) run {step.choice.describe()} in {step.zone} now (new "
                      "addresses and host keys)")
