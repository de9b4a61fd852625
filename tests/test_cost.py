"""Spot and on-demand prices: SKU matching, the Cloud Billing Catalog through the real client
(google-cloud-billing over REST) against the stand-in behind cloudbilling.googleapis.com, the
dated-table fallback, and what `up` and `status` print."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone

import pytest

from tests.test_gcp_backend import bucket_of, fake_compute, gcp_cli, needs_hosts  # noqa: F401 - the gcp world's CLI fixtures.
from tests.world.billing import AMERICAS, FAMILY_PRICES, GPU_PRICES, compute_skus, sku
from tfcluster import gpus
from tfcluster.backends.gcp.prices import cost, pricing

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


def _stamp(text: str) -> float:
    """An RFC 3339 timestamp of Compute's, in epoch seconds."""
    return datetime.fromisoformat(text).timestamp()


def per_vm(rates: pricing.Rates, gpu: str = "nvidia-tesla-t4", spot: bool = False) -> float:
    """n1-standard-8 (8 vCPU, 30 GiB) + 1 GPU + 100 GB pd-balanced at the table's $0.10/GB-month + its
    external IPv4 address in use ($0.005 an hour, $0.0025 on a Spot VM: cloud.google.com/vpc/network-pricing)."""
    return (8 * rates.vcpu_hour + 30 * rates.memory_gib_hour + rates.gpu_hour[gpu] + 100 * 0.10 / 730
            + (0.0025 if spot else 0.005))


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
    assert fallback.spot.per_vm == pytest.approx(per_vm(spot, spot=True)) and fallback.in_use == fallback.spot
    # The failure is remembered for an hour: no new request.
    mark = len(catalog.requests)
    assert "catalog unavailable" in cost.quote(*args, spot=True, cache_dir=tmp_path).source
    assert len(catalog.requests) == mark

    catalog.disabled_projects.clear()
    (tmp_path / "prices-us-west1.json").unlink()
    read = cost.quote(*args, spot=False, cache_dir=tmp_path)
    assert read.date == TODAY and read.source.startswith("Cloud Billing Catalog, read now for us-west1")
    assert read.on_demand.per_vm == pytest.approx(per_vm(ON_DEMAND))
    assert read.spot.per_vm == pytest.approx(per_vm(SPOT, spot=True))
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
def test_up_and_status_show_spot_next_to_on_demand_and_the_ledger_equals_compute_times_prices(gcp_cli, world):  # noqa: F811
    catalog = world.billing.catalog
    catalog.disabled_projects.clear()
    gcp_cli.env["INVOKE_TFCLUSTER_SPOT"] = "true"
    up = gcp_cli.run("up", timeout=180)
    assert up.returncode == 0, up.stdout + up.stderr
    od, spot = per_vm(ON_DEMAND), per_vm(SPOT, spot=True)
    assert (f"cost: on-demand: ${2 * od:.2f}/hour for 2 VM(s) (${od:.2f} per VM: VM "
            f"${8 * 0.0332 + 30 * 0.00445:.2f} + GPU $0.36 + disk $0.014 + IP $0.005)") in up.stdout, up.stdout
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

    # The cost ledger (Spend): a preemption, a restart and `down`, against Compute's timestamps.
    # The prices in use are now the table's (the catalog's refusal is remembered for an hour).
    from tests.fake_compute import preempt_instance

    state = world.compute.state
    # A MiB in the bucket: `up` looks again (`status` only every 10 minutes), and `down` ends it.
    bucket_of(gcp_cli.storage, gcp_cli.cluster()["bucket"]).blob("runs/r/ckpt").upload_from_string(b"z" * 2**20)
    # Compute keeps only the last start and stop of each VM: the test notes each as it happens.
    started = {name: [_stamp(state.instances[name]["started"])] for name in ("default-0", "default-1")}
    preempt_instance(state, "default-1")
    stopped = _stamp(state.instances["default-1"]["stopped"])
    status = gcp_cli.run("status")
    assert status.returncode == 0, status.stdout + status.stderr
    assert "spent so far (since the first `up`, across restarts): $" in status.stdout, status.stdout
    assert "disagree" not in status.stdout
    again = gcp_cli.run("up", timeout=180)  # Starts the preempted VM.
    assert again.returncode == 0, again.stdout + again.stderr
    started["default-1"].append(_stamp(state.instances["default-1"]["started"]))
    # A ledger line that contradicts Compute (a start it never made) is named by `status`.
    book = ledger.Ledger(gcp_cli.state_dir, "default")
    planted = Event(time.time(), "default-0", "start", ledger.OBSERVED)
    book.append([planted])
    status = gcp_cli.run("status")
    assert "! ledger and Compute disagree: default-0: the ledger's last start is " in status.stdout, status.stdout
    down = gcp_cli.run("down", timeout=180)
    assert down.returncode == 0, down.stdout + down.stderr
    deleted = {entry["json"]["targetLink"].rsplit("/", 1)[-1]: _stamp(entry["json"]["endTime"])
               for entry in state.operations.values() if entry["json"]["operationType"] == "delete"}

    # Compute's timestamps x the prices in force then: the catalog's Spot rates until the first `status`
    # that fell back to the table, the table's Spot rates from then on; each start bills at least a minute.
    on_demand_rates, spot_rates = cost.table_rates(table)
    disk = 100 * table["pd_balanced_gib_month"] / 730
    table_spot = per_vm(spot_rates, spot=True)
    history = book.price_history()
    assert [round(ledger.running_rate(p.in_use), 6) for p in history] == pytest.approx([spot, table_spot], abs=1e-6)
    switch = history[1].at  # When the ledger saw the table's prices in use.
    spells = {"default-0": [(started["default-0"][0], deleted["default-0"])],
              "default-1": [(started["default-1"][0], stopped), (started["default-1"][1], deleted["default-1"])]}
    spells = {name: [(a, max(b, a + 60)) for a, b in found] for name, found in spells.items()}
    running = {name: sum(b - a for a, b in found) for name, found in spells.items()}
    idle = started["default-1"][1] - stopped

    def priced(a: float, b: float, before: float, after: float) -> float:
        return (max(0.0, min(b, switch) - a) * before + max(0.0, b - max(a, switch)) * after) / 3600

    expected = (sum(priced(a, b, spot, table_spot) for found in spells.values() for a, b in found)
                + priced(stopped, started["default-1"][1], disk, disk))
    figures = ledger.Ledger(gcp_cli.state_dir, "default").figures()
    assert {name: hours * 3600 for name, hours in figures.per_instance.items()} == pytest.approx(running, abs=1e-3)
    assert figures.stopped_disk_hours * 3600 == pytest.approx(idle, abs=1e-3)
    assert figures.cost_usd - figures.storage_usd == pytest.approx(expected, abs=1e-9) and not figures.open
    od_catalog, od_table = per_vm(ON_DEMAND), per_vm(on_demand_rates)
    samples = book.storage()
    held = [(a.at, b.at) for a, b in zip(samples, samples[1:]) if a.bucket_bytes == 2**20]
    assert samples[-1].bucket_bytes == 0 and len(held) == 1  # From the second `up` to `down`.
    assert figures.bucket_gib_hours == pytest.approx(sum(b - a for a, b in held) / 3600 / 2**10)
    assert figures.storage_usd == pytest.approx(figures.bucket_gib_hours * table["standard_storage_gib_month"] / 730)
    assert figures.spot_saving_usd == pytest.approx(
        sum(priced(a, b, od_catalog - spot, od_table - table_spot) for found in spells.values() for a, b in found),
        abs=1e-9)
    assert f"final cost of cluster default: ${expected + figures.storage_usd:.2f} (" in down.stdout, down.stdout
    assert f"prices of {table['date']}: tfcluster's table" in down.stdout
    assert sorted((e.instance, e.kind, e.source) for e in book.events() if e != planted) == [
        ("default-0", "delete", "own operation"), ("default-0", "start", "own operation"),
        ("default-1", "delete", "own operation"), ("default-1", "preempted", "compute operation"),
        ("default-1", "start", "own operation"), ("default-1", "start", "own operation")]

    # It survives `down`: `invoke costs` lists the cluster, gone, at the same figure.
    costs = gcp_cli.run("costs")
    assert costs.returncode == 0, costs.stdout + costs.stderr
    row = next(line for line in costs.stdout.splitlines() if "default" in line and "down" in line)
    assert f"${figures.cost_usd:.2f}" in row, costs.stdout


def test_the_disk_is_priced_by_its_type():
    """pd-balanced by default; a pd-ssd or pd-standard boot disk (boot_disk_type) at its own monthly rate."""
    table = json.loads(cost.PRICES.read_text())
    on_demand, _ = cost.table_rates(table)
    disks = {kind: cost._estimate(on_demand, table, "a2-highgpu-1g", "nvidia-tesla-a100", 1, 100, 1, kind).disk
             for kind in ("pd-balanced", "pd-ssd", "pd-standard")}
    assert disks == pytest.approx({"pd-balanced": 10 / 730, "pd-ssd": 17 / 730, "pd-standard": 4 / 730})


# ---------------------------------------------------------------- the cost ledger (Spend)

from tfcluster import ledger  # noqa: E402
from tfcluster.backends.gcp.spend import ledger_events  # noqa: E402
from tfcluster.ledger import Event, Prices, Storage  # noqa: E402

# One VM an hour, in USD: on-demand and Spot, split as cost.Estimate splits it.
RATES_OD = {"vm": 0.4, "gpu": 0.35, "disk": 0.01}
RATES_SPOT = {"vm": 0.12, "gpu": 0.105, "disk": 0.01}
H = 3600.0


def test_the_ledger_sums_running_and_stopped_spells_at_the_prices_in_use(tmp_path):
    book = ledger.Ledger(tmp_path, "c1")
    book.note_prices(Prices(at=0, on_demand=RATES_OD, spot=RATES_SPOT, spot_in_use=True, gpu_count=2, workers=2,
                            date="2026-10-15", source="tfcluster's table", bucket_gib_hour=0.002,
                            registry_gib_hour=0.01))
    book.note_prices(Prices(at=5, on_demand=RATES_OD, spot=RATES_SPOT, spot_in_use=True, gpu_count=2, workers=2,
                            date="2026-10-15", source="tfcluster's table", bucket_gib_hour=0.002,
                            registry_gib_hour=0.01))  # The same rates: not written again.
    # The bucket held 1 GiB from the start, 3 GiB and the registry 0.5 GiB from 2 h, nothing after `down`.
    for sample in (Storage(0, 2**30, 0), Storage(2 * H, 3 * 2**30, 2**29), Storage(5 * H, 0, 0)):
        book.note_storage(sample)
    own, seen, op = ledger.OWN, ledger.OBSERVED, ledger.COMPUTE_OPERATION
    book.append([Event(0, "a", "start", own), Event(0, "b", "start", own),
                 Event(2 * H, "b", "preempted", op, "run-1"), Event(2.5 * H, "b", "start", own, "run-1"),
                 Event(3 * H, "b", "start", seen),  # A start while running changes nothing.
                 Event(4 * H, "a", "terminated_seen", seen), Event(5 * H, "a", "delete", own),
                 Event(5 * H, "b", "delete", own)])
    assert len([line for line in book.path.read_text().splitlines() if '"prices"' in line]) == 1
    figures = book.figures(now=9 * H)
    # a: ran 0-4 h, stood stopped 4-5 h; b: ran 0-2 h and 2.5-5 h, stopped 2-2.5 h.
    assert figures.vm_hours == pytest.approx(4 + 4.5) and figures.gpu_hours == pytest.approx(2 * 8.5)
    assert figures.stopped_disk_hours == pytest.approx(1.5) and not figures.open
    assert (figures.bucket_gib_hours, figures.registry_gib_hours) == pytest.approx((1 * 2 + 3 * 3, 0.5 * 3))
    stored = 11 * 0.002 + 1.5 * 0.01
    spot = 8.5 * (0.12 + 0.105 + 0.01) + 1.5 * 0.01 + stored
    od = 8.5 * (0.4 + 0.35 + 0.01) + 1.5 * 0.01 + stored
    assert figures.cost_usd == pytest.approx(spot) and figures.spot_saving_usd == pytest.approx(od - spot)
    assert ledger.cluster_spent_usd(tmp_path, "c1", now=9 * H) == pytest.approx(spot)
    assert figures.words() == (f"${spot:.2f} (8.50 VM-hours, 17.00 GPU-hours, 1.50 stopped-disk hours; "
                               f"Spot saved ${od - spot:.2f} against on-demand; storage ${stored:.2f}: bucket "
                               "11.00 GiB-hours, registry 1.50 GiB-hours)")
    # A run's window, with 30 s of steps redone on its 2 VMs.
    run = book.figures(start=1 * H, end=3 * H, now=9 * H, redone_seconds=30)
    assert run.vm_hours == pytest.approx(2 + 1 + 0.5) and run.stopped_disk_hours == pytest.approx(0.5)
    assert run.bucket_gib_hours == pytest.approx(1 * 1 + 3 * 1)
    assert run.redone_usd == pytest.approx(2 * 30 / H * (0.12 + 0.105 + 0.01))
    # Still billing: a spell open at ``now``; a cut last line (a crash mid-write) is skipped.
    book.append([Event(10 * H, "a", "start", own)])
    with book.path.open("a") as handle:
        handle.write('{"type": "event", "at": 11')
    assert book.figures(now=12 * H).vm_hours == pytest.approx(8.5 + 2) and book.figures(now=12 * H).open
    # Own hosts: hours, no prices.
    local = ledger.Ledger(tmp_path, "mine")
    local.append([Event(0, "worker-0", "start", own), Event(H, "worker-0", "delete", own)])
    assert local.figures().words() == "1.00 VM-hours, 0.00 stopped-disk hours (own hosts: no prices)"
    assert ledger.cluster_spent_usd(tmp_path, "mine") == 0.0
    assert [b.cluster for b in ledger.ledgers(tmp_path)] == ["c1", "mine"]
    # Redone work: the chief's steps went back from 14 to 11 at a restart: steps 11-14 again.
    assert ledger.redone_seconds([(0, 2), (1, 14), (5, 11), (6, 20)], 0.5) == 4 * 0.5


def test_compute_timestamps_become_events_once_each_with_their_source():
    seen = {"a": ledger_events.Seen("RUNNING", last_start=100.0, last_stop=None),
            "b": ledger_events.Seen("TERMINATED", last_start=100.0, last_stop=500.0)}
    preempted = [("b", 499.6, "operation-p")]  # Its stop, at lastStopTimestamp, is this preemption.
    first = ledger_events.observe([], seen, preempted, [], own="start", run="", now=600.0)
    assert sorted((e.instance, e.kind, e.at, e.source) for e in first) == [
        ("a", "start", 100.0, "own operation"), ("b", "preempted", 500.0, "compute operation"),
        ("b", "start", 100.0, "own operation")]
    assert ledger_events.observe(first, seen, preempted, [], own="", run="", now=700.0) == []
    assert ledger_events.disagreements(first, seen) == []
    # Restarted, stopped by the watchdog (seen TERMINATED, no operation), then one deleted.
    seen = {"a": ledger_events.Seen("TERMINATED", last_start=100.0, last_stop=900.0),
            "b": ledger_events.Seen("RUNNING", last_start=800.0, last_stop=500.0)}
    later = ledger_events.observe(first, seen, preempted, [], own="", run="r", now=1000.0)
    assert sorted((e.instance, e.kind, e.at, e.source, e.run) for e in later) == [
        ("a", "terminated_seen", 900.0, "observed", "r"), ("b", "start", 800.0, "observed", "r")]
    gone = ledger_events.observe(first + later, {}, preempted, [("a", 1200.0, "operation-d")], own="delete",
                                 run="", now=1300.0)
    assert sorted((e.instance, e.kind, e.at, e.detail) for e in gone) == [
        ("a", "delete", 1200.0, "operation-d"), ("b", "delete", 1300.0, "not listed")]
    # A ledger whose last start is not Compute's is named.
    wrong = first + later + [Event(950.0, "b", "start", ledger.OBSERVED)]
    [line] = ledger_events.disagreements(wrong, seen)
    assert line.startswith("b: the ledger's last start is ") and "Compute's lastStartTimestamp" in line


def prices_at(at: float, vm: float, live: bool = True, spot_vm: float | None = None) -> Prices:
    """One machine's rates from ``at``: ``vm`` USD an hour on-demand (all of it the VM's)."""
    zero = {"gpu": 0.0, "disk": 0.0, "ip": 0.0, "ssd": 0.0}
    return Prices(at=at, on_demand={"vm": vm, **zero}, spot={"vm": vm if spot_vm is None else spot_vm, **zero},
                  spot_in_use=spot_vm is not None, gpu_count=0, workers=1, date="2026-11-26",
                  source="Cloud Billing Catalog" if live else "tfcluster's table", live=live)


def test_each_spell_is_priced_with_the_prices_in_force_then_and_a_reused_name_keeps_its_figures(tmp_path):
    """Google: "You pay the Spot price that is in effect when your instances are running"."""
    from tfcluster.commands import spend

    book = ledger.Ledger(tmp_path, "c")
    book.note_cluster(0.0)
    book.note_prices(prices_at(0.0, 2.0))  # Prices A for the first hour...
    book.append([Event(0.0, "c-0", "start", ledger.OWN)])
    book.note_prices(prices_at(1 * H, 5.0))  # ...then B for the second.
    book.append([Event(2 * H, "c-0", "delete", ledger.OWN)])
    assert book.figures(now=3 * H).cost_usd == pytest.approx(2.0 + 5.0)
    first = ledger.cluster_spent_usd(tmp_path, "c", now=3 * H, since=0.0)
    # A later cluster of the same name, at new prices: the first one's figures do not move.
    book.note_cluster(10 * H)
    book.note_prices(prices_at(10 * H, 9.0))
    book.append([Event(10 * H, "c-0", "start", ledger.OWN), Event(11 * H, "c-0", "delete", ledger.OWN)])
    assert book.figures(end=10 * H, now=12 * H).cost_usd == pytest.approx(first) == pytest.approx(7.0)
    assert ledger.cluster_spent_usd(tmp_path, "c", now=12 * H, since=10 * H) == pytest.approx(9.0)
    assert [figures for figures in (spend.cluster_figures(tmp_path, "c", 12 * H, since, until).cost_usd
                                    for since, until in spend.generations(book))] == pytest.approx([7.0, 9.0])
    # Each start bills at least a minute: a VM stopped 10 s after its start costs 60 s.
    short = ledger.Ledger(tmp_path, "s")
    short.note_prices(prices_at(0.0, 3.6))
    short.append([Event(0.0, "s-0", "start", ledger.OWN), Event(10.0, "s-0", "stop", ledger.OWN)])
    assert short.figures(now=H).cost_usd == pytest.approx(3.6 * 60 / H)
    # A budget without live prices holds Spot to the on-demand rate.
    spot = ledger.Ledger(tmp_path, "spot")
    spot.note_prices(prices_at(0.0, 4.0, live=False, spot_vm=1.0))
    spot.append([Event(0.0, "p-0", "start", ledger.OWN), Event(H, "p-0", "delete", ledger.OWN)])
    assert ledger.cluster_spent_usd(tmp_path, "spot", now=2 * H) == pytest.approx(1.0)
    assert ledger.cluster_spent_usd(tmp_path, "spot", now=2 * H, for_budget=True) == pytest.approx(4.0)


def test_without_the_catalog_a_budget_holds_spot_to_on_demand_and_refuses_other_regions(world, tmp_path):
    from tfcluster.backends.gcp.spend import budget
    from tfcluster.errors import ConfigError

    table = json.loads(cost.PRICES.read_text())
    said = []
    central = cost.quote("demo-project", "us-central1-a", "n1-standard-8", "nvidia-tesla-t4", 1, 100, 2, spot=True,
                         cache_dir=tmp_path)
    assert not central.live and central.in_use == central.spot
    assert budget.budget_rate(central, said.append) == central.on_demand.total
    assert said == [f"--budget: Spot VMs are held to the on-demand rate (${central.on_demand.total:.2f}/hour): without "
                    "the live catalog the day's Spot price is unknown"]
    # us-west1 shares us-central1's list prices (the catalog's "Americas" SKUs); the Netherlands do not.
    west = cost.quote("demo-project", "us-west1-b", "n1-standard-8", "nvidia-tesla-t4", 1, 100, 2, spot=False,
                      cache_dir=tmp_path)
    assert budget.budget_rate(west, said.append) == west.on_demand.total
    europe = cost.quote("demo-project", "europe-west4-a", "n1-standard-8", "nvidia-tesla-t4", 1, 100, 2, spot=True,
                        cache_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"^--budget needs live prices for europe-west4: tfcluster's table holds the "
                                          r"list prices of us-central1, us-east1, us-west1 only"):
        budget.budget_rate(europe, said.append)
    # The external IPv4 address and bundled Local SSD are priced (prices.json), Spot's address at its rate.
    assert west.on_demand.ip == table["external_ip_hour"]["standard"] and west.spot.ip == table["external_ip_hour"]["spot"]
    a3 = cost.quote("demo-project", "us-central1-a", "a3-highgpu-8g", "nvidia-h100-80gb", 8, 100, 1, spot=False,
                    cache_dir=tmp_path)
    assert a3.on_demand.ssd == pytest.approx(6000 * table["local_ssd_gib_month"] / 730)
    assert "+ Local SSD $" in a3.lines()[0]
    # The live catalog answers: the region's own prices, and Spot as the catalog has it.
    world.billing.catalog.disabled_projects.clear()
    for path in tmp_path.glob("prices-*.json"):
        path.unlink()
    live = cost.quote("demo-project", "us-west1-b", "n1-standard-8", "nvidia-tesla-t4", 1, 100, 2, spot=True,
                      cache_dir=tmp_path)
    assert live.live and budget.budget_rate(live) == live.spot.total


def test_the_provider_floor_has_reservation_bound_and_a_resumed_up_keeps_its_first_deadline():
    """Item 14: max_run_duration is ForceNew (hashicorp/terraform-provider-google#26148), so a resumed `up`
    keeps the first budget_run_seconds rather than the day's rate; FLEX_START and RESERVATION_BOUND came
    in hashicorp/google 7.41.0 (its CHANGELOG; magic-modules#17417), the floor versions.tf pins."""
    import re

    from tfcluster.backends.gcp.spend import budget
    from tfcluster.backends.gcp.cloud.terraform import MODULE_DIR

    text = (MODULE_DIR / "versions.tf").read_text()
    floor = re.search(r'source\s*=\s*"hashicorp/google".*?version\s*=\s*">=\s*([0-9.]+)', text, re.S)[1]
    assert tuple(int(part) for part in floor.split(".")) >= (7, 41, 0), floor
    assert budget.kept_run_seconds({"budget_run_seconds": 5400}, 3600) == 5400  # The first `up`'s deadline.
    assert budget.kept_run_seconds({"budget_run_seconds": 0}, 3600) == 3600  # No budget then: today's.
    assert budget.kept_run_seconds({}, 3600) == 3600  # A new cluster.
