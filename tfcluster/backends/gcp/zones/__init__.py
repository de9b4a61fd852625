"""Where a cluster's VMs can be had, zone by zone: reservations (read and judged against the cluster's VMs;
which one a VM consumes), capacity (`--capacity auto`'s ladder, the bounded Flex-start wait, a cluster
made whole or not at all), ladder (the backend's collaborator that climbs it, keeping the cluster's
record and cost ledger on the way), failover (`up` across tfcluster.zones or `--zone auto`; a Spot cluster moved
whole), restart (stopped, preempted and deleted VMs brought back, waiting while the zone is full:
ZoneFull), offers (`invoke offers`: where a GPU is, with quota and price, cheapest first).

May import: the cloud, quotas and prices rooms, tfcluster.backends.{base,group} and the bottom layer.
Outside tfcluster/backends/gcp/, only what __all__ names.
"""

from tfcluster.backends.gcp.zones.offers import every_shape, find_offers, without_project

__all__ = ["every_shape", "find_offers", "without_project"]
