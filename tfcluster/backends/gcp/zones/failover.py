"""Zone failover: a new cluster's `up` tries each zone in turn (`zone`, then `zones`, or `--zone auto`).
Before anything is made, each zone's offer and quota are judged (check.run, quota.judge_zones) and a
zone that falls short is dropped with a line (keep_zones). At apply, it moves on when a zone has no
capacity, or past the zones a quota refusal covers (after_refusal; errors.zone_refusal reads
terraform's error text); a Spot run whose preempted VMs cannot start in their zone within capacity_tries moves
the whole cluster to the next zone (move_or_fail) and resumes from the bucket.

All VMs of a cluster are in one zone. Before the next zone is tried, the VMs made in the refused one
(and their IAM bindings, which depend on them) are destroyed and Compute is asked that none is left
there. The bucket and the registry never move: their locations are fixed in the tfvars at the first
`up` (bucket_location, registry_location), so a zone in another region reuses them and the line
before it states the inter-region data transfer. Nothing stored is ever destroyed here.
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Callable

from tfcluster.backends.gcp.cloud.compute import ComputeApi, pinned_host_key, region_of, wait_ready
from tfcluster.backends.gcp.cloud.errors import translated, zone_refusal
from tfcluster.backends.gcp.zones.restart import ZoneFull, new_nonce
from tfcluster.backends.gcp.cloud.terraform import Terraform, TerraformError
from tfcluster.backends.group import in_parallel
from tfcluster.errors import ClusterError, ConfigError
from tfcluster.state import ClusterState

INSTANCES = "google_compute_instance.worker"
# --zone auto (config.parse_zones lets it through alone): the zones `invoke offers` lists with quota, cheapest first.
AUTO_ZONE = "auto"


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


def after_refusal(zones: list[str], index: int, why: str) -> tuple[list[str], str]:
    """(the zones still worth trying after zones[index] refused with ``why``, what was skipped and why).
    A quota refusal is not the zone's: a regional quota ("no quota (CPUS)") is the same in every zone
    of the region, so those are skipped; a project-wide one (*_ALL_REGIONS) is the same everywhere, so
    nothing is left (https://cloud.google.com/compute/resource-usage: regional and global quotas)."""
    rest = zones[index + 1:]
    quota = re.fullmatch(r"no quota \(([A-Z0-9_]+)\)", why)
    if quota is None:
        return rest, ""
    if quota[1].endswith("_ALL_REGIONS"):
        return [], f"{quota[1]} is project-wide: no other zone has more of it"
    region = region_of(zones[index])
    same = [zone for zone in rest if region_of(zone) == region]
    if not same:
        return rest, ""
    return ([zone for zone in rest if region_of(zone) != region],
            f"skipping {', '.join(same)}: {quota[1]} is {region}'s, the same in each of its zones")


def apply_in_zones(terraform: Terraform, api: ComputeApi, variables: dict, zones: list[str], cluster: str,
                   announce: Callable[[str], None], on_zone: Callable[[str], None]) -> str:
    """Apply in the first zone that takes the cluster; returns it. One line per zone tried."""
    refused, left = [], list(zones)
    while left:
        zone = left[0]
        index = zones.index(zone)
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
            left, skipped = after_refusal(left, 0, why)
            after = "; ".join(part for part in (skipped, f"trying {left[0]}" if left else "") if part)
            announce(f"zone {zone} ({index + 1} of {len(zones)}): {why}; removed the {removed} VM(s) made there"
                     + (f"; {after}" if after else ""))
            continue
        if len(zones) > 1:
            announce(f"zone {zone} ({index + 1} of {len(zones)}): the cluster's VMs are created here")
        return zone
    raise ClusterError(f"no zone could take the cluster ({'; '.join(refused)}); no VM is left in them. Add zones "
                       "to tfcluster.zones (`invoke offers` lists where the GPU is), request more of a quota it names, "
                       "or run `invoke up` again later; `invoke down` removes what was created")


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


def with_auto_zones(settings, announce: Callable[[str], None]):
    """``settings`` with `zone: auto` resolved: the zones `invoke offers` lists whose region has GPU
    quota free for the cluster, cheapest first (Spot prices for Spot VMs); others unchanged."""
    if settings.zone != AUTO_ZONE:
        return settings
    from tfcluster.backends.gcp.zones.offers import find_offers

    with translated(settings.project, "zone auto"):
        found = find_offers(settings.project, settings.gpu, settings.gpu_count, settings.machine_type, settings.spot)
    order = found.with_quota(settings.workers)
    need = f"{settings.workers * settings.gpu_count} {found.gpu.accelerator}"
    if not order:
        raise ConfigError(f"zone auto found no zone whose quota has {need} GPU(s) free ({len(found.zones)} zone(s) "
                          "offer it; `invoke offers` lists them with their quota): request quota, or set "
                          "tfcluster.zone or tfcluster.zones to zones of your choice")
    announce(f"zone auto: {', '.join(order)} (the zones `invoke offers` lists with {need} GPU(s) of quota free, "
             f"cheapest {'Spot' if settings.spot else 'on-demand'} first; tried in turn)")
    return dataclasses.replace(settings, zone=order[0], zones=tuple(order))


def made_before(api: ComputeApi, terraform: Terraform, cluster: str) -> dict:
    """Zone -> VMs of the cluster a failed `up` already made there (a resumed `up`: they need no quota
    again); empty for a new cluster or when Compute cannot say."""
    if not (terraform.workdir / "terraform.tfvars.json").exists():
        return {}
    zone = terraform.variables().get("zone", "")
    try:
        return {zone: len(api.list_cluster(zone, cluster))} if zone else {}
    except Exception:  # noqa: BLE001 - the quota check then counts them again, which only errs on the safe side.
        return {}


def keep_zones(settings, usable: list[str]):
    """``settings`` with only the zones whose offer and quota hold (check.Report.zones), in order."""
    if not usable or list(usable) == (list(settings.zones) or [settings.zone]):
        return settings
    return dataclasses.replace(settings, zone=usable[0], zones=tuple(usable))


def next_zones(current: str, zones: list[str]) -> list[str]:
    """Where a cluster in ``current`` may move: the zones listed after it, then those before it."""
    if current not in zones:
        return list(zones)
    at = zones.index(current)
    return zones[at + 1:] + zones[:at]


def move_or_fail(cluster: ClusterState, api: ComputeApi, terraform: Terraform, full: ZoneFull, settings,
                 announce: Callable[[str], None], save: Callable[[ClusterState], None]) -> None:
    """Preempted VMs stayed stopped for lack of capacity after capacity_tries starts: move the whole
    cluster to the next zone of ``settings`` (its VMs removed here first, then made there through
    apply_in_zones; ``cluster``'s zone and host records updated), or, with no other zone, one error."""
    names = ", ".join(full.instances)
    why = (f"zone {cluster.zone} has no capacity for {names} after {settings.capacity_tries} starts "
           "(ZONE_RESOURCE_POOL_EXHAUSTED)")
    others = next_zones(cluster.zone, list(with_auto_zones(settings, announce).zones) or [cluster.zone])
    if not others:
        stays = "stays stopped and its disk bills" if len(full.instances) == 1 else "stay stopped and their disks bill"
        raise ClusterError(f"zone {cluster.zone} has no capacity for {names} after {settings.capacity_tries} starts "
                           f"(ZONE_RESOURCE_POOL_EXHAUSTED); {names} {stays} until `invoke down` (or `invoke up` later "
                           "starts them again); list more zones in tfcluster.zones to have the cluster move instead"
                           ) from None
    announce(f"{why}: moving the whole cluster to {others[0]}"
             f"{' (else ' + ', '.join(others[1:]) + ', in turn)' if others[1:] else ''}; its "
             f"{len(cluster.hosts)} VM(s) in {cluster.zone} are removed first (their disks hold nothing the run "
             f"needs: its checkpoints are in gs://{cluster.bucket})")
    remove_vms(terraform, api, cluster.zone, cluster.name)
    variables = terraform.variables()
    variables["boot_nonce"] = new_nonce()  # Readiness counts only the new VMs' own boot.
    terraform.set_variables({"boot_nonce": variables["boot_nonce"]})

    def moved_to(zone: str) -> None:
        cluster.zone = zone  # Recorded before anything is made there: `down` looks where the VMs are.
        save(cluster)

    zone = apply_in_zones(terraform, api, variables, others, cluster.name, announce, moved_to)
    count = adopt(cluster, api, terraform, zone, variables["boot_nonce"], settings.ready_timeout_seconds)
    announce(f"moved: the cluster's {count} VM(s) run in {zone} now (new addresses and host keys); the "
             "bucket and the registry stay where they are")


def adopt(cluster: ClusterState, api: ComputeApi, terraform: Terraform, zone: str, nonce: str, timeout: float) -> int:
    """The VMs terraform made anew in ``zone`` become the cluster's: readiness with this boot's nonce, host keys
    from guest attributes, ``cluster``'s host records updated. Returns how many."""
    instances = terraform.outputs().instances
    wait_ready(api, zone, [vm.name for vm in instances], timeout, nonce=nonce)
    keys = in_parallel(instances, lambda vm: pinned_host_key(api, zone, vm.name), lambda vm: vm.name,
                       "reading host keys")
    for record, vm, key in zip(cluster.hosts, instances, keys):
        record.instance, record.address, record.ssh_address, record.host_key = \
            vm.name, vm.internal_ip, vm.external_ip, key
    cluster.vms_made_at = time.time()  # New disks: a resumed run stages its code again (commands/restage.py).
    return len(instances)
