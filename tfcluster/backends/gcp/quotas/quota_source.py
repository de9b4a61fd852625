"""Where a cluster's quotas are read, and the zones judged with them (what a cluster takes and how
a shortfall reads are quota.py's): Compute's regions.get and projects.get for the metrics of its
Quota.metric enum, Cloud Quotas QuotaInfos for the GPU-family and VM-family limits, and Compute's
family usage series in Cloud Monitoring for theirs; quota.py's docstring cites where each lives.
Each is read once per command; an unreadable one is a ?, naming what would let it be read, and so
is a usage of which Monitoring holds no point: no data is never 0.

Cloud Quotas is a client-based API: user credentials need a quota project ("Requests can fail if you
make a request to a client-based API and the quota project cannot be identified",
https://cloud.google.com/docs/quotas/set-quota-project). Both it and Monitoring are called with the
cluster's project as the quota project (x-goog-user-project), as Billing already is (pricing.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tfcluster import gpus
from tfcluster.backends.gcp.quotas.quota import (TIME_LIMITED_HOURS, Judgement, Need, Quota, Reading, Verdict, Zones,
                                                 cluster_needs, compute_quota, gpu_quota, offered_problem, region_of)
from tfcluster.errors import ConfigError

SERVICE = "compute.googleapis.com"
# Compute's resource-specific quota metrics live on this monitored resource (labels resource_container,
# location): https://cloud.google.com/monitoring/alerts/using-quota-metrics, and Compute's
# monitoring.consumerDestinations as `gcloud services list --format=json` prints them.
USAGE_RESOURCE = "compute.googleapis.com/Location"
# "If no changes are received in quota usage, the last values are repeated at least every 24 hours"
# (https://cloud.google.com/monitoring/api/metrics_gcp): a day and an hour covers one repeat.
USAGE_WINDOW_SECONDS = 25 * 3600
QUOTA_VIEWER = "roles/cloudquotas.viewer"
MONITORING_VIEWER = "roles/monitoring.viewer"


class Unreadable(Exception):
    """A quota's limit or usage could not be read; the message says why and what would let it be read."""


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
        """The Compute client's own credentials, with the cluster's project as their quota project
        (module docstring): user credentials are refused by Cloud Quotas without one."""
        if self.credentials is None:
            from google.auth.credentials import CredentialsWithQuotaProject

            found = self.api.client_kwargs["credentials"]
            if isinstance(found, CredentialsWithQuotaProject):
                found = found.with_quota_project(self.project)
            self.credentials = found
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
        params = {"filter": f'metric.type = "{usage_metric}" AND resource.type = "{USAGE_RESOURCE}"',
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
        return _usage_reading(quota, region, limit, series)

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


def _usage_reading(quota: Quota, region: str, limit: float, series: list) -> Reading:
    """The family's usage from the region's series: those that name the family by the quota's
    dimension count for it; series that name no family are every family's together, a bound that
    can only say "fits"; no point of the family at all is unknown (Monitoring writes a point when
    usage changes, and repeats it rarely: an absent point is not 0)."""
    here = [(labels, value) for location, labels, value in series if location == region]
    keys = [key for key, _ in quota.dimensions]
    family = ", ".join(f"{k}:{v}" for k, v in quota.dimensions)
    missing = (f"Cloud Monitoring holds no point of {quota.usage_metric} for {family} in {region} in the last "
               f"{USAGE_WINDOW_SECONDS // 3600} hours; it writes one when usage changes")
    labelled = [(labels, value) for labels, value in here if all(key in labels for key in keys)]
    if labelled:
        mine = [value for labels, value in labelled if all(labels[k] == v for k, v in quota.dimensions)]
        return Reading(quota, region, limit, float(sum(mine))) if mine else Reading(quota, region, limit, None, missing)
    if here:
        return Reading(quota, region, limit, float(sum(value for _, value in here)), usage_is_bound=True)
    return Reading(quota, region, limit, None, missing)


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


def preflight(source: QuotaSource, zone: str, accelerator: str, gpu_count: int, vms: int, spot: bool,
              deleted_within_hours: int | None = None, machine_type: str = "", disk_gb: int = 0,
              disk_type: str = "pd-balanced") -> Verdict:
    """The zone offers the GPU (ConfigError otherwise), and every quota the VMs take, judged."""
    problem = offered_problem(source.api, zone, accelerator, gpu_count)
    if problem:
        raise ConfigError(problem)
    needs = cluster_needs(machine_type, accelerator, gpu_count, vms, disk_gb, disk_type)
    return source.judge(needs, region_of(zone), spot, deleted_within_hours)


def preflight_quota(api, zone: str, gpu: str, gpu_count: int, workers: int, spot: bool,
                    deleted_within_hours: int | None = None, machine_type: str = "", disk_gb: int = 0,
                    disk_type: str = "pd-balanced") -> None:
    """The zone offers the GPU, and every quota ``workers`` VMs take has room; one ConfigError
    names every quota that falls short. A quota that cannot be read does not stop it."""
    verdict = preflight(QuotaSource(api, api.project), zone, gpu, gpu_count, workers, spot, deleted_within_hours,
                        machine_type, disk_gb, disk_type)
    if verdict.holds is False:
        raise ConfigError(verdict.line())


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
