"""The Compute Engine calls tfcluster makes (google-cloud-compute over REST): quotas (read by
quota_source.py), readiness from guest attributes, host keys published by the guest agent."""

from __future__ import annotations

import time
from typing import Callable

from tfcluster import gpus
from tfcluster.backends.gcp.cloud.errors import NoCapacity, capacity_code, is_rate_limit
from tfcluster.errors import ClusterError, ConfigError, HostErrors

LABEL = "tfcluster-cluster"


# Rate limits and brief unavailability (503) are retried with exponential backoff before they
# become an error (https://cloud.google.com/compute/docs/api-rate-limits: "retry with exponential
# backoff"); every call below is safe to repeat (reads, or writes that converge). Compute answers
# a rate limit with 403 and reason rateLimitExceeded (same page), newer front ends with 429.
RETRY_DELAYS = (1.0, 2.0, 4.0, 8.0)


def _rate_limited(error) -> bool:
    from google.api_core import exceptions

    if isinstance(error, (exceptions.TooManyRequests, exceptions.ServiceUnavailable)):
        return True
    return isinstance(error, exceptions.GoogleAPICallError) and is_rate_limit(error)


def _with_backoff(method):
    import functools

    @functools.wraps(method)
    def call(*args, **kwargs):
        from google.api_core import exceptions

        for delay in (*RETRY_DELAYS, None):
            try:
                return method(*args, **kwargs)
            except exceptions.GoogleAPICallError as error:
                if delay is None or not _rate_limited(error):
                    raise
                time.sleep(delay)

    return call


def _retrying(cls):
    """Every public method of ``cls`` retried with backoff (see RETRY_DELAYS)."""
    for name, value in list(vars(cls).items()):
        if callable(value) and not name.startswith("_"):
            setattr(cls, name, _with_backoff(value))
    return cls


@_retrying
class ComputeApi:
    """The few Compute Engine calls tfcluster makes, through google-cloud-compute (REST)."""

    def __init__(self, project: str):
        from google.cloud import compute_v1

        self.project = project
        kwargs = {"transport": "rest", "credentials": default_credentials()}
        self.client_kwargs = kwargs
        self.compute_v1 = compute_v1
        self.accelerators = compute_v1.AcceleratorTypesClient(**kwargs)
        self.regions = compute_v1.RegionsClient(**kwargs)
        self.projects = compute_v1.ProjectsClient(**kwargs)
        self.instances = compute_v1.InstancesClient(**kwargs)
        self.zone_operations = compute_v1.ZoneOperationsClient(**kwargs)

    def accelerator_types(self, zone: str) -> dict[str, int]:
        """GPU model -> most cards one VM may have (acceleratorTypes.maximumCardsPerInstance)."""
        return {item.name: item.maximum_cards_per_instance
                for item in self.accelerators.list(project=self.project, zone=zone)}

    def accelerator_zones(self, accelerator: str) -> dict[str, int]:
        """Zone -> most cards per VM, for every zone offering ``accelerator``: one
        acceleratorTypes.aggregatedList call (its pages), filtered by name."""
        request = self.compute_v1.AggregatedListAcceleratorTypesRequest(project=self.project,
                                                                        filter=f"name = {accelerator}")
        return {item.zone.rsplit("/", 1)[-1]: item.maximum_cards_per_instance
                for _, scoped in self.accelerators.aggregated_list(request=request)
                for item in scoped.accelerator_types if item.name == accelerator}

    def all_region_quotas(self) -> dict[str, dict[str, tuple[float, float]]]:
        """Region -> {metric: (limit, usage)}, from one regions.list call (its pages)."""
        return {region.name: {quota.metric: (quota.limit, quota.usage) for quota in region.quotas}
                for region in self.regions.list(project=self.project)}

    def region_quotas(self, region: str) -> dict[str, tuple[float, float]]:
        region_info = self.regions.get(project=self.project, region=region)
        return {quota.metric: (quota.limit, quota.usage) for quota in region_info.quotas}

    def project_quotas(self) -> dict[str, tuple[float, float]]:
        project_info = self.projects.get(project=self.project)
        return {quota.metric: (quota.limit, quota.usage) for quota in project_info.quotas}

    def guest_attributes(self, zone: str, instance: str, query_path: str) -> dict[str, str] | None:
        """{key: value} under ``query_path`` (e.g. "tfcluster/"), or None when nothing is there yet."""
        from google.api_core import exceptions

        try:
            request = self.compute_v1.GetGuestAttributesInstanceRequest(
                project=self.project, zone=zone, instance=instance, query_path=query_path)
            result = self.instances.get_guest_attributes(request=request)
        except exceptions.NotFound:
            return None
        return {item.key: item.value for item in result.query_value.items}

    def get_instance(self, zone: str, name: str):
        return self.instances.get(project=self.project, zone=zone, instance=name)

    def set_metadata(self, zone: str, name: str, changes: dict[str, str]) -> None:
        """Update some metadata keys, keeping the rest; the fingerprint guards against races."""
        instance = self.get_instance(zone, name)
        items = {item.key: item.value for item in instance.metadata.items}
        items.update(changes)
        metadata = self.compute_v1.Metadata(
            fingerprint=instance.metadata.fingerprint,
            items=[self.compute_v1.Items(key=key, value=value) for key, value in sorted(items.items())])
        self.instances.set_metadata(project=self.project, zone=zone, instance=name,
                                    metadata_resource=metadata).result(timeout=120)

    def stop(self, zone: str, name: str) -> None:
        """Stop a VM and return once its operation is DONE (the VM is then TERMINATED; instances/stop:
        "Stops a running instance, shutting it down cleanly"). A VM with Local SSD (bundled with A3 High
        and A2 Ultra) is stopped with discardLocalSsd: the parameter "is required if the instance has
        any attached Local SSD disks" (compute.v1.json, instances.stop), and a stop without it is refused
        (400 "VM has a Local SSD attached but an undefined value for `discard-local-ssd`",
        skypilot-org/skypilot#2586); tfcluster keeps nothing there (checkpoints are in the bucket)."""
        request = self.compute_v1.StopInstanceRequest(project=self.project, zone=zone, instance=name)
        if has_local_ssd(self.get_instance(zone, name)):
            request.discard_local_ssd = True
        self.instances.stop(request=request).result(timeout=300)

    def start(self, zone: str, name: str) -> None:
        """Start a stopped VM and return once its operation is DONE (result() polls
        zoneOperations.get); NoCapacity when the zone has no hardware for it right now."""
        from google.api_core import exceptions

        try:  # A full zone may refuse the request itself, or fail its operation.
            self.instances.start(project=self.project, zone=zone, instance=name).result(timeout=300)
        except exceptions.GoogleAPICallError as error:
            if capacity_code(error):
                raise NoCapacity(name, zone) from None
            raise

    def preempted_at(self, zone: str, names: list[str], since: float = 0.0) -> dict[str, float]:
        """Instance name -> when Google preempted it (epoch seconds), for preemptions after ``since``:
        the compute.instances.preempted operations of the zone
        (https://cloud.google.com/compute/docs/instances/create-use-preemptible#detecting_if_an_instance_was_preempted)."""
        from datetime import datetime

        request = self.compute_v1.ListZoneOperationsRequest(
            project=self.project, zone=zone, filter='operationType="compute.instances.preempted"')
        found: dict[str, float] = {}
        for operation in self.zone_operations.list(request=request):
            name = operation.target_link.rsplit("/", 1)[-1]
            stamp = operation.insert_time or operation.end_time
            at = datetime.fromisoformat(stamp).timestamp() if stamp else 0.0
            if name in names and at >= since:
                found[name] = max(at, found.get(name, 0.0))
        return found

    def list_cluster(self, zone: str, cluster: str) -> list:
        request = self.compute_v1.ListInstancesRequest(project=self.project, zone=zone,
                                                       filter=f"labels.{LABEL}={cluster}")
        return list(self.instances.list(request=request))

    def instance_or_none(self, zone: str, name: str):
        """The instance, or None when Compute Engine answers 404 (deleted)."""
        from google.api_core import exceptions

        try:
            return self.get_instance(zone, name)
        except exceptions.NotFound:
            return None

    def set_scheduling(self, zone: str, name: str, max_run_seconds: int, termination_action: str) -> None:
        """Put back the hypervisor deadline a stop cleared (instances.setScheduling on a stopped VM;
        https://cloud.google.com/compute/docs/instances/limit-vm-runtime). The rest of the
        scheduling block is kept as it is."""
        scheduling = self.get_instance(zone, name).scheduling
        scheduling.max_run_duration = self.compute_v1.Duration(seconds=max_run_seconds)
        scheduling.instance_termination_action = termination_action
        self.instances.set_scheduling(project=self.project, zone=zone, instance=name,
                                      scheduling_resource=scheduling).result(timeout=120)

    def resume(self, zone: str, name: str) -> None:
        self.instances.resume(project=self.project, zone=zone, instance=name).result(timeout=300)

    def delete(self, zone: str, name: str) -> None:
        """Delete a VM and return once its operation is DONE (instances.delete); restart.bring_back then
        re-creates it as any deleted VM, and Compute places the new one on other hardware."""
        self.instances.delete(project=self.project, zone=zone, instance=name).result(timeout=300)

    def leftovers(self, zone: str, cluster: str) -> list[str]:
        """What a destroyed cluster could still have billing, found without guessing from names
        (a project's own "default-allow-ssh" is not cluster "default"'s): instances, disks and
        addresses by the cluster's label; firewall rules and subnetworks by their network, the
        cluster's own (terraform/network.tf: CLUSTER-net); that network by its exact name."""
        region = region_of(zone)
        network = f"/projects/{self.project}/global/networks/{cluster_network(cluster)}"
        label = f"labels.{LABEL}={cluster}"
        v1 = self.compute_v1
        found = [f"instance {vm.name}" for vm in self.list_cluster(zone, cluster)]
        found += [f"disk {disk.name}" for disk in v1.DisksClient(**self.client_kwargs).list(
            request=v1.ListDisksRequest(project=self.project, zone=zone, filter=label))]
        found += [f"address {a.name}" for a in v1.AddressesClient(**self.client_kwargs).list(
            request=v1.ListAddressesRequest(project=self.project, region=region, filter=label))]
        found += [f"firewall rule {f.name}" for f in v1.FirewallsClient(**self.client_kwargs).list(
            project=self.project) if f.network.endswith(network)]
        found += [f"subnetwork {n.name}" for n in v1.SubnetworksClient(**self.client_kwargs).list(
            project=self.project, region=region) if n.network.endswith(network)]
        found += [f"network {n.name}" for n in v1.NetworksClient(**self.client_kwargs).list(
            project=self.project) if n.name == cluster_network(cluster)]
        return found


def has_local_ssd(vm) -> bool:
    """Whether an instance has Local SSD: a SCRATCH disk, or a machine type that bundles it (gpus.py)."""
    return (any(disk.type_ == "SCRATCH" for disk in vm.disks)
            or gpus.local_ssd_gb(vm.machine_type.rsplit("/", 1)[-1]) > 0)


def cluster_network(cluster: str) -> str:
    """The cluster's VPC network, as terraform/network.tf names it."""
    return f"{cluster}-net"


def default_credentials():
    """Application Default Credentials, or a ConfigError that says how to get them."""
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    except DefaultCredentialsError:
        raise ConfigError("no Google Cloud credentials; run `gcloud auth application-default login` "
                          "(or set GOOGLE_APPLICATION_CREDENTIALS to a key file)") from None
    return credentials


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def gpu_type(name: str) -> str:
    """The accelerator type of a GPU name (t4 -> nvidia-tesla-t4)."""
    model = gpus.gpu(name)
    if model is None:
        raise ConfigError(f"gpu must be one of {', '.join(gpus.GPUS)} (got {name!r})")
    return model.accelerator


# Google allows about 10 guest-attribute queries per minute per VM and may drop attributes being
# written above that (https://cloud.google.com/compute/docs/metadata/manage-guest-attributes):
# readiness asks each VM at most once per READY_POLL_SECONDS.
READY_POLL_SECONDS = 6.0


def wait_ready(api: ComputeApi, zone: str, names: list[str], timeout: float,
               on_progress: Callable[[dict[str, str]], None] = lambda states: None,
               poll_seconds: float = READY_POLL_SECONDS, clock: Callable[[], float] = time.monotonic,
               nonce: str = "") -> None:
    """Poll each VM's tfcluster/ready guest attribute until all say "<nonce>:ok"; name the VM otherwise.

    The boot script publishes "<nonce>:<state>" with the nonce `up` put in the metadata just before
    this boot; guest attributes survive a stop, so an answer with another nonce is an old boot's.
    """
    states = {name: "booting" for name in names}
    deadline = clock() + timeout
    while True:
        for name in names:
            if states[name] == "ok" or states[name].startswith("error"):
                continue
            value = (api.guest_attributes(zone, name, "tfcluster/") or {}).get("ready", "")
            seen, _, state = value.partition(":")
            states[name] = state if seen == nonce and state else "booting"
        on_progress(dict(states))
        errors = {name: state for name, state in states.items() if state.startswith("error")}
        if errors:
            raise HostErrors("VM start-up", errors)
        if all(state == "ok" for state in states.values()):
            return
        if clock() > deadline:
            late = {name: f"not ready after {timeout:.0f}s (last: {state}); see its serial console: "
                          f"gcloud compute instances get-serial-port-output {name} --zone {zone}"
                    for name, state in states.items() if state != "ok"}
            raise HostErrors("waiting for the VMs", late)
        time.sleep(poll_seconds)


def pinned_host_key(api: ComputeApi, zone: str, name: str) -> str:
    """The VM's SSH host key as published by its guest agent (hostkeys/), never from first contact."""
    keys = api.guest_attributes(zone, name, "hostkeys/") or {}
    for key_type in ("ssh-ed25519", "ecdsa-sha2-nistp256", "ssh-rsa"):
        if keys.get(key_type):
            return f"{key_type} {keys[key_type].split()[-1] if ' ' in keys[key_type] else keys[key_type]}"
    raise ClusterError(f"{name} published no SSH host key in its guest attributes (hostkeys/); "
                       "enable-guest-attributes must be TRUE and the guest agent running")
