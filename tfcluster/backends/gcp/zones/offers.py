"""`invoke offers`: every zone that offers a GPU, what one VM with it costs an hour there, on-demand,
Spot and Flex-start (where the machine type has each), how much of the project's GPU quota its region
has free, and how many such VMs its reservations hold free; cheapest first.

Three reads, whatever the number of zones: Compute acceleratorTypes.aggregatedList filtered by the
GPU's name (https://cloud.google.com/compute/docs/reference/rest/v1/acceleratorTypes/aggregatedList),
one regions.list for every region's quotas (https://cloud.google.com/compute/docs/reference/rest/v1/regions/list),
or for a GPU whose quota only Cloud Quotas holds (H100 on-demand) one QuotaInfo and one Monitoring
query (quota.py), one reservations.aggregatedList
(https://cloud.google.com/compute/docs/reference/rest/v1/reservations/aggregatedList), and the Cloud
Billing Catalog's SKU pages once for all those regions (pricing.py), with the dated table (prices.json,
us-central1 list prices) where the catalog cannot answer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tfcluster import gpus
from tfcluster.provisioning import flex_start_machine
from tfcluster.backends.gcp.cloud.compute import ComputeApi, region_of
from tfcluster.backends.gcp.zones import reservations
from tfcluster.backends.gcp.prices.cost import PRICES, table_flex, table_rates, table_source
from tfcluster.backends.gcp.prices.pricing import CatalogUnavailable, Rates, flex_needs, flex_rates, needs, rates_from, read_skus
from tfcluster.backends.gcp.quotas.quota import compute_quota, gpu_quota
from tfcluster.backends.gcp.quotas.quota_source import QuotaSource, gpu_room


@dataclass(frozen=True)
class Offer:
    """One zone where the VM can be made."""

    # The zone, e.g. us-central1-a.
    zone: str
    # USD per hour of one VM (vCPUs, memory, GPUs, external address, bundled Local SSD; no boot disk),
    # on-demand and Spot; None when
    # the catalog has no price for that region.
    on_demand: float | None
    spot: float | None
    # GPUs the region's quota has free (the quota on-demand or, with --spot, Spot VMs draw on);
    # None when it cannot be told (shown as ?).
    quota_free: float | None
    # Most GPUs one VM may have there (acceleratorTypes.maximumCardsPerInstance).
    max_per_vm: int
    # USD per hour of one Flex-start VM (None: the machine type has none, N1), and how many such VMs the
    # zone's matching reservations have free (None: they cannot be read).
    flex: float | None = None
    reserved: int | None = 0


@dataclass(frozen=True)
class Offers:
    """What `invoke offers` prints."""

    # The GPU asked for (tfcluster/gpus.py) and the machine type one VM with gpu_count of them is.
    gpu: gpus.Gpu
    gpu_count: int
    machine_type: str
    # Sorted by the price in use (Spot with --spot), unpriced zones last.
    zones: list[Offer]
    # Where the prices came from, in words.
    source: str
    # Whether the order and the quota column are for Spot VMs.
    spot: bool

    def with_quota(self, workers: int) -> list[str]:
        """The zones (in this order: cheapest first) whose region has GPU quota free for ``workers`` VMs
        and whose VMs may have gpu_count GPUs: what `--zone auto` tries, in turn."""
        need = workers * self.gpu_count
        return [offer.zone for offer in self.zones if (offer.quota_free is None or offer.quota_free >= need)
                and (not offer.max_per_vm or self.gpu_count <= offer.max_per_vm)]

    def lines(self) -> list[str]:
        quota = (compute_quota("PREEMPTIBLE_" + self.gpu.metric_name).quota_id + " where granted, else "
                 if self.spot else "") + gpu_quota(self.gpu).named()
        ssd = gpus.local_ssd_gb(self.machine_type)
        head = (f"{self.gpu.name}: {len(self.zones)} zone(s) offer {self.gpu.accelerator}; one VM is "
                f"{self.machine_type} with {self.gpu_count} GPU(s)"
                + (f" and {ssd} GB of bundled Local SSD (priced in)" if ssd else "") + f"; cheapest {'Spot' if self.spot else 'on-demand'} "
                f"first; quota: GPUs free of {quota} in the zone's region")
        standard = not self.gpu.machine_types.get(self.machine_type, gpus.Shape(0, 0, 0)).spot_only
        flex = flex_start_machine(self.machine_type)
        rows = [f"{'zone':<26} {'on-demand/h':>12} {'spot/h':>10} {'flex-start/h':>13} {'quota':>8} {'reserved':>9}"]

        def usd(value: float | None, offered: bool = True) -> str:
            return "-" if not offered else f"${value:.2f}" if value is not None else "?"

        for offer in self.zones:
            free = "?" if offer.quota_free is None else f"{offer.quota_free:g}"
            reserved = "?" if offer.reserved is None else str(offer.reserved)
            rows.append(f"{offer.zone:<26} {usd(offer.on_demand, standard):>12} {usd(offer.spot):>10} "
                        f"{usd(offer.flex, flex):>13} {free:>8} {reserved:>9}")
        notes = ([f"on-demand: -, {self.machine_type} is offered only as Spot or Flex-start"] if not standard else []) + (
            ["flex-start: -, N1 types have no Flex-start"] if not flex else [])
        return [head, *rows, *notes,
                "reserved: VMs of this type free in the zone's reservations (on-demand VMs consume them at no cost "
                "beyond the reservation's; `--reservation NAME`, or any)", f"prices: {self.source}"]


def _vm_hour(rates: Rates, machine_type: str, accelerator: str, count: int, table: dict, spot: bool) -> float | None:
    """One VM an hour: vCPUs, memory and GPUs at ``rates``, its external IPv4 address and any bundled
    Local SSD at the table's rates (cost.py); no boot disk."""
    try:
        running = rates.vm_hour(machine_type) + count * rates.gpu_hour[accelerator]
    except KeyError:
        return None
    return (running + table["external_ip_hour"]["spot" if spot else "standard"]
            + gpus.local_ssd_gb(machine_type) * table["local_ssd_gib_month"] / 730)


def without_project(gpu_name: str, gpu_count: int, machine_type: str, spot: bool) -> list[str]:
    """`invoke offers` before there is a project: one VM's price from tfcluster's dated table of
    us-central1 list prices, marked as such; which zones offer it and the quota need a project (as
    SkyPilot's show-gpus needs no account)."""
    model = gpus.gpu(gpu_name)
    table = json.loads(PRICES.read_text())
    on_demand, spot_rates = table_rates(table)
    date = table["date"] if machine_type.startswith("n1-") else table["families"]["date"]
    ssd = gpus.local_ssd_gb(machine_type)
    models = (("on-demand", on_demand), ("Spot", spot_rates)) + (
        (("Flex-start", table_flex(on_demand, table)),) if flex_start_machine(machine_type) else ())
    price = {name: _vm_hour(rates, machine_type, model.accelerator, gpu_count, table, name == "Spot")
             for name, rates in models}
    if model.machine_types.get(machine_type, gpus.Shape(0, 0, 0)).spot_only:  # Google makes none on-demand.
        price = {"on-demand (none: Spot or Flex-start only)" if name == "on-demand" else name: value
                 for name, value in price.items()}
        price = {name: (None if name.startswith("on-demand") else value) for name, value in price.items()}
    return [f"{model.name}: one VM is {machine_type} with {gpu_count} x {model.accelerator}"
            + (f" and {ssd} GB of bundled Local SSD" if ssd else "") + ": "
            + ", ".join(f"${value:.2f}/h {name}" if value is not None else name for name, value in price.items()),
            f"prices of {date}: {table_source(table, machine_type)}; no project given, so no zones and no quota: "
            "`invoke offers --project P` lists the zones that offer it, priced for their region, with your quota"]


def every_shape(gpu_name: str, project: str | None = None) -> list[str]:
    """`offers --gpu G` without --gpu-count: every machine type the GPU comes in, and one VM's price an
    hour in each provisioning model, "-" where Google offers none, with what each needs to be made (as
    `sky show-gpus H100` answers). Prices from the dated table of us-central1 list prices; the zones,
    their own prices and the quota come with a --gpu-count (and --project)."""
    model = gpus.gpu(gpu_name)
    table = json.loads(PRICES.read_text())
    on_demand, spot_rates = table_rates(table)
    flex_rates_ = table_flex(on_demand, table)
    if model.attached:  # N1: any N1 type takes 1 to N of them; the default n1-standard-8 is shown.
        shapes = [(f"n1-standard-8", count, False) for count in model.counts()]
    else:
        shapes = [(name, shape.gpus, shape.spot_only) for name, shape in model.machine_types.items()]
    head = (f"{model.name}: {model.accelerator} on {model.family.upper()}; one VM an hour in each provisioning "
            "model (- : Google offers none)")
    rows = [f"{'machine type':<18} {'GPUs':>4} {'on-demand/h':>12} {'spot/h':>9} {'flex-start/h':>13}  `up` with"]
    spot_only, any_flex = [], False
    for machine_type, count, only_spot in shapes:
        flex = flex_start_machine(machine_type)
        any_flex = any_flex or flex
        prices = [None if only_spot else _vm_hour(on_demand, machine_type, model.accelerator, count, table, False),
                  _vm_hour(spot_rates, machine_type, model.accelerator, count, table, True),
                  _vm_hour(flex_rates_, machine_type, model.accelerator, count, table, False) if flex else None]
        cells = [f"${value:.2f}" if value is not None else "-" for value in prices]
        picked = model.attached or model.machine_type_for(count) == machine_type
        flags = f"--gpu {model.name} --gpu-count {count}" + ("" if picked else f" --machine-type {machine_type}")
        flags += " and --spot or --provisioning flex-start" if only_spot else ""
        rows.append(f"{machine_type:<18} {count:>4} {cells[0]:>12} {cells[1]:>9} {cells[2]:>13}  {flags}")
        if only_spot:
            spot_only.append(machine_type)
    notes = ([f"on-demand -: Google offers {', '.join(spot_only)} only as Spot or Flex-start "
              "(https://cloud.google.com/compute/docs/gpus)"] if spot_only else [])
    notes += [] if any_flex else ["flex-start -: N1 types have no Flex-start"]
    date = table["date"] if model.attached else table["families"]["date"]
    where = (f"`invoke offers --gpu {model.name} --gpu-count N{' --project ' + project if project else ' --project P'}` "
             "lists the zones that offer one, priced for their region, with your quota")
    return [head, *rows, *notes, f"prices of {date}: {table_source(table, shapes[0][0])}", where]


def find_offers(project: str, gpu_name: str, gpu_count: int, machine_type: str, spot: bool) -> Offers:
    """Every zone offering the GPU, priced and with the region's free quota (see the module docstring)."""
    model = gpus.gpu(gpu_name)
    api = ComputeApi(project)
    zones = api.accelerator_zones(model.accelerator)
    quotas = QuotaSource(api, project)
    quotas.preload_regions(api.all_region_quotas() if zones else {})
    regions = sorted({region_of(zone) for zone in zones})
    wanted, optional = needs(machine_type, model.accelerator), flex_needs(machine_type, model.accelerator)
    table = json.loads(PRICES.read_text())
    flex_table = False
    try:
        found = read_skus(project, regions, wanted | optional) if regions else {}
        source = "Cloud Billing Catalog, read now"
        priced = {region: rates_from(prices, wanted) for region, prices in found.items()}
        flexed = {region: flex_rates(prices, machine_type, model.accelerator) for region, prices in found.items()}
    except CatalogUnavailable as error:
        source = f"{table_source(table, machine_type)} for every region; catalog unavailable: {error}"
        priced = {region: table_rates(table) for region in regions}
        flexed = {}
    for region, rates in priced.items():  # Flex-start without its own SKUs: the table's discount (prices.json).
        if optional and rates and flexed.get(region) is None:
            flexed[region], flex_table = table_flex(rates[0], table), True
    if flex_table:
        source += f"; Flex-start {table['flex_start']['discount']:.0%} off on-demand where the catalog has no price"
    held = reservations.free_by_zone(api, machine_type, reservations.vm_accelerators(
        machine_type, model.accelerator, gpu_count))
    offers = []
    for zone, most in zones.items():
        rates = priced.get(region_of(zone))
        on_demand, spot_rates = rates if rates else (None, None)
        flex = flexed.get(region_of(zone))
        offers.append(Offer(
            zone=zone,
            on_demand=_vm_hour(on_demand, machine_type, model.accelerator, gpu_count, table, False) if on_demand else None,
            spot=_vm_hour(spot_rates, machine_type, model.accelerator, gpu_count, table, True) if spot_rates else None,
            quota_free=gpu_room(quotas, region_of(zone), model, spot), max_per_vm=most,
            flex=_vm_hour(flex, machine_type, model.accelerator, gpu_count, table, False) if flex else None,
            reserved=None if held is None else held.get(zone, 0)))

    standard = not model.machine_types.get(machine_type, gpus.Shape(0, 0, 0)).spot_only

    def price(offer: Offer) -> tuple:
        value = offer.spot if spot else offer.on_demand if standard else offer.flex
        return (value is None, value or 0.0, offer.zone)

    return Offers(gpu=model, gpu_count=gpu_count, machine_type=machine_type, zones=sorted(offers, key=price),
                  source=source, spot=spot)
