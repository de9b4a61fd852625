"""Spot and on-demand prices: SKU matching, the Cloud Billing Catalog through the real client
(google-cloud-billing over REST) against the stand-in behind cloudbilling.googleapis.com, the
dated-table fallback, and what `up` and `status` print."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone

import pytest

from tests.test_gcp_backend import fake_compute, gcp_cli, needs_hosts  # noqa: F401 - the gcp world's CLI fixtures.
from tests.world.billing import AMERICAS, FAMILY_PRICES, GPU_PRICES, compute_skus, sku
from tfcluster import gpus
from tfcluster.backends.gcp import cost, pricing

TODAY = datetime.now(timezone.utc).date().isoformat()
# What the stand-in lists in the Americas: N1 and T4/V100 here, G2/A2/A3 and their GPUs in billing.py.
_ACCELERATOR = {g.sku: g.accelerator for g in gpus.GPUS.values()}
_FAMILY = {f.sku: f.name for f in gpus.FAMILIES.values()}
ON_DEMAND = pricing.Rates(vcpu_hour=0.0332, memory_gib_hour=0.00445,
                          gpu_hour={"nvidia-tesla-t4": 0.36, "nvidia-tesla-v100": 2.55,
                                    **{_ACCELERATOR[w]: p for w, (p, _) in GPU_PRICES.items()}},
                          family_hour={_FAMILY[w]: [c, r] for w, (c, r, _, _) in FAMILY_PRICES.items()})
SPOT = pricing.Rates(vcpu_hour=0.0071, memory_gib_hour=0.00095,
                     gpu_hour={"nvidia-tesla-t4": 0.12, "nvidia-tesla-v100": 0.85,
                               **{_ACCELERATOR[w]: p for w, (_, p) in GPU_PRICES.items()}},
                     family_hour={_FAMILY[w]: [c, r] for w, (_, _, c, r) in FAMILY_PRICES.items()})


def skus_of(records: list[dict]):
    from google.cloud import billing_v1

    return [billing_v1.Sku.from_json(json.dumps(record)) for record in records]


def per_vm(rates: pricing.Rates, gpu: str = "nvidia-tesla-t4") -> float:
    """n1-standard-8 (8 vCPU, 30 GiB) + 1 GPU + 100 GB pd-balanced at the table's $0.10/GB-month."""
    return 8 * rates.vcpu_hour + 30 * rates.memory_gib_hour + rates.gpu_hour[gpu] + 100 * 0.10 / 730


def test_sku_matching_takes_the_region_and_usage_type_and_leaves_look_alikes():
    found = pricing.match_skus(skus_of(compute_skus()), "us-west1")
    assert pricing.rates_from(found) == (ON_DEMAND, SPOT)  # Not Paris, a commitment or a custom type.

    # Outside the Americas only the Paris N1 core and T4 are listed: no complete set, no guess.
    paris = pricing.match_skus(skus_of(compute_skus()), "europe-west9")
    assert paris == {("OnDemand", "vcpu"): 0.0348, ("OnDemand", "nvidia-tesla-t4"): 0.41}
    assert pricing.rates_from(paris) is None
    assert "nvidia-tesla-v100 (Spot)" in pricing.missing(paris)

    # Older Spot names ("Preemptible ..."), and prices of a unit or more (units + nanos).
    older = [sku("X-1", "Preemptible Nvidia Tesla V100 GPU running in Americas", "GPU", "Preemptible", AMERICAS, 1.2)]
    assert pricing.match_skus(skus_of(older), "us-east1") == {("Preemptible", "nvidia-tesla-v100"): 1.2}

    # Two SKUs with different prices for one component: that component is unknown.
    twice = compute_skus() + [sku("X-2", "Nvidia Tesla T4 GPU running in Americas", "GPU", "OnDemand", AMERICAS, 0.5)]
    assert ("OnDemand", "nvidia-tesla-t4") not in pricing.match_skus(skus_of(twice), "us-west1")

    # A price per another unit (per second, say) is not taken for an hourly one.
    per_second = [sku("X-3", "N1 Predefined Instance Core running in Americas", "N1Standard", "OnDemand",
                      AMERICAS, 0.00001, unit="s")]
    assert pricing.match_skus(skus_of(per_second), "us-west1") == {}


def test_catalog_through_the_real_client_pages_and_names_its_failures(world, tmp_path):
    catalog = world.billing.catalog
    with pytest.raises(pricing.CatalogUnavailable) as error:  # The world's project starts without the API.
        pricing.read_catalog("demo-project", "us-west1")
    assert str(error.value) == ("the cloudbilling.googleapis.com API is not enabled in project demo-project: "
                                "enable it with `gcloud services enable cloudbilling.googleapis.com "
                                "--project demo-project`")

    catalog.disabled_projects.clear()
    catalog.page_limit = 16  # 40 SKUs; the last one needed in the Americas is the 34th.
    assert pricing.read_catalog("demo-project", "us-west1") == (ON_DEMAND, SPOT)
    pages = [r for r in catalog.requests if r["path"].endswith("/skus")]
    assert [r["query"].get("pageToken", [""])[0] for r in pages] == ["", "16", "32"]
    assert all(r["project"] == "demo-project" and r["authorization"].startswith("Bearer ") for r in catalog.requests)

    # Every SKU found before the last page: no further page is read.
    catalog.skus = compute_skus()[3:] + [sku(f"F-{i}", f"Filler {i}", "Misc", "OnDemand", [], 0.1) for i in range(9)]
    mark = len(catalog.requests)
    assert pricing.read_catalog("demo-project", "us-west1") == (ON_DEMAND, SPOT)
    assert len([r for r in catalog.requests[mark:] if r["path"].endswith("/skus")]) == 2  # Of 3.

    catalog.rate_limited_calls = 1
    with pytest.raises(pricing.CatalogUnavailable, match=r"^Google rate-limited the catalog \(429\)"):
        pricing.read_catalog("demo-project", "us-west1")

    # No credentials at all: named, with the fix.
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
        patch.setenv("CLOUDSDK_CONFIG", str(tmp_path))
        patch.setenv("HOME", str(tmp_path))
        with pytest.raises(pricing.CatalogUnavailable, match=r"^no Google Cloud credentials; run `gcloud auth "
                                                             r"application-default login`"):
            pricing.read_catalog("demo-project", "us-west1")

    # A slow catalog is given up on at the deadline, however many pages are left.
    catalog.answer_seconds = 3.0  # Five answers: 15 s unbounded.
    started = time.monotonic()
    with pytest.raises(pricing.CatalogUnavailable, match=r"^the SKU list took longer than 2 s$"):
        pricing.read_catalog("demo-project", "us-west1", deadline_seconds=2.0)
    # The request in flight is cut at the deadline too: well before the second answer (6 s), with
    # seconds of margin for a loaded machine.
    assert time.monotonic() - started < 5.0
    catalog.answer_seconds = 0.0

    catalog.skus = [s for s in compute_skus() if "V100 GPU attached to Spot" not in s["description"]]
    with pytest.raises(pricing.CatalogUnavailable, match=r"^no price in us-west1 for nvidia-tesla-v100 \(Spot\)$"):
        pricing.read_catalog("demo-project", "us-west1")


def test_quote_uses_the_catalog_once_a_day_and_the_table_when_it_cannot(world, tmp_path):
    catalog = world.billing.catalog
    args = ("demo-project", "us-west1-b", "n1-standard-8", "nvidia-tesla-t4", 1, 100, 3)
    table = json.loads(cost.PRICES.read_text())

    fallback = cost.quote(*args, spot=True, cache_dir=tmp_path)
    assert fallback.date == table["date"] and "catalog unavailable: the cloudbilling.googleapis.com API" in fallback.source
    on_demand, spot = cost.table_rates(table)
    assert fallback.on_demand.per_vm == pytest.approx(per_vm(on_demand))
    assert fallback.spot.per_vm == pytest.approx(per_vm(spot)) and fallback.in_use == fallback.spot
    # The failure is remembered for an hour: no new request.
    mark = len(catalog.requests)
    assert "catalog unavailable" in cost.quote(*args, spot=True, cache_dir=tmp_path).source
    assert len(catalog.requests) == mark

    catalog.disabled_projects.clear()
    (tmp_path / "prices-us-west1.json").unlink()
    read = cost.quote(*args, spot=False, cache_dir=tmp_path)
    assert read.date == TODAY and read.source.startswith("Cloud Billing Catalog, read now for us-west1")
    assert read.on_demand.per_vm == pytest.approx(per_vm(ON_DEMAND))
    assert read.spot.per_vm == pytest.approx(per_vm(SPOT))
    assert read.on_demand.total == pytest.approx(3 * read.on_demand.per_vm) and read.in_use == read.on_demand
    assert read.spot.disk == read.on_demand.disk  # The disk bills the same either way.
    lines = read.lines()
    assert lines[0].startswith(f"cost: on-demand (in use): ${read.on_demand.total:.2f}/hour for 3 VM(s)")
    assert lines[1].startswith(f"cost: SPOT: ${read.spot.total:.2f}/hour") and lines[1].endswith(
        f", {1 - read.spot.total / read.on_demand.total:.0%} less")
    # Cached for the day: the same prices again without a request.
    mark = len(catalog.requests)
    again = cost.quote(*args, spot=False, cache_dir=tmp_path)
    assert len(catalog.requests) == mark and again.on_demand == read.on_demand
    assert again.source.startswith("Cloud Billing Catalog, read at ")


@needs_hosts
def test_up_and_status_show_spot_next_to_on_demand(gcp_cli, world):  # noqa: F811
    catalog = world.billing.catalog
    catalog.disabled_projects.clear()
    gcp_cli.env["INVOKE_TFCLUSTER_SPOT"] = "true"
    up = gcp_cli.run("up", timeout=180)
    assert up.returncode == 0, up.stdout + up.stderr
    od, spot = per_vm(ON_DEMAND), per_vm(SPOT)
    assert (f"cost: on-demand: ${2 * od:.2f}/hour for 2 VM(s) (${od:.2f} per VM: VM "
            f"${8 * 0.0332 + 30 * 0.00445:.2f} + GPU $0.36 + disk $0.014)") in up.stdout, up.stdout
    assert f"cost: SPOT (in use): ${2 * spot:.2f}/hour for 2 VM(s) (${spot:.2f} per VM: " in up.stdout
    assert f"prices of {TODAY}: Cloud Billing Catalog, read now for us-west1" in up.stdout

    # `status` reads the day's prices from the cache, and prices the VMs that were made, not
    # today's settings (no --spot, another GPU).
    mark = len(catalog.requests)
    gcp_cli.env.pop("INVOKE_TFCLUSTER_SPOT")
    gcp_cli.env["INVOKE_TFCLUSTER_GPU"] = "v100"
    status = gcp_cli.run("status")
    assert status.returncode == 0, status.stdout + status.stderr
    assert f"cost: SPOT (in use): ${2 * spot:.2f}/hour for 2 VM(s) (${spot:.2f} per VM: " in status.stdout, status.stdout
    assert "GPU $0.12 + disk $0.014" in status.stdout and "cost: on-demand: " in status.stdout
    assert f"prices of {TODAY}: Cloud Billing Catalog, read at " in status.stdout
    assert len(catalog.requests) == mark

    # The catalog refuses (rate limit): `status` still answers, with the table, saying why.
    (gcp_cli.state_dir / "cache" / "prices-us-west1.json").unlink()
    catalog.rate_limited_calls = 1
    status = gcp_cli.run("status")
    assert status.returncode == 0, status.stdout + status.stderr
    table = json.loads(cost.PRICES.read_text())
    assert (f"prices of {table['date']}: tfcluster's table (us-central1 list prices, Spot as a flat 70% off); "
            "catalog unavailable: Google rate-limited the catalog (429), try again in a minute") in status.stdout
    assert status.stderr == "" and "RUNNING" in status.stdout


def test_the_disk_is_priced_by_its_type():
    """pd-balanced by default; a pd-ssd or pd-standard boot disk (boot_disk_type) at its own monthly rate."""
    table = json.loads(cost.PRICES.read_text())
    on_demand, _ = cost.table_rates(table)
    disks = {kind: cost._estimate(on_demand, table, "a2-highgpu-1g", "nvidia-tesla-a100", 1, 100, 1, kind).disk
             for kind in ("pd-balanced", "pd-ssd", "pd-standard")}
    assert disks == pytest.approx({"pd-balanced": 10 / 730, "pd-ssd": 17 / 730, "pd-standard": 4 / 730})
