"""Quota as Google keeps it: every quota a cluster's VMs consume, where Google reports each one, and
one judgement for `check`, `up`, `offers` and `--zone auto`.

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
- Their usage is Cloud Monitoring's serviceruntime.googleapis.com/quota/allocation/usage (monitored
  resource consumer_quota, labels quota_metric and the resource's location; "If no changes are received
  in quota usage, the last values are repeated at least every 24 hours",
  https://cloud.google.com/monitoring/api/metrics_gcp#gcp-serviceruntime): no point in the last 25
  hours is nothing in use. A series that carries the family as a label counts for that family; series
  of the region without one are every family's together, a bound that can only say "fits".
- The console's Quotas & System Limits page filters by quota ID and by "dimension_name:value"
  (configure-dimensions, "View dimensions"). A Compute metric's quota ID is its name in hyphens with
  -per-project-region, or -per-project for a project-wide one (CPUS-per-project-region,
  GPUS-ALL-REGIONS-per-project), as Cloud Quotas lists them
  (https://cloud.google.com/docs/quotas/implement-common-use-cases).
- Which quota a VM draws on (https://cloud.google.com/compute/resource-usage): N1 vCPUs on CPUS, A2's on
  A2_CPUS, G2's and A3's on their VM family's; every vCPU on CPUS_ALL_REGIONS; each GPU on its model's
  regional quota and on GPUS_ALL_REGIONS; each VM on INSTANCES and, with its external IPv4 address, on
  IN_USE_ADDRESSES; its boot disk on SSD_TOTAL_GB (pd-ssd, pd-balanced) or DISKS_TOTAL_GB
  (pd-standard). Spot VMs draw on a PREEMPTIBLE_ form where one is granted (#preemptible_quotas), and
  GPU VMs deleted within 7 days on either (https://cloud.google.com/compute/docs/instances/limit-vm-runtime).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tfcluster import gpus
from tfcluster.errors import ConfigError

SERVICE = "compute.googleapis.com"
USAGE_METRIC = "serviceruntime.googleapis.com/quota/allocation/usage"
# Monitoring repeats an unchanged usage at least every 24 hours: a day and an hour covers one.
USAGE_WINDOW_SECONDS = 25 * 3600
QUOTA_VIEWER = "roles/cloudquotas.viewer"
MONITORING_VIEWER = "roles/monitoring.viewer"
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
    # Cloud Monitoring's quota_metric label for its usage (Cloud Quotas-only quotas).
    usage_metric: str = ""

    def named(self, region: str = "") -> str:
        """As the console filters it: the quota ID and its dimensions (the region's when given)."""
        dims = [f"{key}:{value}" for key, value in self.dimensions] + ([f"region:{region}"] if region and self.regional else [])
        return self.quota_id + (f" ({', '.join(dims)})" if dims else "")


def compute_quota(metric: str, regional: bool = True) -> Quota:
    return Quota(f"{metric.replace('_', '-')}-per-project{'-region' if regional else ''}", metric, regional=regional)


def gpu_family_quota(family: str) -> Quota:
    return Quota("GPUS-PER-GPU-FAMILY-per-project-region", dimensions=(("gpu_family", family),),
                 usage_metric="compute.googleapis.com/gpus_per_gpu_family")


def vm_family_quota(family: str) -> Quota:
    return Quota("CPUS-PER-VM-FAMILY-per-project-region", dimensions=(("vm_family", family),),
                 usage_metric="compute.googleapis.com/cpus_per_vm_family")


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
    return needs


class Unreadable(Exception):
    """A quota's limit or usage could not be read; the message says why and what would let it be read."""


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


def _matching(info, region: str, wanted: dict) -> float | None:
    """The limit a QuotaInfo gives for ``wanted`` dimensions in ``region`` (module docstring: the most
    specific dimensionsInfo applies); None when none applies."""
    best = None
    for entry in info.dimensions_infos:
        dims = dict(entry.dimensions)
        located = dims.get("region") or dims.get("zone")
        if located is not None and located != region:
            continue
        if located is None and entry.applicable_locations and not {"global", region} & set(entry.applicable_locations):
            continue
        if any(wanted.get(key) != value for key, value in dims.items() if key not in ("region", "zone")):
            continue
        rank = (located is not None, len(dims))
        if best is None or rank > best[0]:
            best = (rank, float(entry.details.value))
    return None if best is None else best[1]


@dataclass
class QuotaSource:
    """Reads limits and usage, each once per command (regions.get per region, projects.get, one
    QuotaInfo per quota ID, one Monitoring query per quota metric)."""

    api: object  # compute.ComputeApi
    project: str
    credentials: object = None
    regions: dict = field(default_factory=dict)
    project_quotas: dict | None = None
    infos: dict = field(default_factory=dict)
    series: dict = field(default_factory=dict)

    def preload_regions(self, quotas: dict) -> None:
        """Every region's Compute quotas, from one regions.list (ComputeApi.all_region_quotas)."""
        self.regions.update(quotas)

    def _compute(self, quota: Quota, region: str) -> tuple[float | None, float | None, str]:
        if quota.regional:
            if region not in self.regions:
                self.regions[region] = self.api.region_quotas(region)
            found = self.regions[region]
        else:
            if self.project_quotas is None:
                self.project_quotas = self.api.project_quotas()
            found = self.project_quotas
        if quota.metric not in found:
            where = f"regions.get for {region}" if quota.regional else "projects.get"
            return None, None, f"{where} does not list {quota.metric}"
        limit, usage = found[quota.metric]
        return limit, usage, ""

    def _info(self, quota_id: str):
        if quota_id not in self.infos:
            from google.api_core import exceptions
            from google.cloud import cloudquotas_v1

            try:
                client = cloudquotas_v1.CloudQuotasClient(transport="rest", credentials=self._credentials())
                name = f"projects/{self.project}/locations/global/services/{SERVICE}/quotaInfos/{quota_id}"
                self.infos[quota_id] = client.get_quota_info(name=name, timeout=20)
            except exceptions.GoogleAPICallError as error:
                self.infos[quota_id] = Unreadable(_refused("cloudquotas.googleapis.com", QUOTA_VIEWER, error))
            except Exception as error:  # noqa: BLE001 - a transport or parse failure is a ?, never a traceback.
                self.infos[quota_id] = Unreadable(f"Cloud Quotas did not answer: {type(error).__name__}")
        return self.infos[quota_id]

    def _credentials(self):
        if self.credentials is None:
            from tfcluster.backends.gcp.compute import default_credentials

            self.credentials = default_credentials()
        return self.credentials

    def _usage_series(self, usage_metric: str):
        """[(location, labels, value)] of the latest point of each series in the window."""
        if usage_metric not in self.series:
            try:
                self.series[usage_metric] = self._read_series(usage_metric)
            except Unreadable as error:
                self.series[usage_metric] = error
        return self.series[usage_metric]

    def _read_series(self, usage_metric: str) -> list:
        """projects.timeSeries.list over REST (monitoring.v3.json; google-cloud-monitoring 2.32 has
        only gRPC transports), parsed with the client's own types; every page."""
        from datetime import datetime, timezone

        from google.auth.transport.requests import AuthorizedSession
        from google.cloud import monitoring_v3

        now = time.time()
        stamp = lambda t: datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: E731
        params = {"filter": (f'metric.type = "{USAGE_METRIC}" AND resource.type = "consumer_quota" AND '
                             f'resource.labels.service = "{SERVICE}" AND metric.labels.quota_metric = "{usage_metric}"'),
                  "interval.startTime": stamp(now - USAGE_WINDOW_SECONDS), "interval.endTime": stamp(now),
                  "view": "FULL"}
        session = AuthorizedSession(self._credentials())
        found, token = [], ""
        while True:
            try:
                response = session.get(f"https://monitoring.googleapis.com/v3/projects/{self.project}/timeSeries",
                                       params={**params, **({"pageToken": token} if token else {})}, timeout=20)
                payload = response.json() if response.content else {}
            except Exception as error:  # noqa: BLE001 - transport, TLS or JSON: a ?, never a traceback.
                raise Unreadable(f"Cloud Monitoring did not answer: {type(error).__name__}") from None
            if response.status_code >= 400:
                error = payload.get("error") if isinstance(payload, dict) else None
                error = error if isinstance(error, dict) else {}
                raise Unreadable(_refused_text("monitoring.googleapis.com", MONITORING_VIEWER, response.status_code,
                                               error.get("status", ""), error.get("message", "")))
            try:
                page = monitoring_v3.ListTimeSeriesResponse.from_json(response.text, ignore_unknown_fields=True)
            except Exception:  # noqa: BLE001
                raise Unreadable("Cloud Monitoring answered what is not a ListTimeSeriesResponse") from None
            for series in page.time_series:
                if series.points:
                    point = max(series.points, key=lambda p: p.interval.end_time)
                    value = point.value.int64_value or point.value.double_value
                    found.append((series.resource.labels.get("location", ""), dict(series.metric.labels), value))
            token = page.next_page_token
            if not token:
                return found

    def read(self, quota: Quota, region: str) -> Reading:
        if quota.metric:
            limit, usage, why = self._compute(quota, region)
            return Reading(quota, region, limit, usage, why)
        info = self._info(quota.quota_id)
        if isinstance(info, Unreadable):
            return Reading(quota, region, None, None, str(info))
        limit = _matching(info, region, dict(quota.dimensions))
        if limit is None:
            return Reading(quota, region, None, None, f"Cloud Quotas has no value of {quota.quota_id} for "
                                                      f"{', '.join(f'{k}:{v}' for k, v in quota.dimensions)} there")
        series = self._usage_series(quota.usage_metric)
        if isinstance(series, Unreadable):
            return Reading(quota, region, limit, None, str(series))
        here = [(labels, value) for location, labels, value in series if location == region]
        keys = [key for key, _ in quota.dimensions]
        labelled = [(labels, value) for labels, value in here if all(key in labels for key in keys)]
        if labelled or not here:
            usage = sum(value for labels, value in labelled if all(labels[k] == v for k, v in quota.dimensions))
            return Reading(quota, region, limit, float(usage))
        return Reading(quota, region, limit, float(sum(value for _, value in here)), usage_is_bound=True)

    def reading_for(self, need: Need, region: str, spot: bool, deleted_within_hours: int | None) -> Reading:
        """The reading of the quota that answers for the need (its PREEMPTIBLE_ form where the VMs use it)."""
        standard = self.read(need.quota, region)
        if need.spot_form is None:
            return standard
        preemptible = self.read(need.spot_form, region)
        if spot:
            return preemptible if (preemptible.limit or 0) > 0 else standard
        if deleted_within_hours is not None and deleted_within_hours <= TIME_LIMITED_HOURS:
            # Either quota may hold these VMs: the one with more room answers for both.
            rooms = [r for r in (standard, preemptible) if r.free is not None]
            return max(rooms, key=lambda r: r.free) if rooms else standard
        return standard

    def judge(self, needs: list[Need], region: str, spot: bool, deleted_within_hours: int | None = None) -> Verdict:
        return Verdict([Judgement(need, self.reading_for(need, region, spot, deleted_within_hours)) for need in needs])


def _refused(service: str, role: str, error) -> str:
    reason = getattr(error, "reason", None) or ""
    return _refused_text(service, role, getattr(error, "code", 0) or 0, reason, getattr(error, "message", "") or "")


def _refused_text(service: str, role: str, status: int, reason: str, message: str) -> str:
    """Why a read was refused, with what would let it be read."""
    if reason == "SERVICE_DISABLED" or "has not been used in project" in message or "it is disabled" in message:
        return f"{service} is off: `gcloud services enable {service}`"
    if status in (401, 403):
        return f"{service} refused it ({status}): ask for {role}"
    return f"{service} answered {status} {reason or ''} {message[:120]}".rstrip()


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


def preflight(source: QuotaSource, zone: str, accelerator: str, gpu_count: int, vms: int, spot: bool,
              deleted_within_hours: int | None = None, machine_type: str = "", disk_gb: int = 0,
              disk_type: str = "pd-balanced") -> Verdict:
    """The zone offers the GPU (ConfigError otherwise), and every quota the VMs take, judged."""
    problem = offered_problem(source.api, zone, accelerator, gpu_count)
    if problem:
        raise ConfigError(problem)
    needs = cluster_needs(machine_type, accelerator, gpu_count, vms, disk_gb, disk_type)
    return source.judge(needs, region_of(zone), spot, deleted_within_hours)


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


def judge_zones(source: QuotaSource, zones: list[str], accelerator: str, gpu_count: int, vms: int, spot: bool,
                deleted_within_hours: int | None = None, machine_type: str = "", disk_gb: int = 0,
                disk_type: str = "pd-balanced", made: dict | None = None) -> Zones:
    """Each zone's offer and quota, in turn (regions read once each). ``made``: zone -> VMs of this
    cluster already there (a resumed `up`), which need no quota again."""
    usable, dropped, first = [], [], None
    for zone in zones:
        try:
            verdict = preflight(source, zone, accelerator, gpu_count, max(0, vms - (made or {}).get(zone, 0)), spot,
                                deleted_within_hours, machine_type, disk_gb, disk_type)
        except ConfigError as error:
            dropped.append((zone, str(error)))
            continue
        if verdict.holds is False:
            dropped.append((zone, verdict.line()))
            continue
        usable.append(zone)
        first = first or verdict
    return Zones(usable, dropped, first)


def gpu_room(source: QuotaSource, region: str, model: gpus.Gpu, spot: bool) -> float | None:
    """GPUs of ``model`` the region's quota has free for Spot or on-demand VMs (None: cannot tell)."""
    need = Need(gpu_quota(model), 0, "GPUs", compute_quota("PREEMPTIBLE_" + model.metric_name))
    return source.reading_for(need, region, spot, None).free
