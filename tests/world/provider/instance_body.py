"""google_compute_instance's instances.insert body, expanded as hashicorp/google 7.x builds it.

Source: github.com/hashicorp/terraform-provider-google at v7.45.0 (the newest 7.x tag in the
mirror here; the committed schema is 7.46.1), google/services/compute/:
- resource_compute_instance.go, resourceComputeInstanceCreate: the body is the compute.Instance
  of expandComputeInstance, marshalled with the Go client's omitempty rules (an empty string,
  false, 0, an empty list or map is left out) except its ForceSendFields (canIpForward,
  deletionProtection; the three shielded VM booleans), then "scheduling" (expandScheduling, a
  raw map: its keys are sent even when false or empty), "params" (expandParams, {} when unset)
  and "metadata" (metadata.go resourceInstanceMetadata) set on top.
- compute_instance_helpers.go: expandScheduling, expandComputeMaxRunDuration,
  expandComputeOnInstanceStopAction, expandComputeLocalSsdRecoveryTimeout,
  expandNetworkInterfaces, expandAccessConfigs, expandServiceAccounts, resourceInstanceTags,
  expandShieldedVmConfigs, expandReservationAffinity, expandDisplayDevice; the boot disk is
  expandBootDisk and the GPUs expandInstanceGuestAccelerators (resource_compute_instance.go).
- Names become relative links (tpgresource/field_helpers.go: ZonalLinkTemplate
  "projects/%s/zones/%s/%s/%s", RegionalLinkTemplate "projects/%s/regions/%s/%s/%s"), scopes are
  canonicalised (tpgresource/service_scope.go, CanonicalizeServiceScope) and labels are the
  effective labels (tpgresource/labels.go, below).
- Schema defaults the SDK fills in before the expanders run (resource_compute_instance.go):
  boot_disk.auto_delete true, boot_disk.mode "READ_WRITE", scheduling.automatic_restart true,
  scheduling.preemptible false, on_instance_stop_action.discard_local_ssd false,
  shielded_instance_config enable_secure_boot false, enable_vtpm true, enable_integrity_monitoring
  true, can_ip_forward false, deletion_protection false.
One departure: where the provider sends a JSON null (an unset max_run_duration, "nodeAffinities":
[null] for no node affinities, hostErrorTimeoutSeconds), the stand-in leaves the key out; Google
treats both as unset.

Arguments the provider would expand but terraform/ never sets are refused by name (UNEXPANDED),
so a new one in terraform/ fails loudly here instead of being dropped; tests/test_provider_standins.py
checks that every argument terraform/ sets reaches the request.
Pure functions of the planned object: no `tf` import, so the tests can call them directly.
"""

from __future__ import annotations

import re

# tpgresource/service_scope.go, CanonicalizeServiceScope: gcloud's short names -> scope URLs;
# anything else is sent as written.
SCOPE_ALIASES = {
    "bigquery": "https://www.googleapis.com/auth/bigquery",
    "cloud-platform": "https://www.googleapis.com/auth/cloud-platform",
    "cloud-source-repos": "https://www.googleapis.com/auth/source.full_control",
    "cloud-source-repos-ro": "https://www.googleapis.com/auth/source.read_only",
    "compute-ro": "https://www.googleapis.com/auth/compute.readonly",
    "compute-rw": "https://www.googleapis.com/auth/compute",
    "datastore": "https://www.googleapis.com/auth/datastore",
    "logging-write": "https://www.googleapis.com/auth/logging.write",
    "monitoring": "https://www.googleapis.com/auth/monitoring",
    "monitoring-read": "https://www.googleapis.com/auth/monitoring.read",
    "monitoring-write": "https://www.googleapis.com/auth/monitoring.write",
    "pubsub": "https://www.googleapis.com/auth/pubsub",
    "service-control": "https://www.googleapis.com/auth/servicecontrol",
    "service-management": "https://www.googleapis.com/auth/service.management.readonly",
    "sql": "https://www.googleapis.com/auth/sqlservice",
    "sql-admin": "https://www.googleapis.com/auth/sqlservice.admin",
    "storage-full": "https://www.googleapis.com/auth/devstorage.full_control",
    "storage-ro": "https://www.googleapis.com/auth/devstorage.read_only",
    "storage-rw": "https://www.googleapis.com/auth/devstorage.read_write",
    "taskqueue": "https://www.googleapis.com/auth/taskqueue",
    "trace": "https://www.googleapis.com/auth/trace.append",
    "useraccounts-ro": "https://www.googleapis.com/auth/cloud.useraccounts.readonly",
    "useraccounts-rw": "https://www.googleapis.com/auth/cloud.useraccounts",
    "userinfo-email": "https://www.googleapis.com/auth/userinfo.email",
}
# The label the provider adds to what it creates (transport/config.go AttributionKey/Value;
# provider.go: add_terraform_attribution_label defaults to true since 6.0, strategy CREATION_ONLY).
ATTRIBUTION = ("goog-terraform-provisioned", "true")
# Arguments the provider expands into the body that terraform/ does not use: the stand-in
# refuses them rather than drop them (block or attribute name, at the top level or in a block).
UNEXPANDED = {
    "": ("advanced_machine_features", "attached_disk", "confidential_instance_config", "instance_encryption_key",
         "network_performance_config", "scratch_disk", "workload_identity_config"),
    "params": ("resource_manager_tags",),
    "boot_disk": ("disk_encryption_key_raw", "disk_encryption_key_rsa", "kms_key_self_link",
                  "disk_encryption_service_account", "source", "guest_os_features"),
    "initialize_params": ("source_image_encryption_key", "snapshot", "source_snapshot_encryption_key",
                          "resource_manager_tags", "resource_policies", "storage_pool", "replica_zones"),
    "scheduling": ("node_affinities",),
    "network_interface": ("alias_ip_range", "ipv6_access_config", "network_attachment"),
}


class Unexpanded(ValueError):
    """terraform/ set an argument the stand-in does not expand (UNEXPANDED)."""


def _one(items) -> dict:
    return (items or [{}])[0] or {}


def _set(value) -> bool:
    """The SDK's GetOk: set, and not the type's zero value."""
    return value not in (None, "", 0, False, [], {})


def canonical_scope(scope: str) -> str:
    return SCOPE_ALIASES.get(scope, scope)


def zonal_link(value: str, kind: str, project: str, zone: str) -> str:
    """ParseZonalFieldValue(...).RelativeLink(): a name, a relative link or a URL."""
    match = re.search(rf"projects/([^/]+)/zones/([^/]+)/{kind}/([^/]+)$", value)
    if match:
        return f"projects/{match[1]}/zones/{match[2]}/{kind}/{match[3]}"
    return f"projects/{project}/zones/{zone}/{kind}/{value}"


def regional_link(value: str, kind: str, project: str, region: str) -> str:
    match = re.search(rf"projects/([^/]+)/regions/([^/]+)/{kind}/([^/]+)$", value)
    if match:
        return f"projects/{match[1]}/regions/{match[2]}/{kind}/{match[3]}"
    return f"projects/{project}/regions/{region}/{kind}/{value}"


def global_link(value: str, kind: str, project: str) -> str:
    match = re.search(rf"projects/([^/]+)/global/{kind}/([^/]+)$", value)
    return f"projects/{match[1]}/global/{kind}/{match[2]}" if match else f"projects/{project}/global/{kind}/{value}"


def resolve_image(name: str) -> str:
    """image.go ResolveImage, for the forms it answers without an API call: a URL as given,
    projects/P/global/images/NAME and .../family/NAME as relative links, global/images/NAME.
    The short forms (NAME, P/NAME, family/NAME) need images.get lookups, which the stand-in
    does not make: terraform/ pins an exact image (variables.tf, image)."""
    if re.match(r"^https://www\.googleapis\.com/compute/[a-z0-9]+/projects/", name):
        return name
    match = re.search(r"projects/([^/]+)/global/images/(family/)?([-_a-zA-Z0-9]*)$", name)
    if match:
        return f"projects/{match[1]}/global/images/{match[2] or ''}{match[3]}"
    if re.fullmatch(r"global/images/(family/)?[-_a-zA-Z0-9]*", name):
        return name
    raise Unexpanded(f"the stand-in resolves only project-qualified images, not {name!r}")


def effective_labels(labels: dict | None, prior_effective: dict | None, creating: bool) -> dict:
    """tpgresource/labels.go setLabelsFields (SetLabelsDiff): the provider's default labels (none
    here), the attribution label when creating (CREATION_ONLY) or when the resource already has
    it, then the configuration's labels."""
    out = {}
    if creating or ATTRIBUTION[0] in (prior_effective or {}):
        out[ATTRIBUTION[0]] = ATTRIBUTION[1]
    out.update(labels or {})
    return out


def _refuse_unexpanded(where: str, block: dict) -> None:
    for name in UNEXPANDED.get(where, ()):
        if _set(block.get(name)):
            raise Unexpanded(f"google_compute_instance{'.' + where if where else ''}.{name} is set, and the "
                             "provider stand-in does not expand it (tests/world/provider/instance_body.py)")


def scheduling(planned: dict) -> dict:
    """expandScheduling: no block is {"automaticRestart": true}; otherwise every key of the
    block as the SDK reads it (defaults filled), durations and the stop action when given (unset,
    the provider sends them as null unless RESERVATION_BOUND, which leaves them out)."""
    blocks = planned.get("scheduling") or []
    if not blocks:
        return {"automaticRestart": True}
    block = blocks[0] or {}
    _refuse_unexpanded("scheduling", block)
    out = {"automaticRestart": True if block.get("automatic_restart") is None else bool(block["automatic_restart"]),
           "preemptible": bool(block.get("preemptible")),
           "onHostMaintenance": block.get("on_host_maintenance") or ""}
    if _set(block.get("min_node_cpus")):
        out["minNodeCpus"] = int(block["min_node_cpus"])
    out["provisioningModel"] = block.get("provisioning_model") or ""
    out["instanceTerminationAction"] = block.get("instance_termination_action") or ""
    if _set(block.get("availability_domain")):
        out["availabilityDomain"] = int(block["availability_domain"])
    for name, key in (("max_run_duration", "maxRunDuration"), ("local_ssd_recovery_timeout", "localSsdRecoveryTimeout")):
        duration = _one(block.get(name))
        if duration:
            out[key] = {k: int(duration[k]) for k in ("seconds", "nanos") if _set(duration.get(k))}
    stop = block.get("on_instance_stop_action") or []
    if stop:
        out["onInstanceStopAction"] = {"discardLocalSsd": bool((stop[0] or {}).get("discard_local_ssd"))}
    if _set(block.get("host_error_timeout_seconds")):
        out["hostErrorTimeoutSeconds"] = int(block["host_error_timeout_seconds"])
    if _set(block.get("termination_time")):
        out["terminationTime"] = block["termination_time"]
    return out


def boot_disk(planned: dict, project: str, zone: str) -> dict:
    """expandBootDisk, through compute.AttachedDisk (so false and empty values are left out)."""
    block = _one(planned.get("boot_disk"))
    _refuse_unexpanded("boot_disk", block)
    disk = {"boot": True}
    if block.get("auto_delete") is not False:  # Default true; false is the omitted zero value.
        disk["autoDelete"] = True
    for name, key in (("device_name", "deviceName"), ("interface", "interface")):
        if _set(block.get(name)):
            disk[key] = block[name]
    params_blocks = block.get("initialize_params") or []
    if params_blocks:
        params_block = params_blocks[0] or {}
        _refuse_unexpanded("initialize_params", params_block)
        params = {}
        if _set(params_block.get("size")):
            params["diskSizeGb"] = str(int(params_block["size"]))
        for name, key in (("provisioned_iops", "provisionedIops"), ("provisioned_throughput", "provisionedThroughput")):
            if _set(params_block.get(name)):
                params[key] = str(int(params_block[name]))
        if params_block.get("enable_confidential_compute"):
            params["enableConfidentialCompute"] = True
        if _set(params_block.get("type")):
            params["diskType"] = zonal_link(params_block["type"], "diskTypes", project, zone)
        if _set(params_block.get("image")):
            params["sourceImage"] = resolve_image(params_block["image"])
        if _set(params_block.get("labels")):
            params["labels"] = dict(params_block["labels"])
        if _set(params_block.get("architecture")):
            params["architecture"] = params_block["architecture"]
        disk["initializeParams"] = params
    disk["mode"] = block.get("mode") or "READ_WRITE"
    if block.get("force_attach"):
        disk["forceAttach"] = True
    return disk


def network_interfaces(planned: dict, project: str, region: str) -> list[dict]:
    """expandNetworkInterfaces: relative links for network and subnetwork, an access config of
    type ONE_TO_ONE_NAT per access_config block (natIP and networkTier only when given; the
    provider names none, Compute calls it "External NAT")."""
    out = []
    for block in planned.get("network_interface") or []:
        block = block or {}
        _refuse_unexpanded("network_interface", block)
        if not any(_set(block.get(k)) for k in ("network", "subnetwork", "network_attachment")):
            raise Unexpanded("exactly one of network, subnetwork, or network_attachment must be provided")
        interface = {}
        if _set(block.get("network_ip")):
            interface["networkIP"] = block["network_ip"]
        if _set(block.get("network")):
            interface["network"] = global_link(block["network"], "networks", project)
        if _set(block.get("vlan")):
            interface["vlan"] = int(block["vlan"])
        if _set(block.get("subnetwork")):
            interface["subnetwork"] = regional_link(block["subnetwork"], "subnetworks",
                                                    block.get("subnetwork_project") or project, region)
        configs = []
        for config in block.get("access_config") or []:
            config = config or {}
            access = {"type": "ONE_TO_ONE_NAT"}
            if _set(config.get("nat_ip")):
                access["natIP"] = config["nat_ip"]
            if _set(config.get("network_tier")):
                access["networkTier"] = config["network_tier"]
            if _set(config.get("public_ptr_domain_name")):
                access.update(setPublicPtr=True, publicPtrDomainName=config["public_ptr_domain_name"])
            configs.append(access)
        if configs:
            interface["accessConfigs"] = configs
        for name, key in (("nic_type", "nicType"), ("stack_type", "stackType"), ("ipv6_address", "ipv6Address"),
                          ("igmp_query", "igmpQuery")):
            if _set(block.get(name)):
                interface[key] = block[name]
        for name, key in (("queue_count", "queueCount"), ("internal_ipv6_prefix_length", "internalIpv6PrefixLength")):
            if _set(block.get(name)):
                interface[key] = int(block[name])
        out.append(interface)
    return out


def service_accounts(planned: dict) -> list[dict]:
    """expandServiceAccounts: email "default" when empty, scopes canonicalised (a set: sorted)."""
    return [{"email": (block or {}).get("email") or "default",
             "scopes": sorted({canonical_scope(s) for s in (block or {}).get("scopes") or []})}
            for block in planned.get("service_account") or []]


def guest_accelerators(planned: dict, project: str, zone: str) -> list[dict]:
    """expandInstanceGuestAccelerators: a count of 0 is skipped."""
    return [{"acceleratorCount": int(block["count"]),
             "acceleratorType": zonal_link(block["type"], "acceleratorTypes", project, zone)}
            for block in planned.get("guest_accelerator") or [] if int(block.get("count") or 0)]


def shielded_instance_config(planned: dict) -> dict | None:
    """expandShieldedVmConfigs: all three booleans, always sent (ForceSendFields)."""
    if not planned.get("shielded_instance_config"):
        return None
    block = _one(planned["shielded_instance_config"])
    default = {"enable_secure_boot": False, "enable_vtpm": True, "enable_integrity_monitoring": True}
    value = {name: default[name] if block.get(name) is None else bool(block[name]) for name in default}
    return {"enableSecureBoot": value["enable_secure_boot"], "enableVtpm": value["enable_vtpm"],
            "enableIntegrityMonitoring": value["enable_integrity_monitoring"]}


def reservation_affinity(planned: dict) -> dict | None:
    """expandReservationAffinity: consumeReservationType, and key/values for a specific one."""
    if not planned.get("reservation_affinity"):
        return None
    block = _one(planned["reservation_affinity"])
    specific = block.get("specific_reservation") or []
    if (block.get("type") == "SPECIFIC_RESERVATION") != bool(specific):
        raise Unexpanded("specific_reservation must be set when reservation_affinity is SPECIFIC_RESERVATION, "
                         "and not set otherwise")
    out = {"consumeReservationType": block.get("type")}
    if specific:
        out.update(key=_one(specific).get("key"), values=list(_one(specific).get("values") or []))
    return out


def metadata(planned: dict) -> dict:
    """metadata.go resourceInstanceMetadata: items sorted by key (metadata_startup_script becomes
    startup-script), the fingerprint only once there is one."""
    items = dict(planned.get("metadata") or {})
    script = planned.get("metadata_startup_script")
    if _set(script):
        if "startup-script" in items and items["startup-script"] != script:
            raise Unexpanded("Cannot provide both metadata_startup_script and metadata.startup-script.")
        items["startup-script"] = script
    if not items:
        return {}
    out = {"items": [{"key": key, "value": items[key]} for key in sorted(items)]}
    if _set(planned.get("metadata_fingerprint")):
        out["fingerprint"] = planned["metadata_fingerprint"]
    return out


def insert_body(planned: dict, project: str, zone: str) -> dict:
    """The instances.insert body for ``planned`` (the resource's planned object, defaults unfilled)."""
    _refuse_unexpanded("", planned)
    _refuse_unexpanded("params", _one(planned.get("params")))
    region = zone.rsplit("-", 1)[0]
    body = {
        "canIpForward": bool(planned.get("can_ip_forward")),
        "deletionProtection": bool(planned.get("deletion_protection")),
        "disks": [boot_disk(planned, project, zone)] if planned.get("boot_disk") else [],
        "machineType": zonal_link(planned["machine_type"], "machineTypes", project, zone),
        "name": planned["name"],
        "networkInterfaces": network_interfaces(planned, project, region),
        "serviceAccounts": service_accounts(planned),
    }
    tags = sorted(planned.get("tags") or [])
    body["tags"] = {"items": tags} if tags else {}
    labels = planned.get("effective_labels")
    if _set(labels):
        body["labels"] = dict(labels)
    for name, key in (("description", "description"), ("min_cpu_platform", "minCpuPlatform"),
                      ("hostname", "hostname"), ("key_revocation_action_type", "keyRevocationActionType")):
        if _set(planned.get(name)):
            body[key] = planned[name]
    if _set(planned.get("resource_policies")):
        body["resourcePolicies"] = list(planned["resource_policies"])
    accelerators = guest_accelerators(planned, project, zone)
    if accelerators:
        body["guestAccelerators"] = accelerators
    for key, value in (("reservationAffinity", reservation_affinity(planned)),
                       ("shieldedInstanceConfig", shielded_instance_config(planned))):
        if value is not None:
            body[key] = value
    if planned.get("enable_display"):
        body["displayDevice"] = {"enableDisplay": True}
    body["scheduling"] = scheduling(planned)
    body["params"] = {}
    body["metadata"] = metadata(planned)
    return body
