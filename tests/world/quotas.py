"""The world's quota table: Compute's allocation quotas with a new project's limits, the family
quotas only the Cloud Quotas API holds, and the usage the world's own instances make. Compute
(regions.get, projects.get, instances.insert), the Cloud Quotas stand-in (tests/world/cloudquotas.py)
and Cloud Monitoring's (tests/world/monitoring.py) all answer from it, so they never disagree.

What a test sets (``FakeCompute``): ``region_quotas`` region -> {metric: (limit, usage)} and
``project_quotas`` {metric: (limit, usage)} (Compute's Quota.metric names; the usage there is
what other work of the project holds), and ``family_quotas`` quota ID -> [(dimensions, value)], the
grants Cloud Quotas lists as DimensionsInfos. What is not set is a new project's default (below).

Sources:
- Which metrics exist: Compute's Quota.metric enum (compute.v1.json); the world's own
  regions.get answers are checked against it (tests/world/discovery.py, where it is wired).
- A new project's regional limits: 24 vCPUs (CPUS), 8 in-use addresses and 500 GB of SSD
  (SSD_TOTAL_GB) per region, as a public `gcloud compute regions describe` of a new project shows
  (issue 37 cites one; https://cloud.google.com/compute/resource-usage: "Not all projects have
  the same quotas"); DISKS_TOTAL_GB 4096, INSTANCES 960 and PREEMPTIBLE_CPUS 0 from the same kind of
  listing (https://pastebin.com/9MY1rdpX; LOCAL_SSD_TOTAL_GB 10000 and PREEMPTIBLE_LOCAL_SSD_GB 0 there
  too), 32 vCPUs in all regions, and no GPU quota at all (GPUs
  are requested: https://cloud.google.com/compute/resource-usage#gpu_quota).
  CPUS-PER-VM-FAMILY-per-project-region's default (24 per family) is the world's choice; a test
  that depends on it sets its own.
- What a VM takes (https://cloud.google.com/compute/resource-usage): its vCPUs on CPUS (N1; A2 on
  A2_CPUS; G2 and A3 on CPUS-PER-VM-FAMILY, vm_family G2/A3) and CPUS_ALL_REGIONS, its GPUs on the
  model's quota (on-demand H100 on GPUS-PER-GPU-FAMILY, gpu_family NVIDIA_H100) and GPUS_ALL_REGIONS,
  one INSTANCES, one IN_USE_ADDRESSES for its external IPv4, its boot disk's GB on SSD_TOTAL_GB
  (pd-balanced, pd-ssd) or DISKS_TOTAL_GB (pd-standard), its bundled Local SSD's on LOCAL_SSD_TOTAL_GB
  (PREEMPTIBLE_LOCAL_SSD_GB for Spot where granted). vCPUs, GPUs, Local SSD and the address count while it
  runs; a stopped VM keeps only its instance and its disk ("you are not charged for ... resources
  of a stopped VM" except its disks and static IPs, https://cloud.google.com/compute/docs/instances/stop-start-instance).
  Spot VMs take a PREEMPTIBLE_ form where it is granted, else the standard one
  (https://cloud.google.com/compute/resource-usage#preemptible_quotas).
- Machine shapes from Google's machine-type tables (general-purpose-machines#n1_machines,
  accelerator-optimized-machines, gpus: A3 High, A2 Standard/Ultra, G2).
- An insert over a quota is refused at the call: 403 quotaExceeded, "Quota 'CPUS' exceeded.  Limit:
  24.0 in region us-central1." (the text gcloud and terraform relay, e.g. "Error 403: Quota
  'NVIDIA_T4_GPUS' exceeded.  Limit: 0.0 in region us-west1., quotaExceeded"; family quotas by their
  metric, "Quota 'GPUS_PER_GPU_FAMILY' exceeded", as users quote it; project-wide ones "globally").
"""

from __future__ import annotations

import re

NEW_PROJECT_REGION = {
    "CPUS": 24.0, "PREEMPTIBLE_CPUS": 0.0, "A2_CPUS": 0.0, "IN_USE_ADDRESSES": 8.0, "INSTANCES": 960.0,
    "SSD_TOTAL_GB": 500.0, "DISKS_TOTAL_GB": 4096.0, "LOCAL_SSD_TOTAL_GB": 10000.0, "PREEMPTIBLE_LOCAL_SSD_GB": 0.0,
    **{f"{prefix}NVIDIA_{model}_GPUS": 0.0 for prefix in ("", "PREEMPTIBLE_")
       for model in ("T4", "V100", "L4", "A100", "A100_80GB")},
    "PREEMPTIBLE_NVIDIA_H100_GPUS": 0.0,
}
NEW_PROJECT = {"CPUS_ALL_REGIONS": 32.0, "GPUS_ALL_REGIONS": 0.0}
GPU_FAMILY, VM_FAMILY = "GPUS-PER-GPU-FAMILY-per-project-region", "CPUS-PER-VM-FAMILY-per-project-region"
# Cloud Quotas' own defaults where a test grants nothing: {dimensions: value}, every region.
NEW_PROJECT_FAMILIES = {GPU_FAMILY: [({}, 0)], VM_FAMILY: [({}, 24)]}
# Monitoring's quota_metric of each family quota, and the label naming its family.
FAMILY_METRICS = {GPU_FAMILY: ("compute.googleapis.com/gpus_per_gpu_family", "gpu_family"),
                  VM_FAMILY: ("compute.googleapis.com/cpus_per_vm_family", "vm_family")}

# Accelerator type -> Quota.metric of its GPUs; the on-demand H100's is the family quota.
GPU_METRIC = {"nvidia-tesla-t4": "NVIDIA_T4_GPUS", "nvidia-tesla-v100": "NVIDIA_V100_GPUS",
              "nvidia-l4": "NVIDIA_L4_GPUS", "nvidia-tesla-a100": "NVIDIA_A100_GPUS",
              "nvidia-a100-80gb": "NVIDIA_A100_80GB_GPUS", "nvidia-h100-80gb": "NVIDIA_H100_GPUS"}
GPU_FAMILIES = {"nvidia-h100-80gb": "NVIDIA_H100"}
# Accelerator-optimized types: (vCPUs, GPUs, accelerator).
BUNDLED = {
    **{f"g2-standard-{n}": (n, gpus, "nvidia-l4") for n, gpus in
       ((4, 1), (8, 1), (12, 1), (16, 1), (32, 1), (24, 2), (48, 4), (96, 8))},
    **{f"a2-highgpu-{g}g": (12 * g, g, "nvidia-tesla-a100") for g in (1, 2, 4, 8)},
    "a2-megagpu-16g": (96, 16, "nvidia-tesla-a100"),
    **{f"a2-ultragpu-{g}g": (12 * g, g, "nvidia-a100-80gb") for g in (1, 2, 4, 8)},
    **{f"a3-highgpu-{g}g": (26 * g, g, "nvidia-h100-80gb") for g in (1, 2, 4, 8)},
}
DISK_METRIC = {"pd-standard": "DISKS_TOTAL_GB", "pd-balanced": "SSD_TOTAL_GB", "pd-ssd": "SSD_TOTAL_GB"}
# Types that come with Local SSD, and its GB (the GPU machine-types page's tables: A3 High 750 GB a GPU,
# A2 Ultra 375 GB a GPU), attached by Compute as 375 GB NVMe SCRATCH disks.
LOCAL_SSD = {**{f"a3-highgpu-{g}g": 750 * g for g in (1, 2, 4, 8)}, **{f"a2-ultragpu-{g}g": 375 * g for g in (1, 2, 4, 8)}}
RUNNING = ("PROVISIONING", "STAGING", "RUNNING", "STOPPING", "SUSPENDING")


def regions(state) -> list[str]:
    return sorted(state.region_quotas)


def _limits(state, region: str | None) -> dict:
    """metric -> (limit, other usage): a new project's defaults under what the test set (None: the
    metric is not listed at all)."""
    if region is None:
        found = {**{m: (v, 0.0) for m, v in NEW_PROJECT.items()}, **state.project_quotas}
    else:
        found = {**{m: (v, 0.0) for m, v in NEW_PROJECT_REGION.items()}, **state.region_quotas.get(region, {})}
    return {metric: value for metric, value in found.items() if value is not None}


def family_rows(state, quota_id: str) -> list[tuple[dict, int]]:
    return list(getattr(state, "family_quotas", {}).get(quota_id) or NEW_PROJECT_FAMILIES[quota_id])


def family_limit(state, quota_id: str, region: str, family: str) -> float:
    """The most specific grant (location and family, then location, then family, then none)."""
    label = FAMILY_METRICS[quota_id][1]
    best = None
    for dims, value in family_rows(state, quota_id):
        if dims.get("region", region) != region or dims.get(label, family) != family:
            continue
        rank = ("region" in dims, len(dims))
        if best is None or rank > best[0]:
            best = (rank, float(value))
    return 0.0 if best is None else best[1]


def _shape(machine: str, accelerators: list) -> tuple[int, int, str]:
    if machine in BUNDLED:
        return BUNDLED[machine]
    n1 = re.fullmatch(r"n1-(?:standard|highmem|highcpu)-(\d+)", machine)
    attached = [(int(a.get("acceleratorCount") or 0), a.get("acceleratorType", "").rsplit("/", 1)[-1])
                for a in accelerators]
    count, kind = attached[0] if attached else (0, "")
    return (int(n1[1]) if n1 else 0), count, kind


def charges(state, zone: str, body: dict) -> list[tuple[tuple, float, bool]]:
    """(quota key, amount, only while running) a VM of ``body`` in ``zone`` takes. Keys:
    ("region", R, METRIC), ("project", METRIC), ("family", R, QUOTA_ID, FAMILY)."""
    region = zone.rsplit("-", 1)[0]
    machine = (body.get("machineType") or "").rsplit("/", 1)[-1]
    vcpus, gpus, accelerator = _shape(machine, body.get("guestAccelerators") or [])
    scheduling = body.get("scheduling") or {}
    # Flex-start VMs "consume preemptible quota" as Spot VMs do (https://cloud.google.com/ai-hypercomputer/docs/
    # consumption-models, the comparison table; the Flex-start launch post says the same).
    spot = scheduling.get("provisioningModel") in ("SPOT", "FLEX_START") or bool(scheduling.get("preemptible"))
    limits = _limits(state, region)

    def granted(metric: str) -> bool:
        return limits.get(metric, (0.0, 0.0))[0] > 0

    found = []
    family = machine.split("-", 1)[0]
    if vcpus:
        if family in ("g2", "a3"):
            found.append((("family", region, VM_FAMILY, family.upper()), vcpus, True))
        elif family == "a2":
            found.append((("region", region, "A2_CPUS"), vcpus, True))
        else:
            found.append((("region", region, "PREEMPTIBLE_CPUS" if spot and granted("PREEMPTIBLE_CPUS") else "CPUS"),
                          vcpus, True))
        found.append((("project", "CPUS_ALL_REGIONS"), vcpus, True))
    if gpus and accelerator in GPU_METRIC:
        metric = GPU_METRIC[accelerator]
        if spot and granted("PREEMPTIBLE_" + metric):
            found.append((("region", region, "PREEMPTIBLE_" + metric), gpus, True))
        elif accelerator in GPU_FAMILIES:
            found.append((("family", region, GPU_FAMILY, GPU_FAMILIES[accelerator]), gpus, True))
        else:
            found.append((("region", region, metric), gpus, True))
        found.append((("project", "GPUS_ALL_REGIONS"), gpus, True))
    found.append((("region", region, "INSTANCES"), 1, False))
    if any(nic.get("accessConfigs") for nic in body.get("networkInterfaces") or []):
        found.append((("region", region, "IN_USE_ADDRESSES"), 1, True))
    if LOCAL_SSD.get(machine):  # Counted while it runs: tfcluster's stops discard it (instances.stop discardLocalSsd).
        metric = "PREEMPTIBLE_LOCAL_SSD_GB" if spot and granted("PREEMPTIBLE_LOCAL_SSD_GB") else "LOCAL_SSD_TOTAL_GB"
        found.append((("region", region, metric), float(LOCAL_SSD[machine]), True))
    for disk in (body.get("disks") or [])[:1]:
        params = disk.get("initializeParams") or {}
        kind = (params.get("diskType") or "pd-standard").rsplit("/", 1)[-1]
        if kind in DISK_METRIC:
            found.append((("region", region, DISK_METRIC[kind]), float(params.get("diskSizeGb") or 10), False))
    return found


def used(state, key: tuple) -> float:
    """What the world's instances hold of one quota now."""
    total = 0.0
    for record in list(state.instances.values()):
        for held, amount, while_running in record.get("quota_charges", ()):
            if held == key and (not while_running or record.get("status") in RUNNING):
                total += amount
    return total


def region_quotas(state, region: str) -> dict:
    """regions.get's quotas: metric -> (limit, usage), the instances' usage added."""
    return {metric: (limit, usage + used(state, ("region", region, metric)))
            for metric, (limit, usage) in _limits(state, region).items()}


def project_quotas(state) -> dict:
    return {metric: (limit, usage + used(state, ("project", metric)))
            for metric, (limit, usage) in _limits(state, None).items()}


def family_usage(state) -> list[tuple[str, str, str, float]]:
    """(quota ID, region, family, in use) of every family quota an instance holds."""
    seen = {}
    for record in list(state.instances.values()):
        for key, _, _ in record.get("quota_charges", ()):
            if key[0] == "family":
                seen[key] = used(state, key)
    return [(key[2], key[1], key[3], value) for key, value in sorted(seen.items())]


def _exceeded(metric: str, limit: float, where: str) -> tuple[int, dict]:
    message = f"Quota '{metric}' exceeded.  Limit: {limit:.1f} {where}."
    return 403, {"error": {"code": 403, "message": message,
                           "errors": [{"message": message, "domain": "usageLimits", "reason": "quotaExceeded"}]}}


def insert_refusal(state, zone: str, body: dict) -> tuple[tuple[int, dict] | None, list]:
    """(Google's refusal, None when it fits; the charges the VM takes)."""
    found = charges(state, zone, body)
    for key, amount, _ in found:
        if key[0] == "region":
            limit, usage = _limits(state, key[1]).get(key[2], (None, 0.0))
            if limit is not None and limit >= 0 and usage + used(state, key) + amount > limit:
                return _exceeded(key[2], limit, f"in region {key[1]}"), found
        elif key[0] == "project":
            limit, usage = _limits(state, None).get(key[1], (None, 0.0))
            if limit is not None and limit >= 0 and usage + used(state, key) + amount > limit:
                return _exceeded(key[1], limit, "globally"), found
        else:
            limit = family_limit(state, key[2], key[1], key[3])
            if limit >= 0 and used(state, key) + amount > limit:
                metric = FAMILY_METRICS[key[2]][0].rsplit("/", 1)[-1].upper()
                return _exceeded(metric, limit, f"in region {key[1]}"), found
    return None, found
