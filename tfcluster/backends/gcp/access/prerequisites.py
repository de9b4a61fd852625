"""What a Google Cloud project must offer before `invoke up` creates anything: the APIs, the
operator's permissions (each with the predefined role that holds it), the organisation policy
constraints that would refuse the VMs or break their readiness, and the boot image's driver.

Pure data and rules, no calls: tfcluster/backends/gcp/access/check.py asks Google and judges with these.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

# The APIs terraform/ and the product call (Service Usage names), and what each is for.
SERVICES = {
    "compute.googleapis.com": "VMs, network, firewall, quotas",
    "storage.googleapis.com": "the cluster's bucket",
    "iam.googleapis.com": "the VMs' service accounts and the watchdog's custom role",
    "artifactregistry.googleapis.com": "the cluster's image registry",
    "cloudresourcemanager.googleapis.com": "permission checks and the provider's project lookups",
}
# Needed only by a cluster that takes a family quota (H100, G2 and A3: quota.py): an N1/T4 cluster's quotas
# are all in regions.get, so these being off must not stop its `up`.
FAMILY_QUOTA_SERVICES = {
    "cloudquotas.googleapis.com": "the quotas Compute's regions.get does not report (H100, G2 and A3 families)",
    "monitoring.googleapis.com": "how much of those quotas is in use",
}


def services_for(family_quotas: bool) -> dict:
    """The APIs a cluster needs: every one, or without the family quotas' when it takes none."""
    return {**SERVICES, **(FAMILY_QUOTA_SERVICES if family_quotas else {})}

# The predefined roles the permission hint names (tfcluster/backends/gcp/cloud/errors.py), and what each
# holds of what follows; checked against https://cloud.google.com/iam/docs/understanding-roles.
COMPUTE, STORAGE, SA_ADMIN, SA_USER, ROLE_ADMIN, REGISTRY, USAGE = (
    "roles/compute.admin", "roles/storage.admin", "roles/iam.serviceAccountAdmin", "roles/iam.serviceAccountUser",
    "roles/iam.roleAdmin", "roles/artifactregistry.admin", "roles/serviceusage.serviceUsageConsumer")

# permission -> (the role that holds it, the commands that need it).
PERMISSIONS = {
    "compute.instances.create": (COMPUTE, "up"),
    "compute.instances.setIamPolicy": (COMPUTE, "up"),
    "compute.disks.create": (COMPUTE, "up"),
    "compute.networks.create": (COMPUTE, "up"),
    "compute.subnetworks.create": (COMPUTE, "up"),
    "compute.firewalls.create": (COMPUTE, "up"),
    "compute.regions.get": (COMPUTE, "up"),
    "compute.acceleratorTypes.list": (COMPUTE, "up"),
    "compute.instances.getGuestAttributes": (COMPUTE, "up, train"),
    "compute.instances.setMetadata": (COMPUTE, "train, idle"),
    # Moving a VM off announced host maintenance mid-run (tfcluster/commands/maintenance.py).
    "compute.instances.stop": (COMPUTE, "train"),
    "compute.instances.delete": (COMPUTE, "down"),
    "compute.networks.delete": (COMPUTE, "down"),
    "compute.firewalls.delete": (COMPUTE, "down"),
    "storage.buckets.create": (STORAGE, "up"),
    "storage.buckets.setIamPolicy": (STORAGE, "up"),
    "storage.objects.list": (STORAGE, "train, down"),
    "storage.buckets.delete": (STORAGE, "down"),
    "iam.serviceAccounts.create": (SA_ADMIN, "up"),
    "iam.serviceAccounts.delete": (SA_ADMIN, "down"),
    # `down` lists the project's accounts to prove none of the cluster's VMs' is left (iam.py).
    "iam.serviceAccounts.list": (SA_ADMIN, "down"),
    # Attaching the service account to the VMs (https://cloud.google.com/iam/docs/service-accounts-actas).
    "iam.serviceAccounts.actAs": (SA_USER, "up"),
    "iam.roles.create": (ROLE_ADMIN, "up"),
    "iam.roles.delete": (ROLE_ADMIN, "down"),
    "artifactregistry.repositories.create": (REGISTRY, "up"),
    "artifactregistry.repositories.setIamPolicy": (REGISTRY, "up"),
    "artifactregistry.repositories.uploadArtifacts": (REGISTRY, "image build"),
    "artifactregistry.repositories.delete": (REGISTRY, "down"),
    # Live prices from the Cloud Billing Catalog on the project's quota.
    "serviceusage.services.use": (USAGE, "up (live prices)"),
}

# The boot image's NVIDIA driver branch, from the Deep Learning VM family name
# (https://cloud.google.com/deep-learning-vm/docs/images: "...-nvidia-580").
DRIVER_BRANCH = re.compile(r"-nvidia-(\d{3})(?:-|$)")
# "The R580 driver branch is the last to support Volta" (NVIDIA's data-center driver release notes).
VOLTA_LAST_BRANCH = 580


def driver_fits(accelerator: str, branch: int) -> str:
    """"" when driver ``branch`` supports the GPU, else why not (the bounds are tfcluster/gpus.py's)."""
    from tfcluster import gpus

    model = gpus.BY_ACCELERATOR.get(accelerator)
    if model is None:
        return ""
    if model.driver_max is not None and branch > model.driver_max:
        return f"{model.name.upper()} ({model.arch}) needs {model.driver_max} or older"
    if model.driver_min is not None and branch < model.driver_min:
        return f"{model.name.upper()} ({model.arch}) needs {model.driver_min} or newer"
    return ""


@dataclass(frozen=True)
class Target:
    """What the cluster would be, as the constraints judge it."""

    project: str
    zone: str
    instances: list[str]  # The VMs' names, as terraform/instances.tf makes them.
    image_project: str  # The boot image's project.

    @property
    def region(self) -> str:
        return self.zone.rsplit("-", 1)[0]


@dataclass(frozen=True)
class Constraint:
    """An organisation policy constraint and why tfcluster cannot live with it."""

    name: str  # Without the "constraints/" prefix, as orgpolicy v2 names policies.
    boolean: bool  # Enforced or not; else a list constraint of allowed and denied values.
    why: str  # What breaks, for the ✗ line.
    # For list constraints: the values the cluster needs allowed.
    values: Callable[[Target], list[str]] = lambda target: []
    # A managed constraint (compute.managed.*): Org Policy v2 only; Resource Manager v1 cannot express it.
    managed: bool = False


# https://cloud.google.com/resource-manager/docs/organization-policy/org-policy-constraints
CONSTRAINTS = [
    Constraint("compute.requireOsLogin", True,
               "the VMs take the cluster's SSH key from metadata (enable-oslogin=false), which it rejects"),
    Constraint("compute.vmExternalIpAccess", False,
               "the VMs need an external IP: SSH comes from your address", lambda t: [
                   f"projects/{t.project}/zones/{t.zone}/instances/{name}" for name in t.instances]),
    Constraint("compute.requireShieldedVm", True,
               "it requires Secure Boot, and the image's NVIDIA kernel modules are not signed for it"),
    Constraint("compute.disableGuestAttributesAccess", True,
               "readiness and the VMs' host keys are read from guest attributes"),
    Constraint("compute.trustedImageProjects", False,
               "the boot image's project must be trusted", lambda t: [f"projects/{t.image_project}"]),
    Constraint("gcp.resourceLocations", False,
               "the VMs, bucket and registry are created in the zone's region", lambda t: [t.zone]),
    Constraint("iam.disableServiceAccountCreation", True,
               "terraform creates one service account per cluster for its VMs"),
    # Managed constraints, "a direct replacement for legacy compute.* constraints"
    # (https://cloud.google.com/compute/docs/access/managed-constraints); enforced, each refuses as its
    # legacy one does. vmExternalIpAccess takes parameters (which VMs may have an address): an enforced
    # rule with parameters cannot be judged here (?).
    Constraint("compute.managed.requireOsLogin", True,
               "the VMs take the cluster's SSH key from metadata (enable-oslogin=false), which it rejects", managed=True),
    Constraint("compute.managed.vmExternalIpAccess", True,
               "the VMs need an external IP: SSH comes from your address", managed=True),
    Constraint("compute.managed.disableGuestAttributesAccess", True,
               "readiness and the VMs' host keys are read from guest attributes", managed=True),
]


def v1_rules(policy: dict) -> list[dict]:
    """Resource Manager v1's effective OrgPolicy (booleanPolicy.enforced; listPolicy allValues,
    allowedValues, deniedValues; https://cloud.google.com/resource-manager/reference/rest/v1/Policy)
    as Org Policy v2 rules, for judge()."""
    if "booleanPolicy" in policy:
        return [{"enforce": bool((policy["booleanPolicy"] or {}).get("enforced"))}]
    listed = policy.get("listPolicy") or {}
    if listed.get("allValues") == "ALLOW":
        return [{"allowAll": True}]
    if listed.get("allValues") == "DENY":
        return [{"denyAll": True}]
    values = {key: listed[key] for key in ("allowedValues", "deniedValues") if listed.get(key)}
    return [{"values": values}] if values else []


def _location_matches(value: str, zone: str) -> bool | None:
    """Whether a gcp.resourceLocations value covers the zone; None when only Google knows (a value
    group tfcluster cannot expand). Values: "zones:Z", "regions:R", "in:R-locations", "in:MULTI-locations"
    (https://cloud.google.com/resource-manager/docs/organization-policy/defining-locations)."""
    region = zone.rsplit("-", 1)[0]
    plain = value.removeprefix("zones:").removeprefix("regions:")
    if value.startswith("in:"):
        group = value[3:].removesuffix("-locations")
        if group in (region, zone):
            return True
        if group == region.split("-")[0]:  # "in:us-locations" holds every us-* region.
            return True
        return None
    return plain in (zone, region)


def judge(constraint: Constraint, rules: list[dict], target: Target) -> tuple[bool | None, str]:
    """(holds, detail) for an effective policy's rules (orgpolicy v2 PolicySpec.rules: enforce,
    allowAll, denyAll, values.allowedValues/deniedValues); holds is None when it cannot be told."""
    if constraint.boolean:
        enforced = [rule for rule in rules if rule.get("enforce")]
        if enforced and any(rule.get("parameters") for rule in enforced):
            return None, f"enforced with parameters tfcluster cannot judge ({constraint.why}); ask your admin"
        return (False, f"enforced: {constraint.why}") if enforced else (True, "not enforced")
    if not rules or any(rule.get("allowAll") for rule in rules):
        return True, "allows all"
    if any(rule.get("denyAll") for rule in rules):
        return False, f"denies all: {constraint.why}"
    allowed = [v for rule in rules for v in (rule.get("values") or {}).get("allowedValues", [])]
    denied = [v for rule in rules for v in (rule.get("values") or {}).get("deniedValues", [])]
    unsure = []
    for needed in constraint.values(target):
        def covers(value: str) -> bool | None:
            if constraint.name == "gcp.resourceLocations":
                return _location_matches(value, needed)
            return value.removeprefix("is:") == needed
        if any(covers(value) for value in denied):
            return False, f"denies {needed}: {constraint.why}"
        answers = [covers(value) for value in allowed]
        if allowed and not any(answers):
            if None in answers:
                unsure.append(needed)
                continue
            return False, f"does not allow {needed}: {constraint.why}"
    if unsure:
        return None, f"cannot tell whether {', '.join(allowed)} covers {', '.join(unsure)}"
    return True, "allows the cluster"
