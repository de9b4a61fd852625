"""`invoke check --backend vertex` and `invoke offers --backend vertex`: what a project must offer
before a Vertex AI job can run, asked of Google.

- APIs and permissions: the gcp backend's own checks (Service Usage batchGet, Resource Manager
  testIamPermissions), with Vertex AI's lists below. The roles, from
  https://cloud.google.com/vertex-ai/docs/general/access-control and the IAM roles reference:
  roles/aiplatform.user holds aiplatform.customJobs.*; a job runs as the cluster's account, which
  needs iam.serviceAccounts.actAs on it ("Users submitting jobs must have act-as permission on this
  run-as account", CustomJobSpec.serviceAccount; roles/iam.serviceAccountUser); reading the job's
  logs needs logging.logEntries.list (roles/logging.viewer).
- Quota: Vertex AI's own training quota per accelerator and region, not Compute Engine's:
  aiplatform.googleapis.com/custom_model_training_nvidia_t4_gpus, with a preemptible_ form for Spot
  (https://cloud.google.com/vertex-ai/docs/quotas#training; the metric Vertex AI's 429 names,
  GoogleCloudPlatform/stable-diffusion-on-gcp#12). The Cloud Quotas API lists its QuotaInfos for
  service aiplatform.googleapis.com (ListQuotaInfos, the metric and a limit per region); it holds
  limits, not usage. Flex-start jobs draw on the preemptible ones too ("Make sure you have sufficient
  Vertex AI preemptible quota before launching your job",
  https://cloud.google.com/vertex-ai/docs/predictions/use-flex-start-vms). Every replica's vCPUs also
  count on custom_model_training_cpus (its preemptible_ form for Spot and Flex-start): "The following
  quota metrics exceed quota limits: aiplatform.googleapis.com/custom_model_training_preemptible_cpus"
  is the 429 a project whose limit is 1 gets (GoogleCloudPlatform/vertex-ai-samples#700, #3479).
- Offered: Vertex AI trains on Compute Engine's machines, so an accelerator no zone of the region
  offers (acceleratorTypes.aggregatedList, as `invoke offers` reads it) cannot train there either.
"""

from __future__ import annotations

from tfcluster import gpus
from tfcluster.backends.base import Finding
from tfcluster.provisioning import FLEX_START
from tfcluster.backends.gcp.access import (Google, Refused, credentials_finding, permissions_finding, services_finding,
                                           terraform_finding)
from tfcluster.backends.gcp.cloud import region_of
from tfcluster.backends.vertex import money
from tfcluster.backends.vertex.jobspec import ACCELERATORS

SERVICES = {
    "aiplatform.googleapis.com": "the training jobs",
    "logging.googleapis.com": "the jobs' logs",
    "storage.googleapis.com": "the cluster's bucket",
    "iam.googleapis.com": "the jobs' service account",
    "artifactregistry.googleapis.com": "the cluster's image registry",
    "cloudresourcemanager.googleapis.com": "permission checks",
    "cloudquotas.googleapis.com": "Vertex AI's training quota",
}
USER, SA_USER, LOGS, STORAGE, SA_ADMIN, REGISTRY = (
    "roles/aiplatform.user", "roles/iam.serviceAccountUser", "roles/logging.viewer", "roles/storage.admin",
    "roles/iam.serviceAccountAdmin", "roles/artifactregistry.admin")
PERMISSIONS = {
    "aiplatform.customJobs.create": (USER, "train"),
    "aiplatform.customJobs.get": (USER, "train, status"),
    "aiplatform.customJobs.list": (USER, "status, down"),
    "aiplatform.customJobs.cancel": (USER, "stop, down"),
    "iam.serviceAccounts.actAs": (SA_USER, "train: the jobs run as the cluster's account"),
    "logging.logEntries.list": (LOGS, "train, logs"),
    "storage.buckets.create": (STORAGE, "up"),
    "storage.objects.create": (STORAGE, "train"),
    "iam.serviceAccounts.create": (SA_ADMIN, "up"),
    "artifactregistry.repositories.create": (REGISTRY, "up"),
}
QUOTA_WORDS = {"t4": "nvidia_t4", "v100": "nvidia_v100", "l4": "nvidia_l4", "a100": "nvidia_a100",
               "a100-80gb": "nvidia_a100_80gb", "h100": "nvidia_h100"}
QUOTAS = "https://cloudquotas.googleapis.com/v1/projects/{project}/locations/global/services/aiplatform.googleapis.com/quotaInfos"


def quota_metric(gpu: str, spot: bool) -> str:
    return f"aiplatform.googleapis.com/custom_model_training_{'preemptible_' if spot else ''}{QUOTA_WORDS[gpu]}_gpus"


def cpu_quota_metric(preemptible: bool) -> str:
    return f"aiplatform.googleapis.com/custom_model_training_{'preemptible_' if preemptible else ''}cpus"


def draws_preemptible(settings) -> bool:
    """Whether the job's scheduling strategy draws the preemptible training quota: SPOT, and FLEX_START
    (module docstring)."""
    return bool(settings.spot) or settings.provisioning == FLEX_START


def quota_limits(google: Google, project: str, metric: str) -> dict[str, float]:
    """Region -> the limit Cloud Quotas lists for ``metric`` (a region with a row but no value: 0)."""
    found, token = {}, ""
    while True:
        page = google.call("GET", QUOTAS.format(project=project), params={"pageSize": 100, **({"pageToken": token}
                                                                                              if token else {})})
        for info in page.get("quotaInfos", []):
            if info.get("metric") != metric:
                continue
            for entry in info.get("dimensionsInfos", []):
                region = (entry.get("dimensions") or {}).get("region")
                for where in ([region] if region else entry.get("applicableLocations", [])):
                    found[where] = float((entry.get("details") or {}).get("value", 0))
        token = page.get("nextPageToken", "")
        if not token:
            return found


def quota_finding(google: Google, settings, region: str) -> Finding:
    """The region's training quotas the job draws on (its GPUs' and its vCPUs'), against what it needs."""
    preemptible = draws_preemptible(settings)
    try:
        vcpus = gpus.shape_of(settings.machine_type)[0]
    except KeyError:
        vcpus = 0
    wanted = ([(quota_metric(settings.gpu, preemptible), settings.workers * settings.gpu_count, "GPU(s)")]
              if settings.gpu_count else [])
    if vcpus:
        wanted.append((cpu_quota_metric(preemptible), settings.workers * vcpus, "vCPUs"))
    if not wanted:
        return Finding("quota", None, f"tfcluster does not know {settings.machine_type}'s vCPUs: Vertex AI's "
                                      f"{cpu_quota_metric(preemptible)} cannot be judged")
    short, unknown, held = [], [], []
    for metric, need, unit in wanted:
        try:
            limit = quota_limits(google, settings.project, metric).get(region)
        except Refused as error:
            return Finding("quota", None, f"cannot read {metric} in {region} ({error.why()}); enable "
                                          "cloudquotas.googleapis.com or ask for roles/cloudquotas.viewer")
        if limit is None:
            unknown.append(f"Cloud Quotas lists no {metric} for {region}")
        elif 0 <= limit < need:
            short.append(f"{metric} is {limit:g} in {region}, and a job of {settings.workers} replicas needs {need:g} "
                         f"{unit}")
        else:
            held.append(f"{metric} is {limit:g} in {region}; a job of {settings.workers} replicas needs {need:g} {unit}")
    if short:
        return Finding("quota", False, "; ".join(short) + ": request more (IAM & Admin > Quotas, service Vertex AI "
                                       "API), or use another region or GPU (`invoke offers --backend vertex`)")
    if unknown:
        return Finding("quota", None, "; ".join(unknown + held))
    return Finding("quota", True, "; ".join(held) + " (Cloud Quotas holds the limit, not what other jobs use now)")


def offered_finding(settings, region: str) -> Finding:
    from tfcluster.backends.gcp.cloud import ComputeApi

    if not settings.gpu_count:
        return Finding("offered", True, f"{settings.machine_type} without accelerators")
    accelerator = gpus.gpu(settings.gpu).accelerator
    try:
        zones = ComputeApi(settings.project).accelerator_zones(accelerator)
    except Exception as error:  # noqa: BLE001 - Compute's API off or refused: a ?, never a traceback.
        return Finding("offered", None, f"cannot tell where {ACCELERATORS[settings.gpu]} trains ({type(error).__name__}); "
                                        "see https://cloud.google.com/vertex-ai/docs/general/locations#accelerators")
    here = sorted(zone for zone in zones if region_of(zone) == region)
    if not here:
        others = sorted({region_of(zone) for zone in zones})
        return Finding("offered", False, f"no zone of {region} offers {accelerator}, so Vertex AI cannot train on "
                                         f"{ACCELERATORS[settings.gpu]} there: use --region "
                                         f"{' or '.join(others[:4]) or 'another region'}")
    return Finding("offered", True, f"{ACCELERATORS[settings.gpu]} in {', '.join(here)} ({settings.machine_type})")


def run(settings, region: str) -> list[Finding]:
    findings = [terraform_finding()]
    credentials_line, credentials = credentials_finding()
    findings.append(credentials_line)
    if credentials is None:
        return findings + [Finding("Google Cloud", None, "not checked without credentials: APIs, permissions, "
                                                         "quota, accelerators")]
    google = Google(credentials)
    findings += [services_finding(google, settings.project, SERVICES),
                 permissions_finding(google, settings.project, PERMISSIONS),
                 quota_finding(google, settings, region), offered_finding(settings, region)]
    config = {"machine_type": settings.machine_type, "gpu": settings.gpu, "gpu_count": settings.gpu_count,
              "spot": settings.spot, "boot_disk_gb": settings.boot_disk_gb}
    findings.append(Finding("price", True, f"${money.hourly(config, settings.workers):.2f}/hour for a job of "
                                           f"{settings.workers} replicas at Vertex AI's training prices "
                                           f"({money.table()['date']}, {money.table()['region']})"))
    return findings


def offers(settings) -> list[str]:
    """`invoke offers --backend vertex`: each region whose zones offer the GPU, one replica's price at
    Vertex AI's training prices (on-demand and Spot) and the region's training quota."""
    from tfcluster.backends.gcp.cloud import ComputeApi, default_credentials

    model = gpus.gpu(settings.gpu)
    zones = ComputeApi(settings.project).accelerator_zones(model.accelerator)
    regions = sorted({region_of(zone) for zone in zones})
    google = Google(default_credentials())
    try:
        limits = quota_limits(google, settings.project, quota_metric(model.name, draws_preemptible(settings)))
    except Refused as error:
        limits, unread = {}, error.why()
    else:
        unread = ""
    rates = {spot: money.replica_rates(settings.machine_type, model.name, settings.gpu_count, spot)
             for spot in (False, True)}
    hour = {spot: rates[spot]["vm"] + rates[spot]["gpu"] for spot in (False, True)}
    table = money.table()
    rows = [f"{'region':<26} {'on-demand/h':>12} {'spot/h':>10} {'quota':>8}"]
    for region in sorted(regions, key=lambda r: -(limits.get(r) or 0)):
        limit = limits.get(region)
        rows.append(f"{region:<26} {f'${hour[False]:.2f}':>12} {f'${hour[True]:.2f}':>10} "
                    f"{'?' if limit is None else f'{limit:g}':>8}")
    return [f"{model.name} on Vertex AI: {len(regions)} region(s) offer {ACCELERATORS[model.name]}; one replica is "
            f"{settings.machine_type} with {settings.gpu_count} GPU(s); quota: the region's "
            f"{quota_metric(model.name, draws_preemptible(settings))} limit" + (f" (unreadable: {unread})" if unread else ""),
            *rows, f"prices: Vertex AI training, {table['region']} list prices of {table['date']} for every region "
                   f"(other regions differ by up to ~20%): {table['source'][:200]}..."]
