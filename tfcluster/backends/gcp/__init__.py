"""The gcp backend: Google Cloud GPU VMs provisioned by Terraform, run over the ssh backend.

backend.py holds GcpBackend: the ssh backend plus provisioning, composed of the rooms below and holding
its collaborators (prices.Quoter, spend.SpendTracker, spend.Budget), never mixing them in. The rooms, one concern each, lowest first (a room imports only rooms before it):
- cloud/: the clients: Google's errors as one line, Compute, Terraform, Cloud Storage, Artifact Registry;
- quotas/: every quota a cluster takes, where each is read, the zones judged with them;
- prices/: the Cloud Billing Catalog and the quotes built from it (or the dated table);
- zones/: where the VMs can be had: reservations, the capacity ladder, zone failover, restarts, offers;
- vms/: what is done to made VMs: stops, status rows, teardown, the VMs' Docker login;
- spend/: what the cluster spends (the cost ledger's events) and may still spend (the budget deadline);
- access/: service accounts and role, the operator's address, `invoke check` and its prerequisites.
Each room's __init__.py says what it holds and may import; outside this package only the names a room's
__all__ exports are used. The package may import tfcluster.backends.{base,docker,group,ssh}, state, config,
ledger and errors; never commands or launch.
"""

from tfcluster.backends.gcp.backend import GcpBackend
from tfcluster.backends.gcp.cloud.compute import ComputeApi, pinned_host_key, wait_ready
from tfcluster.backends.gcp.cloud.terraform import GcpInstance, Terraform, TerraformOutputs
from tfcluster.backends.gcp.prices.cost import PRICES, hourly_cost
from tfcluster.backends.gcp.quotas.quota_source import preflight_quota

__all__ = ["ComputeApi", "GcpBackend", "GcpInstance", "PRICES", "Terraform", "TerraformOutputs",
           "hourly_cost", "pinned_host_key", "preflight_quota", "wait_ready"]
