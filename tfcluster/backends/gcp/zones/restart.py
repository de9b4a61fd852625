"""Bring a stopped cluster back: what `invoke up` does for a cluster that already exists.

Compute Engine facts this follows:
- A stop clears the VM's termination timestamp, and the next start defines a new one from
  `scheduling.maxRunDuration`, which the VM keeps: the deadline counts again from each start
  (https://cloud.google.com/compute/docs/instances/limit-vm-runtime). The configured scheduling is
  still written with instances.setScheduling before the start (only allowed on a stopped VM), so a
  changed `max_run_hours` or termination action takes effect without an apply, at exactly the
  configured value, so Terraform's state still matches (the google provider stops a VM to change
  it: hasMaxRunDurationChanged in resource_compute_instance.go).
- A started VM gets a new ephemeral external IP; its internal IP stays
  (https://cloud.google.com/compute/docs/ip-addresses#ephemeraladdress).
- Guest attributes survive a stop, so an old "ok" proves nothing: a fresh nonce goes into the
  metadata first, and only "<nonce>:ok" counts (startup/startup.sh publishes it).
- SUSPENDED VMs are resumed (they keep their memory: no boot, no boot script); STOPPING and
  SUSPENDING ones are waited for.
- A deleted VM (idle action `delete`, termination action DELETE) is re-created by a targeted
  `terraform apply` that touches nothing else.
"""

from __future__ import annotations

import os
import time
from typing import Callable

from tfcluster.backends.gcp.cloud.compute import ComputeApi, pinned_host_key, wait_ready
from tfcluster.backends.gcp.cloud.errors import NoCapacity
from tfcluster.backends.gcp.cloud.terraform import Terraform
from tfcluster.backends.group import in_parallel
from tfcluster.errors import ClusterError
from tfcluster.state import ClusterState

NONCE_KEY = "tfcluster-boot-nonce"
STOPPED = ("TERMINATED", "STOPPED")
TRANSIENT = ("STOPPING", "SUSPENDING", "PROVISIONING", "STAGING", "REPAIRING")


def new_nonce() -> str:
    return os.urandom(6).hex()


def wait_until_settled(api: ComputeApi, zone: str, names: list[str], timeout: float = 300,
                       poll_seconds: float = 6.0) -> dict[str, object]:
    """Each VM (or None when deleted) once none is in a transitional state."""
    deadline = time.monotonic() + timeout
    while True:
        instances = {name: api.instance_or_none(zone, name) for name in names}
        moving = [name for name, vm in instances.items() if vm is not None and vm.status in TRANSIENT]
        if not moving:
            return instances
        if time.monotonic() > deadline:
            raise ClusterError(f"VM(s) {', '.join(moving)} still changing state after {timeout:.0f}s; "
                               "run `invoke up` again in a minute")
        time.sleep(poll_seconds)


def bring_back(cluster: ClusterState, api: ComputeApi, terraform: Terraform, max_run_seconds: int,
               termination_action: str, ready_timeout: float, announce: Callable[[str], None]) -> list[str]:
    """Start, resume or re-create every VM of the cluster that is not running; update the host
    records (addresses, host keys) in ``cluster``. Returns the instance names brought back."""
    zone = cluster.zone
    by_instance = {record.instance: record for record in cluster.hosts}
    instances = wait_until_settled(api, zone, list(by_instance))
    deleted = [name for name, vm in instances.items() if vm is None]
    stopped = [name for name, vm in instances.items() if vm is not None and vm.status in STOPPED]
    suspended = [name for name, vm in instances.items() if vm is not None and vm.status == "SUSPENDED"]
    if not (deleted or stopped or suspended):
        return []
    nonce = new_nonce()
    no_room: list[str] = []
    if stopped:
        announce(f"starting {len(stopped)} stopped VM(s): {', '.join(stopped)}; the hypervisor deadline "
                 f"({max_run_seconds / 3600:.4g} h, {termination_action}) is set again first")

        def start(name: str) -> None:
            api.set_metadata(zone, name, {NONCE_KEY: nonce})
            api.set_scheduling(zone, name, max_run_seconds, termination_action)
            try:
                api.start(zone, name)
            except NoCapacity:
                no_room.append(name)  # Stays stopped; the others carry on. Raised below.

        in_parallel(stopped, start, str, "starting VMs")
        stopped = [name for name in stopped if name not in no_room]
    if suspended:
        announce(f"resuming {len(suspended)} suspended VM(s): {', '.join(suspended)}")
        in_parallel(suspended, lambda name: api.resume(zone, name), str, "resuming VMs")
    if deleted:
        indexes = [cluster.hosts.index(by_instance[name]) for name in deleted]
        announce(f"re-creating {len(deleted)} deleted VM(s): {', '.join(deleted)} (terraform apply, "
                 "targeted: nothing else changes)")
        terraform.set_variables({"boot_nonce": nonce})
        terraform.apply([address for i in indexes for address in (
            f"google_compute_instance.worker[{i}]", f"google_compute_instance_iam_member.watchdog[{i}]")])
    booted = stopped + deleted
    wait_ready(api, zone, booted, ready_timeout, nonce=nonce)
    for name in booted + suspended:
        record, vm = by_instance[name], api.get_instance(zone, name)
        interface = vm.network_interfaces[0]
        record.address = interface.network_i_p
        record.ssh_address = interface.access_configs[0].nat_i_p if interface.access_configs else ""
    for name in booted:
        # Re-created VMs have new host keys; restarted ones keep theirs. Either way the key comes
        # from the guest agent's attributes, never from first contact.
        by_instance[name].host_key = pinned_host_key(api, zone, name)
    if no_room:
        raise ZoneFull(sorted(no_room), zone, booted + suspended)
    return booted + suspended


class ZoneFull(NoCapacity):
    """Some VMs could not start for lack of capacity; the others were brought back."""

    def __init__(self, instances: list[str], zone: str, started: list[str]):
        super().__init__(", ".join(instances), zone)
        # Instances still stopped, and those that did come back in the same pass.
        self.instances, self.started = instances, started


def bring_back_waiting(cluster: ClusterState, api: ComputeApi, terraform: Terraform, max_run_seconds: int,
                       termination_action: str, ready_timeout: float, announce: Callable[[str], None],
                       first_wait: float, tries: int, sleep: Callable[[float], None] = time.sleep) -> list[str]:
    """bring_back, trying again with backoff (doubling from ``first_wait``, at most 5 minutes) while
    the zone has no capacity (https://cloud.google.com/compute/docs/troubleshooting/troubleshooting-resource-availability:
    capacity changes often; try again later). Raises ZoneFull after ``tries`` starts."""
    back: list[str] = []
    wait = float(first_wait)
    for attempt in range(1, tries + 1):
        try:
            return back + bring_back(cluster, api, terraform, max_run_seconds, termination_action,
                                     ready_timeout, announce)
        except ZoneFull as full:
            back += full.started
            if attempt == tries:
                raise
            announce(f"zone {cluster.zone} has no capacity for {', '.join(full.instances)} right now "
                     f"(ZONE_RESOURCE_POOL_EXHAUSTED); trying again in {wait:.0f} s (start {attempt + 1} of {tries})")
            sleep(wait)
            wait = min(wait * 2, 300.0)
    return back
