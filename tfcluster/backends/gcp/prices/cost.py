"""Hourly cost estimates, on-demand and Spot side by side: current list prices from the Cloud
Billing Catalog (pricing.py) for the cluster's region where credentials allow, else the dated table
shipped with tfcluster (prices.json: us-central1 list prices, marked as such). Either way the
estimate says which it used; a catalog failure never fails a command.

What a VM costs while it runs: its vCPUs and memory, its GPUs, its boot disk, its external IPv4
address in use (https://cloud.google.com/vpc/network-pricing#ipaddress) and any bundled Local SSD
(billed with A3 High and A2 Ultra VMs); stopped, only its boot disk.

A budget never undercounts (budget.py): without live prices, Spot is priced at the on-demand rate,
and a region whose list prices are not the table's (us-central1, us-east1, us-west1: the catalog's
"Americas" SKUs) is refused rather than guessed (Quote.for_budget).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from tfcluster import gpus as gpu_table
from tfcluster.backends.gcp.cloud.compute import region_of
from tfcluster.backends.gcp.prices.pricing import (FLEX_DISCOUNTED, CatalogUnavailable, Rates, flex_needs, flex_rates,
                                                   missing, needs, rates_from, read_skus)
from tfcluster.provisioning import flex_start_machine

PRICES = Path(__file__).resolve().parents[3] / "prices.json"
TABLE_REGION = "us-central1"  # The region of prices.json's list prices.
# The regions whose list prices are those same ones: the catalog's "... running in Americas" SKUs
# serve us-central1, us-east1 and us-west1 alike (their serviceRegions); other regions have SKUs of
# their own ("running in Virginia", "running in Netherlands", ...) at other prices.
TABLE_REGIONS = ("us-central1", "us-east1", "us-west1")
FAILURE_TTL_SECONDS = 3600  # A failed lookup is not retried for an hour: `status` stays fast.


@dataclass(frozen=True)
class Estimate:
    """USD per hour on one provisioning model."""

    # vCPUs and memory of one VM.
    vm: float
    # Its GPUs.
    gpu: float
    # Its boot disk (billed the same whether Spot or not, and while the VM is stopped).
    disk: float
    # Its external IPv4 address while in use, and its bundled Local SSD (0 when none).
    ip: float
    ssd: float
    # One VM in all.
    per_vm: float
    # The whole cluster.
    total: float


@dataclass(frozen=True)
class Quote:
    """On-demand and Spot estimates for one cluster, and where the prices came from."""

    on_demand: Estimate
    spot: Estimate
    # Whether the cluster's VMs are (or will be) Spot.
    spot_in_use: bool
    # Number of VMs the totals are for.
    workers: int
    # The day the prices are of (YYYY-MM-DD).
    date: str
    # Where they came from, in words: the catalog and when it was read, or the table and why.
    source: str
    # Read from the Cloud Billing Catalog (for the region), not tfcluster's table.
    live: bool = True
    # The region the prices are for.
    region: str = TABLE_REGION
    # Flex-start (None where the machine type has none: N1), whether the VMs are Flex-start, and
    # whether its rates are the table's flat discount off on-demand rather than the catalog's own SKUs.
    flex: Estimate | None = None
    flex_in_use: bool = False
    flex_table: bool = False

    @property
    def in_use(self) -> Estimate:
        if self.flex_in_use and self.flex is not None:
            return self.flex
        return self.spot if self.spot_in_use else self.on_demand

    @property
    def for_budget(self) -> Estimate:
        """The rate a budget is held to: the one in use, but Spot at the on-demand rate without live
        prices (the table's flat Spot discount may be far from the day's: a surprise is then a
        cheaper run, never an overrun). ConfigError when the table is not of the cluster's region."""
        from tfcluster.errors import ConfigError

        if not self.live and self.region not in TABLE_REGIONS:
            raise ConfigError(f"--budget needs live prices for {self.region}: tfcluster's table holds the list prices "
                              f"of {', '.join(TABLE_REGIONS)} only, and other regions cost up to about a fifth more. "
                              "Enable the Cloud Billing API (`gcloud services enable cloudbilling.googleapis.com`), or "
                              "use a zone in one of those regions, or drop --budget")
        return self.on_demand if not self.live or (self.flex_in_use and self.flex_table) else self.in_use

    def budget_note(self) -> str | None:
        """The one line that says a budget prices Spot or Flex-start at the on-demand rate, or None."""
        if self.spot_in_use and not self.live:
            return ("--budget: Spot VMs are held to the on-demand rate "
                    f"(${self.on_demand.total:.2f}/hour): without the live catalog the day's Spot price is unknown")
        if self.flex_in_use and (not self.live or self.flex_table):
            return ("--budget: Flex-start VMs are held to the on-demand rate "
                    f"(${self.on_demand.total:.2f}/hour): the catalog gave no Flex-start price for {self.region}")
        return None

    def lines(self) -> list[str]:
        """What `up` and `status` print: both models, which is in use, and the prices' source."""
        def one(name: str, e: Estimate, in_use: bool) -> str:
            extra = (f" + IP ${e.ip:.3f}" if e.ip else "") + (f" + Local SSD ${e.ssd:.2f}" if e.ssd else "")
            return (f"cost: {name}{' (in use)' if in_use else ''}: ${e.total:.2f}/hour for {self.workers} VM(s) "
                    f"(${e.per_vm:.2f} per VM: VM ${e.vm:.2f} + GPU ${e.gpu:.2f} + disk ${e.disk:.3f}{extra})")

        def less(e: Estimate) -> str:
            return f", {1 - e.total / self.on_demand.total if self.on_demand.total else 0.0:.0%} less"

        flex = [one("Flex-start", self.flex, self.flex_in_use) + less(self.flex)
                + (" (the table's flat discount: the catalog gave no Flex-start price)" if self.flex_table else "")
                ] if self.flex is not None else []
        return [one("on-demand", self.on_demand, not self.spot_in_use and not self.flex_in_use),
                one("SPOT", self.spot, self.spot_in_use) + less(self.spot), *flex,
                f"prices of {self.date}: {self.source}"]


def _estimate(rates: Rates, table: dict, machine_type: str, gpu: str, gpu_count: int, disk_gb: int,
              workers: int, disk_type: str = "pd-balanced", spot: bool = False) -> Estimate:
    vm = rates.vm_hour(machine_type)
    gpus = gpu_count * rates.gpu_hour[gpu]
    # Monthly rates over 730 hours, as Google bills: the disk type's (pd-balanced, pd-ssd,
    # pd-standard) and the bundled Local SSD's; the external address by the hour (prices.json sources).
    disk = disk_gb * table[f"{disk_type.replace('-', '_')}_gib_month"] / 730
    ip = table["external_ip_hour"]["spot" if spot else "standard"]
    ssd = gpu_table.local_ssd_gb(machine_type) * table["local_ssd_gib_month"] / 730
    per_vm = vm + gpus + disk + ip + ssd
    return Estimate(vm=vm, gpu=gpus, disk=disk, ip=ip, ssd=ssd, per_vm=per_vm, total=per_vm * workers)


def table_rates(table: dict) -> tuple[Rates, Rates]:
    """(on-demand, spot) from prices.json. The table keeps one flat Spot discount, not per-SKU Spot
    rates: Spot prices move daily and per component, so a copied list would pretend to a precision
    it lacks; the catalog gives the real ones."""
    families = table["families"]
    on_demand = Rates(vcpu_hour=table["n1_vcpu_hour"], memory_gib_hour=table["n1_memory_gib_hour"],
                      gpu_hour=dict(table["gpu_hour"]),
                      family_hour={name: [f["vcpu_hour"], f["memory_gib_hour"]] for name, f in families["rates"].items()})
    factor = 1 - table["spot_discount"]
    spot = Rates(vcpu_hour=on_demand.vcpu_hour * factor, memory_gib_hour=on_demand.memory_gib_hour * factor,
                 gpu_hour={name: price * factor for name, price in on_demand.gpu_hour.items()},
                 family_hour={name: [v * factor, m * factor] for name, (v, m) in on_demand.family_hour.items()})
    return on_demand, spot


def table_flex(on_demand: Rates, table: dict) -> Rates:
    """Flex-start from the table: its flat discount off on-demand (prices.json flex_start, with its source)
    for the series Google discounts (pricing.FLEX_DISCOUNTED); the others' (G2, L4) at on-demand."""
    factor = 1 - table["flex_start"]["discount"]

    def off(family: str) -> float:
        return factor if family in FLEX_DISCOUNTED else 1.0

    return Rates(vcpu_hour=0.0, memory_gib_hour=0.0,
                 gpu_hour={name: price * off(getattr(gpu_table.BY_ACCELERATOR.get(name), "family", ""))
                           for name, price in on_demand.gpu_hour.items()},
                 family_hour={name: [v * off(name), m * off(name)] for name, (v, m) in on_demand.family_hour.items()})


def _cached_or_read(project: str, region: str, cache_dir: Path, wanted: set,
                    optional: set = frozenset()) -> tuple[Rates, Rates, str, str, dict]:
    """(on-demand, spot, date, source, every price found) from the catalog, once a day per region
    (cached in ``cache_dir``, with every component read that day; ``optional`` ones too where the
    catalog has them); CatalogUnavailable when it cannot answer (also remembered for an hour)."""
    now = datetime.now(timezone.utc)
    path = cache_dir / f"prices-{region}.json"
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    known = {tuple(key.split("|")): price for key, price in cached.get("found", {}).items()}
    if cached.get("day") == now.date().isoformat() and wanted <= set(known) and (
            optional <= set(known) or set(cached.get("tried", [])) >= {"|".join(key) for key in optional}):
        on_demand, spot = rates_from(known, wanted)
        return (on_demand, spot, cached["day"], f"Cloud Billing Catalog, read at {cached['read_at']} UTC for {region}",
                known)
    if cached.get("failed_at", 0) > time.time() - FAILURE_TTL_SECONDS:
        raise CatalogUnavailable(cached["reason"])
    cache_dir.mkdir(parents=True, exist_ok=True)
    try:
        found = read_skus(project, [region], wanted | optional)[region]
        if rates_from(found, wanted) is None:
            raise CatalogUnavailable(f"no price in {region} for {', '.join(missing(found, wanted))}")
    except CatalogUnavailable as error:
        path.write_text(json.dumps({"failed_at": time.time(), "reason": str(error)}))
        raise
    except Exception as error:  # noqa: BLE001 - an estimate must never fail `up` or `status`.
        reason = f"{type(error).__name__}: {str(error).splitlines()[0][:120] if str(error) else ''}"
        path.write_text(json.dumps({"failed_at": time.time(), "reason": reason}))
        raise CatalogUnavailable(reason) from None
    if cached.get("day") == now.date().isoformat():
        found = {**known, **found}
    tried = sorted(set(cached.get("tried", [])) | {"|".join(key) for key in optional})
    path.write_text(json.dumps({"day": now.date().isoformat(), "read_at": now.strftime("%H:%M"), "tried": tried,
                                "found": {"|".join(key): price for key, price in found.items()}}))
    on_demand, spot = rates_from(found, wanted)
    return on_demand, spot, now.date().isoformat(), f"Cloud Billing Catalog, read now for {region}", found


def table_source(table: dict, machine_type: str) -> str:
    """Where the table's prices are from, in words, with the date of the family's rates."""
    family = machine_type.split("-", 1)[0]
    words = (f"tfcluster's table (us-central1 list prices, Spot as a flat {table['spot_discount']:.0%} off")
    if family != "n1":
        flex = (f"Flex-start as a flat {table['flex_start']['discount']:.0%} off" if family in FLEX_DISCOUNTED
                else f"Flex-start at on-demand ({family.upper()} is not discounted)")
        words += f", {flex}; {family.upper()} and its GPU: {table['families']['note']}, {table['families']['date']}"
    return words + ")"


def quote(project: str, zone: str, machine_type: str, gpu: str, gpu_count: int, disk_gb: int, workers: int,
          spot: bool, cache_dir: Path, disk_type: str = "pd-balanced", flex_start: bool = False) -> Quote:
    """On-demand, Spot and (for accelerator-optimized types) Flex-start estimates for the cluster, from the
    catalog or, failing that, the table; ``flex_start``: the VMs are Flex-start."""
    table = json.loads(PRICES.read_text())
    region = region_of(zone)
    live, flex_wanted, known = True, flex_needs(machine_type, gpu), {}
    try:
        on_demand, spot_rates, date, source, known = _cached_or_read(project, region, cache_dir,
                                                                     needs(machine_type, gpu), flex_wanted)
        source += f" (disk, external IP and Local SSD: table of {table['date']})"
    except CatalogUnavailable as error:
        live, (on_demand, spot_rates) = False, table_rates(table)
        date = table["date"] if machine_type.startswith("n1-") else table["families"]["date"]
        source = f"{table_source(table, machine_type)}; catalog unavailable: {error}"
    args = (table, machine_type, gpu, gpu_count, disk_gb, workers, disk_type)
    flex_rates_found = flex_rates(known, machine_type, gpu)
    flex = None
    if flex_wanted:  # Flex-start VMs' external address is priced as a standard VM's (no page says otherwise).
        flex = _estimate(flex_rates_found or table_flex(on_demand, table), *args)
    elif flex_start_machine(machine_type):  # G2: Flex-start VMs bill on-demand (pricing.FLEX_DISCOUNTED).
        flex = _estimate(on_demand, *args)
    return Quote(on_demand=_estimate(on_demand, *args), spot=_estimate(spot_rates, *args, spot=True),
                 spot_in_use=spot, workers=workers, date=date, source=source, live=live, region=region, flex=flex,
                 flex_in_use=flex_start and flex is not None, flex_table=bool(flex_wanted) and flex_rates_found is None)


def hourly_cost(machine_type: str, gpu: str, gpu_count: int, disk_gb: int, workers: int, spot: bool) -> dict:
    """Estimated USD per hour for the cluster from the table alone (no network), as a dict."""
    table = json.loads(PRICES.read_text())
    rates = table_rates(table)[1 if spot else 0]
    estimate = _estimate(rates, table, machine_type, gpu, gpu_count, disk_gb, workers, spot=spot)
    return {**asdict(estimate), "source": table["source"], "date": table["date"]}
