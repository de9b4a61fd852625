"""Google's facts that no discovery document settles, each recorded once with its quote and source.

The discovery documents (tests/world/discovery.py), the client types and the provider schema say
which fields, methods and enum values exist. They do not say which series Monitoring publishes with
which labels, which SKUs the catalog sells, which reservation kinds Compute refuses a model for,
which APIs need a quota project, or which quota a Vertex AI job draws on. Those are prose on
Google's pages; each is here, once, and the stand-ins read them from here.

Where the pages leave a doubt, the fact lists its ``alternatives`` and the world can be run each
way (a switch on the stand-in names which); the product must answer ``?`` in every way it cannot
read, never ✓.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fact:
    """One fact as Google states it."""

    # Google's words (or the observed text, for an error).
    quote: str
    # Where they are: a page, or a repository path / thread.
    source: str
    # Where the pages leave a doubt: the ways the world can be run (the first is the world's default).
    alternatives: tuple = ()


# ---------------------------------------------------------------- Monitoring: family quota usage

FAMILY_USAGE_SERIES = Fact(
    quote=("Resource-specific quotas. Some services provide monitored resources that have resource-specific "
           "metrics for quotas. These metric types appear in groups of three, following this pattern: "
           "service/quota/quota-type/exceeded, service/quota/quota-type/limit, service/quota/quota-type/usage. "
           "[Compute's service config:] \"compute.googleapis.com/quota/cpus_per_vm_family/usage\", "
           "\"compute.googleapis.com/quota/gpus_per_gpu_family/usage\", "
           "\"compute.googleapis.com/quota/local_ssd_total_storage_per_vm_family/usage\", "
           "\"compute.googleapis.com/quota/preemptible_gpus_per_gpu_family/usage\" ... "
           "\"monitoredResource\": \"compute.googleapis.com/Location\""),
    source=("https://cloud.google.com/monitoring/alerts/using-quota-metrics (Working with quota metrics); "
            "Compute's monitoring.consumerDestinations in a real project's `gcloud services list --format=json` "
            "(a public repository's copy, read with the search tool 2026-11-28)"),
    # The family's label name on those series is on no page read offline: the Cloud Quotas dimension's own
    # name (gpu_family, vm_family), or a name the product does not know (so the series do not say their family).
    alternatives=("dimension", "unnamed"),
)
# Cloud Quotas quota ID -> (the Location series' metric type, the dimension naming the family).
FAMILY_USAGE_METRICS = {
    "GPUS-PER-GPU-FAMILY-per-project-region": ("compute.googleapis.com/quota/gpus_per_gpu_family/usage", "gpu_family"),
    "CPUS-PER-VM-FAMILY-per-project-region": ("compute.googleapis.com/quota/cpus_per_vm_family/usage", "vm_family"),
    "PREEMPTIBLE-GPUS-PER-GPU-FAMILY-per-project-region":
        ("compute.googleapis.com/quota/preemptible_gpus_per_gpu_family/usage", "gpu_family"),
    "LOCAL-SSD-TOTAL-GB-PER-VM-FAMILY-per-project-region":
        ("compute.googleapis.com/quota/local_ssd_total_storage_per_vm_family/usage", "vm_family"),
}
LOCATION_RESOURCE = "compute.googleapis.com/Location"

USAGE_POINTS_ARE_RARE = Fact(
    quote=("If no changes are received in quota usage, the last values are repeated at least every 24 hours."),
    source="https://cloud.google.com/monitoring/api/metrics_gcp (serviceruntime quota/allocation/usage)",
    # So a window shorter than a day may hold no point of a quota in use; tfcluster reads 25 hours, and a
    # quota with no point in it is unknown (?), never 0. The world runs with the series present or absent
    # (a project whose usage has not changed lately, or a real project where none is published).
    alternatives=("present", "absent"),
)

# ---------------------------------------------------------------- Cloud Billing Catalog: which SKUs exist

FLEX_START_DISCOUNT = Fact(
    quote=("For A4, A3, A2, and H4D machine types, you obtain vCPUs, memory, and any attached GPUs at a "
           "discounted price."),
    # The search tool found the page (its overview: "provision discounted compute resources") but not this
    # paragraph: the sentence is as issue 45 quotes the page.
    source="https://cloud.google.com/compute/docs/instances/about-flex-start-vms (Pricing)",
)
# Machine series whose Flex-start VMs bill at DWS prices (the catalog's "DWS Defined Duration" SKUs);
# every other series' Flex-start VMs (G2 with L4 among them) bill on-demand, and the catalog sells no DWS SKU for them.
FLEX_START_DISCOUNTED_SERIES = ("a4", "a3", "a2", "h4d")

# ---------------------------------------------------------------- Compute: reservation kinds

DENSE_RESERVATIONS = Fact(
    quote="Instances consuming DENSE reservations must use provisioningModel RESERVATION_BOUND",
    source=("skypilot-org/skypilot#9771 (the 400 Compute gave), fixed by #9779 reading Reservation.deploymentType; "
            "compute.v1.json: Reservation.deploymentType is DENSE or DEPLOYMENT_TYPE_UNSPECIFIED"),
)
RESERVATION_KINDS = ("DEPLOYMENT_TYPE_UNSPECIFIED", "DENSE")

PREEMPTIBLE_MIGRATE = Fact(
    quote="Scheduling must have preemptible be false when OnHostMaintenance isn't TERMINATE.",
    source=("Compute's 400 on instances.insert, quoted in travis-ci/worker#487 (a VM without GPUs) and "
            "lighttransport/francine#5; \"For preemptible instances, the default and only possible behavior is "
            "TERMINATE\" (compute.v1.json, Scheduling.onHostMaintenance)"),
)

# ---------------------------------------------------------------- quota project

QUOTA_PROJECT = Fact(
    quote=("Requests can fail if you make a request to a client-based API and the quota project cannot be "
           "identified. ... If the principal for the API call is a service account, including by impersonation, "
           "the project associated with the service account is used as the quota project."),
    source="https://cloud.google.com/docs/quotas/set-quota-project",
)
# What Google answers user credentials without one (the text users quote, e.g. openillumi.com's "Quota Project
# not set" write-up): 403 PERMISSION_DENIED.
NO_QUOTA_PROJECT_MESSAGE = ("Your application is authenticating by using local Application Default Credentials. "
                            "The {api} API requires a quota project, which is not set by default. To learn how to "
                            "set your quota project, see https://cloud.google.com/docs/authentication/adc-"
                            "troubleshooting/user-creds .")
# Cloud Quotas is client-based: its setup page sends x-goog-user-project
# (https://cloud.google.com/docs/quotas/development-environment). Monitoring's timeSeries.list names its
# project in the path (resource-based), but no page read says so outright: the world runs it both ways.
QUOTA_PROJECT_APIS = {"cloudquotas.googleapis.com": ("required",),
                      "monitoring.googleapis.com": ("not required", "required"),
                      "cloudbilling.googleapis.com": ("required",)}

# ---------------------------------------------------------------- Vertex AI: which quota a strategy draws

VERTEX_FLEX_START_QUOTA = Fact(
    quote=("Quota: Make sure you have sufficient Vertex AI preemptible quota before launching your job."),
    source=("https://cloud.google.com/vertex-ai/docs/predictions/use-flex-start-vms (Limitations and requirements); "
            "training's Flex-start is the same Dynamic Workload Scheduler, scheduling.strategy FLEX_START "
            "(https://cloud.google.com/vertex-ai/docs/training/schedule-jobs-dws)"),
)
# Scheduling.strategy -> the quota family its GPUs and CPUs draw on (custom_model_training_<kind>_...).
VERTEX_STRATEGY_QUOTA = {"STANDARD": "", "ON_DEMAND": "", "LOW_COST": "", "SPOT": "preemptible_",
                         "FLEX_START": "preemptible_"}

# ---------------------------------------------------------------- billing of a stopped VM

DISCARDED_LOCAL_SSD = Fact(
    quote=("If you stop a VM with Local SSD disks and discard the Local SSD data, you are not charged for "
           "the Local SSD disks while the VM is stopped."),
    # Not found by the search tool offline; as the issue states it, and as instances.stop's discardLocalSsd
    # parameter (compute.v1.json) implies.
    source="https://cloud.google.com/compute/docs/disks/local-ssd (Stop a VM with Local SSD)",
)

# ---------------------------------------------------------------- compact placement that cannot be satisfied

COMPACT_PLACEMENT_REFUSAL = Fact(
    # The only text found: a user's paste of Compute's answer to a3-highgpu-8g VMs under a COLLOCATED
    # policy with maxDistance 1 (the same user then got the VMs with AS_COMPACT). Compute's pages name no
    # error code or reason for it: define-instance-placement and use-compact-placement-policies say only
    # that a lower maximum distance "reduces the obtainability" of the VMs, and
    # troubleshooting-resource-availability lists the ZONE_/REGION_RESOURCE_POOL_EXHAUSTED codes, not a
    # placement one. So the doubt: whether it comes with one of those codes (a stock-out Compute words for the
    # policy) or with none. The world sends the message with no code (the first way) or with
    # ZONE_RESOURCE_POOL_EXHAUSTED (the second); the product reads the message, which is all the google
    # provider prints of an operation's error (errors.py, CAPACITY_TEXT), so it answers the same both ways.
    quote="No more than {room} instances of machine type {machine} can be created with this policy.",
    source=("dstackai/dstack#2586 (comment of 2025-04-30, pasting Compute's error); "
            "https://cloud.google.com/compute/docs/instances/use-compact-placement-policies (maximum distance); "
            "GoogleCloudPlatform/cluster-toolkit#2420 (a placement policy makes capacity harder to get)"),
    alternatives=("no code", "ZONE_RESOURCE_POOL_EXHAUSTED"),
)
