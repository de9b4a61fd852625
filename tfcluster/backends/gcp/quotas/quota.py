"""Quota as Google keeps it: every quota a cluster's VMs consume, where Google reports each one, and
how a shortfall reads, for `check`, `up`, `offers` and `--zone auto` (quota_source.py reads them).

Where each quota lives:
- Compute's Quota.metric enum (compute.v1.json revision 20261106, schemas.Quota.properties.metric):
  regions.get and projects.get report the limit and the usage of these, e.g. CPUS, PREEMPTIBLE_CPUS,
  A2_CPUS, IN_USE_ADDRESSES, INSTANCES, SSD_TOTAL_GB, DISKS_TOTAL_GB, NVIDIA_T4_GPUS (and their
  PREEMPTIBLE_ forms), CPUS_ALL_REGIONS and GPUS_ALL_REGIONS (project-wide). A metric a region does
  not list is unknown (?), never 0.
- What that enum lacks lives in the Cloud Quotas API only: GPUS-PER-GPU-FAMILY-per-project-region with
  the dimension gpu_family (on-demand H100: NVIDIA_H100) and CPUS-PER-VM-FAMILY-per-project-region with
  vm_family (G2, A3) (https://cloud.google.com/docs/quotas/configure-dimensions). A QuotaInfo holds
  limits only (DimensionsInfo.details.value, google/cloud/cloudquotas_v1/types/resources.py); the most
  specific dimensionsInfo applies: location and service-specific dimensions, then location only, then
  service-specific only, then none (the same page, "Dimension precedence"). -1 is no limit.
- Their usage is Compute's resource-specific quota metric in Cloud Monitoring,
  compute.googleapis.com/quota/{gpus_per_gpu_family,cpus_per_vm_family}/usage on the monitored
  resource compute.googleapis.com/Location (https://cloud.google.com/monitoring/alerts/using-quota-metrics;
  Compute's consumerDestinations). A series that carries the family under the dimension's name counts
  for that family; series of the region without it are every family's together, a bound that can only
  say "fits"; no point in the last 25 hours ("the last values are repeated at least every 24 hours",
  https://cloud.google.com/monitoring/api/metrics_gcp) is unknown (?), never nothing in use.
- The console's Quotas & System Limits page filters by quota ID and by "dimension_name:value"
  (configure-dimensions, "View dimensions"). A Compute metric's quota ID is its name in hyphens with
  -per-project-region, or -per-project for a project-wide one (CPUS-per-project-region,
  GPUS-ALL-REGIONS-per-project), as Cloud Quotas lists them
  (https://cloud.google.com/docs/quotas/implement-common-use-cases).
- Which quota a VM draws on (https://cloud.google.com/compute/resource-usage): N1 vCPUs on CPUS, A2's on
  A2_CPUS, G2's and A3's on their VM family's; every vCPU on CPUS_ALL_REGIONS; each GPU on its model's
  regional quota and on GPUS_ALL_REGIONS; each VM on INSTANCES and, with its external IPv4 address, on
  IN_USE_ADDRESSES; its boot disk on SSD_TOTAL_GB (pd-ssd, pd-balanced) or DISKS_TOTAL_GB
  (pd-standard); its bundled Local SSD (A3 High, A2 Ultra) on LOCAL_SSD_TOTAL_GB (#local_ssd_quota; a
  common limit is 10,000 GB a region: two a3-highgpu-8g take 12,000). Spot VMs draw on a PREEMPTIBLE_ form
  where one is granted (#preemptible_quotas; PREEMPTIBLE_LOCAL_SSD_GB for Local SSD), and
  GPU VMs deleted within 7 days on either (https://cloud.google.com/compute/docs/instances/limit-vm-runtime).
"""

from __future__ import annotations

from dataclasses import dataclass

from tfcluster import gpus

# "GPU VMs that are configured to be automatically deleted after a predefined run time of 7 days or
# less can consume either preemptible or standard allocation quotas" (limit-vm-runtime, note at the top).
TIME_LIMITED_HOURS = 168
# Boot disk type -> the regional metric its GB count on (https://cloud.google.com/compute/resource-usage#disk_quota).
DISK_METRIC = {"pd-standard": "DISKS_TOTAL_GB", "pd-balanced": "SSD_TOTAL_GB", "pd-ssd": "SSD_TOTAL_GB"}


@dataclass(frozen=True)
class Quota:
    """One quota, named as the console's Quotas & System Limits page filters it."""

    # The Cloud Quotas quota ID (CPUS-per-project-region).
    quota_id: str
    # Compute's Quota.metric when regions.get / projects.get report it ("" when only Cloud Quotas does).
    metric: str = ""
    # Service-specific dimensions ((("gpu_family", "NVIDIA_H100"),)); the region is added where regional.
    dimensions: tuple = ()
    # Per region (True) or per project.
    regional: bool = True
    # Cloud Monitoring's metric type of its usage (Cloud Quotas-only quotas), on compute.googleapis.com/Location.
    usage_metric: str = ""

    def named(self, region: str = "") -> str:
        """As the console filters it: the quota ID and its dimensions (the region's when given)."""
        dims = [f"{key}:{value}" for key, value in self.dimensions] + ([f"region:{region}"] if region and self.regional else [])
        return self.quota_id + (f" ({', '.join(dims)})" if dims else "")


def compute_quota(metric: str, regional: bool = True) -> Quota:
    return Quota(f"{metric.replace('_', '-')}-per-project{'-region' if regional else ''}", metric, regional=regional)


def gpu_family_quota(family: str) -> Quota:
    return Quota("GPUS-PER-GPU-FAMILY-per-project-region", dimensions=(("gpu_family", family),),
                 usage_metric="compute.googleapis.com/quota/gpus_per_gpu_family/usage")


def vm_family_quota(family: str) -> Quota:
    return Quota("CPUS-PER-VM-FAMILY-per-project-region", dimensions=(("vm_family", family),),
                 usage_metric="compute.googleapis.com/quota/cpus_per_vm_family/usage")


@dataclass(frozen=True)
class Need:
    """How much of one quota the cluster's VMs take."""

    quota: Quota
    amount: float
    # What is counted: "vCPUs", "GPUs", "GB", "addresses", "VMs".
    unit: str
    # Spot VMs draw on this PREEMPTIBLE_ form where granted (else on ``quota``).
    spot_form: Quota | None = None


def gpu_quota(model: gpus.Gpu) -> Quota:
    """The regional quota on-demand VMs with ``model`` draw on."""
    return compute_quota(model.quota) if model.quota else gpu_family_quota(model.gpu_family)


def cluster_needs(machine_type: str, accelerator: str, gpu_count: int, vms: int, disk_gb: int = 0,
                  disk_type: str = "pd-balanced") -> list[Need]:
    """Every quota ``vms`` VMs of ``machine_type`` with ``gpu_count`` GPUs and their boot disks take
    (see the module docstring). A machine type whose shape tfcluster does not know adds no vCPUs."""
    needs = []
    family = gpus.family_of(machine_type) if machine_type else None
    try:
        vcpus = gpus.shape_of(machine_type)[0] if machine_type else 0
    except KeyError:
        vcpus = 0
    if vcpus and family is not None:
        regional = (vm_family_quota(family.vm_family) if family.vm_family else compute_quota(family.cpu_quota))
        spot = compute_quota("PREEMPTIBLE_CPUS") if family.cpu_quota == "CPUS" else None
        needs += [Need(regional, vcpus * vms, "vCPUs", spot),
                  Need(compute_quota("CPUS_ALL_REGIONS", regional=False), vcpus * vms, "vCPUs")]
    model = gpus.BY_ACCELERATOR.get(accelerator)
    if gpu_count and model is not None:
        needs += [Need(gpu_quota(model), gpu_count * vms, "GPUs", compute_quota("PREEMPTIBLE_" + model.metric_name)),
                  Need(compute_quota("GPUS_ALL_REGIONS", regional=False), gpu_count * vms, "GPUs")]
    needs += [Need(compute_quota("INSTANCES"), vms, "VMs"), Need(compute_quota("IN_USE_ADDRESSES"), vms, "addresses")]
    if disk_gb and disk_type in DISK_METRIC:
        needs.append(Need(compute_quota(DISK_METRIC[disk_type]), disk_gb * vms, "GB"))
    local_ssd = gpus.local_ssd_gb(machine_type) if machine_type else 0
    if local_ssd:
        needs.append(Need(compute_quota("LOCAL_SSD_TOTAL_GB"), local_ssd * vms, "GB",
                          compute_quota("PREEMPTIBLE_LOCAL_SSD_GB")))
    return needs


@dataclass
class Reading:
    """One quota's limit and usage where the cluster would be, as read."""

    quota: Quota
    region: str
    # None: unknown (``why`` says why).
    limit: float | None
    usage: float | None
    why: str = ""
    # The usage is every family's together (a bound): it can only tell that the need fits.
    usage_is_bound: bool = False

    @property
    def free(self) -> float | None:
        if self.limit is None or self.usage is None:
            return None
        return float("inf") if self.limit < 0 else self.limit - self.usage


@dataclass
class Judgement:
    """One need against its reading: fits (True), short (False) or cannot tell (None)."""

    need: Need
    reading: Reading

    @property
    def fits(self) -> bool | None:
        limit, usage, amount = self.reading.limit, self.reading.usage, self.need.amount
        if limit is None:
            return None
        if limit < 0:
            return True
        if limit < amount:
            return False  # Short whatever is in use.
        if usage is None:
            return None
        if limit - usage >= amount:
            return True
        return None if self.reading.usage_is_bound else False

    def text(self) -> str:
        r, n = self.reading, self.need
        name = r.quota.named(r.region)
        if r.limit is None:
            return f"quota {name}: its limit cannot be read ({r.why}); the cluster needs {n.amount:g} {n.unit}"
        if r.usage is None and 0 <= r.limit < n.amount:
            return f"quota {name} has a limit of {r.limit:g} {n.unit} and the cluster needs {n.amount:g}, whatever is in use"
        if r.usage is None:
            return (f"quota {name} has a limit of {r.limit:g} {n.unit} and the cluster needs {n.amount:g}; how much is in "
                    f"use cannot be read ({r.why})")
        if r.usage_is_bound and self.fits is None:
            return (f"quota {name} has a limit of {r.limit:g} {n.unit}, the cluster needs {n.amount:g}, and up to "
                    f"{r.usage:g} are in use (Cloud Monitoring does not tell the family's share)")
        return (f"quota {name} has {r.limit - r.usage:g} {n.unit} free (limit {r.limit:g}, in use {r.usage:g}); the cluster "
                f"needs {n.amount:g}")


REQUEST_MORE = ("request more in the console (IAM & Admin > Quotas & System Limits: filter by each quota ID and its "
                "dimensions)")


@dataclass
class Verdict:
    """Every quota a cluster takes in one place, judged."""

    judgements: list[Judgement]

    @property
    def short(self) -> list[Judgement]:
        return [j for j in self.judgements if j.fits is False]

    @property
    def unknown(self) -> list[Judgement]:
        return [j for j in self.judgements if j.fits is None]

    @property
    def holds(self) -> bool | None:
        return False if self.short else (None if self.unknown else True)

    def line(self) -> str:
        """One line: every shortfall (✗), else what cannot be told (?), else what fits."""
        if self.short:
            text = "; ".join(j.text() for j in self.short) + f"; {REQUEST_MORE}"
            if self.unknown:
                text += "; cannot tell: " + "; ".join(j.text() for j in self.unknown)
            return text
        if self.unknown:
            return "cannot tell: " + "; ".join(j.text() for j in self.unknown) + " (`up` goes ahead)"
        return f"{len(self.judgements)} quotas have room ({', '.join(j.reading.quota.quota_id for j in self.judgements)})"


def offered_problem(api, zone: str, accelerator: str, gpu_count: int) -> str:
    """Why ``zone`` cannot have VMs with ``gpu_count`` of ``accelerator`` ("" when it can):
    acceleratorTypes.list and maximumCardsPerInstance."""
    if not gpu_count:
        return ""
    offered = api.accelerator_types(zone)
    if accelerator not in offered:
        return (f"zone {zone} does not offer {accelerator} (it has: {', '.join(sorted(offered)) or 'no GPUs'}); pick a "
                f"zone from `invoke offers --gpu {gpus.BY_ACCELERATOR[accelerator].name}`")
    if offered[accelerator] and gpu_count > offered[accelerator]:
        return (f"gpu_count must be at most {offered[accelerator]} for {accelerator} in {zone} (its "
                f"maximumCardsPerInstance; got {gpu_count})")
    return ""


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


@dataclass
class Zones:
    """The zones a new cluster may be made in, after each one's offer and quota were judged."""

    # In order, those that hold or cannot be told (? does not stop `up`).
    usable: list[str]
    # (zone, why) for each dropped one.
    dropped: list[tuple[str, str]]
    # What the first usable zone's quotas say (None when no zone is usable).
    verdict: Verdict | None

    @property
    def holds(self) -> bool | None:
        return False if not self.usable else self.verdict.holds

    def detail(self, needed: str) -> str:
        """The quota line: the first usable zone's verdict, or why none can take the cluster."""
        if not self.usable:
            if len(self.dropped) == 1:
                return self.dropped[0][1]
            return (f"no zone can take the cluster ({needed}): "
                    + "; ".join(f"{zone}: {why}" for zone, why in self.dropped))
        zone = self.usable[0]
        text = (f"{needed} in {zone}: {self.verdict.line()}" if self.verdict.holds is not False
                else self.verdict.line())
        return text + "".join(f"; dropped zone {zone} ({why})" for zone, why in self.dropped)
