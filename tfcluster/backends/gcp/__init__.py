"""The gcp backend: Google Cloud GPU VMs provisioned by Terraform, run over the ssh backend.

Rooms: terraform (the CLI wrapper and typed outputs), compute (Compute Engine API calls:
readiness, host keys, operations, preemption records, stops), quota (every quota a cluster takes and
how a shortfall reads), quota_source (where each is read: regions.get, Cloud Quotas, Cloud Monitoring; the
zones judged with them), errors (Google's errors as one
line), failover (a new cluster's `up` moving to the next zone when one has no capacity or quota),
restart (bringing stopped, preempted or deleted VMs back), storage (Cloud Storage
transfers), registry (the Artifact Registry repository: what it holds, adopting a kept one),
teardown (what `down` keeps), check and prerequisites (`invoke check`: what a project must offer, asked of
Google and judged), address (the operator's public IP), docker_login (the VMs' Docker signing in to the registry), vm_control (stopping VMs for --then and host maintenance), iam (the service account and custom role `down` proves gone), pricing (the Cloud Billing Catalog) and cost (on-demand and Spot
quotes, the dated table as fallback), backend (GcpBackend). May import tfcluster.backends.{base,group,ssh}, state, config and
errors; never commands or launch.
"""

from tfcluster.backends.gcp.backend import GcpBackend
from tfcluster.backends.gcp.compute import ComputeApi, pinned_host_key, wait_ready
from tfcluster.backends.gcp.cost import PRICES, hourly_cost
from tfcluster.backends.gcp.quota_source import preflight_quota
from tfcluster.backends.gcp.terraform import GcpInstance, Terraform, TerraformOutputs

__all__ = ["ComputeApi", "GcpBackend", "GcpInstance", "PRICES", "Terraform", "TerraformOutputs",
           "hourly_cost", "pinned_host_key", "preflight_quota", "wait_ready"]
