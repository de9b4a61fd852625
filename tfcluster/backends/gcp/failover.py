"""Zone failover for a new cluster's `up`: each zone in turn (`zone`, then `zones`), moving on when
one has no capacity or no quota for the VMs (errors.zone_refusal reads terraform's error text).

All VMs of a cluster are in one zone. Before the next zone is tried, the VMs made in the refused one
(and their IAM bindings, which depend on them) are destroyed and Compute is asked that none is left
there. The bucket and the registry never move: their locations are fixed in the tfvars at the first
`up` (bucket_location, registry_location), so a zone in another region reuses them and the line
before it states the inter-region data transfer. Nothing stored is ever destroyed here.
"""

from __future__ import annotations

from typing import Callable

from tfcluster.backends.gcp.compute import ComputeApi, region_of
from tfcluster.backends.gcp.errors import zone_refusal
from tfcluster.backends.gcp.terraform import Terraform, TerraformError
from tfcluster.errors import ClusterError

INSTANCES = "google_compute_instance.worker"


def pin_locations(variables: dict, previous: dict, bucket_location: str) -> None:
    """The bucket's and registry's locations as the first `up` chose them (kept on a resume)."""
    home = region_of(previous.get("zone") or variables["zone"])
    variables["bucket_location"] = previous.get("bucket_location") or bucket_location or home.upper()
    variables["registry_location"] = previous.get("registry_location") or home


def egress_line(zone: str, variables: dict) -> str | None:
    """What a zone outside the bucket's and registry's region costs, or None when it is inside."""
    region = region_of(zone)
    bucket, registry = variables["bucket_location"], variables["registry_location"]
    # A multi-region bucket (US, EU, ASIA) is read without a cross-region charge from its regions.
    far = [f"the bucket stays in {bucket}"] if "-" in bucket and bucket.lower() != region else []
    far += [f"the registry stays in {registry}"] if registry != region else []
    if not far:
        return None
    return (f"zone {zone} is in {region}; {' and '.join(far)} (never moved): the VMs' reads and image pulls from "
            "there are inter-region data transfer, billed per GB (https://cloud.google.com/storage/pricing"
            "#network-egress)")


def apply_in_zones(terraform: Terraform, api: ComputeApi, variables: dict, zones: list[str], cluster: str,
                   announce: Callable[[str], None], on_zone: Callable[[str], None]) -> str:
    """Apply in the first zone that takes the cluster; returns it. One line per zone tried."""
    refused = []
    for index, zone in enumerate(zones):
        variables["zone"] = zone
        terraform.set_variables({"zone": zone})
        on_zone(zone)
        line = egress_line(zone, variables)
        if line:
            announce(line)
        try:
            terraform.apply()
        except TerraformError as error:
            why = zone_refusal(error.stderr)
            if why is None or len(zones) == 1:
                raise
            removed = remove_vms(terraform, api, zone, cluster)
            refused.append(f"{zone}: {why}")
            after = f"; trying {zones[index + 1]}" if index + 1 < len(zones) else ""
            announce(f"zone {zone} ({index + 1} of {len(zones)}): {why}; removed the {removed} VM(s) made there{after}")
            continue
        if len(zones) > 1:
            announce(f"zone {zone} ({index + 1} of {len(zones)}): the cluster's VMs are created here")
        return zone
    raise ClusterError(f"no zone could take the cluster ({'; '.join(refused)}); no VM is left in them. Add zones "
                       "to tfcluster.zones (`invoke offers` lists where the GPU is) or run `invoke up` again later; "
                       "`invoke down` removes what was created")


def remove_vms(terraform: Terraform, api: ComputeApi, zone: str, cluster: str) -> int:
    """Destroy the VMs a refused zone's apply made, then prove through Compute that none is left."""
    made = [address for address in terraform.run("state", "list").split() if address.startswith(INSTANCES + "[")]
    if made:
        terraform.destroy([INSTANCES])  # Their IAM members depend on them and go first.
    left = [vm.name for vm in api.list_cluster(zone, cluster)]
    if left:
        raise ClusterError(f"zone {zone} still has VM(s) {', '.join(left)} after the failover removed them; delete "
                           f"them (`gcloud compute instances delete --zone {zone} ...`) and run `invoke up` again")
    return len(made)
