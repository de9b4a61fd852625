"""The gcp backend's collaborators on their own, without a GcpBackend: the Quoter (prices/quoter.py), the
SpendTracker (spend/ledger_events.py) and the Budget (spend/budget.py), each built from what its
docstring says it needs, against the Google world (Compute and the Billing Catalog stand-ins; the catalog
is disabled for the world's project, so quotes come from the dated table, as Google's refusal makes them)."""

from __future__ import annotations

import json
import math
import time

import pytest

from tfcluster import ledger
from tfcluster.backends.gcp.cloud.compute import ComputeApi
from tfcluster.backends.gcp.cloud.terraform import Terraform
from tfcluster.backends.gcp.prices.quoter import Quoter
from tfcluster.backends.gcp.spend.budget import Budget
from tfcluster.backends.gcp.spend.ledger_events import SpendTracker
from tfcluster.config import Settings
from tfcluster.ledger import Event, Ledger, Prices
from tfcluster.state import ClusterState, HostRecord, StateStore

ZONE = "us-west1-b"
# What `up` applied (terraform.tfvars.json): the collaborators price the VMs as they are.
APPLIED = {"machine_type": "n1-standard-8", "gpu_type": "nvidia-tesla-t4", "gpu_count": 1, "boot_disk_gb": 100,
           "boot_disk_type": "pd-balanced", "spot": False}


def made(tmp_path, budget: float = 10.0, spot: bool = False):
    settings = Settings(backend="gcp", cluster="c", project="demo-project", zone=ZONE, state_dir=str(tmp_path / "state"),
                        budget=budget, max_run_hours=24, gpu="t4", gpu_count=1)
    store = StateStore(settings, "c")
    workdir = lambda name: store.root / "gcp" / name  # noqa: E731 - GcpBackend.workdir's folder
    workdir("c").mkdir(parents=True)
    (workdir("c") / "terraform.tfvars.json").write_text(json.dumps({**APPLIED, "spot": spot}))
    hosts = [HostRecord(name=f"worker-{i}", address=f"10.0.0.{i}", tf_port=2222, instance=f"c-worker-{i}")
             for i in range(2)]
    cluster = ClusterState(name="c", backend="gcp", hosts=hosts, project="demo-project", zone=ZONE,
                           created_at=time.time() - 3600)
    return settings, store, workdir, cluster


class LedgerWriter:
    """A SpendTracker as Budget uses it (its ``sync``): writes what the real one would have found, the
    cluster's two VMs running since its creation an hour ago at these rates."""

    RATES = {"vm": 0.4, "gpu": 0.35, "disk": 0.01}

    def __init__(self):
        self.synced: list[str] = []

    def sync(self, cluster, settings, book: Ledger, own: str = "", run: str = "") -> list[str]:
        self.synced.append(cluster.name)
        book.note_prices(Prices(at=cluster.created_at, on_demand=self.RATES, spot=self.RATES, spot_in_use=False,
                                gpu_count=1, workers=2, date="2026-10-15", source="test rates", live=True))
        book.append([Event(cluster.created_at, r.instance, ledger.START, ledger.OWN) for r in cluster.hosts])
        return []


def test_the_budget_holds_each_vm_to_what_is_left_after_the_ledger_is_brought_up_to_date(world, tmp_path):
    settings, store, workdir, cluster = made(tmp_path)
    quoter, tracker, said = Quoter(store), LedgerWriter(), []
    budget = Budget(store, tracker, quoter.quote, lambda c: ComputeApi(c.project), workdir, said.append)
    rate = quoter.quote(settings, "demo-project", ZONE, 2, False, APPLIED).for_budget.total
    assert rate > 0

    seconds = budget.max_run_seconds(cluster, settings, Terraform(workdir("c"), project="demo-project"))

    # The ledger was synced first, so the hour both VMs already ran counts against the $10.
    assert tracker.synced == ["c"]
    spent = 2 * sum(LedgerWriter.RATES.values())  # Two VMs, one hour.
    assert seconds == pytest.approx(math.floor((10.0 - spent) / rate * 3600), abs=5)
    assert json.loads((workdir("c") / "terraform.tfvars.json").read_text())["budget_run_seconds"] == seconds
    # Less than a minute left: refused, naming the fix.
    poor = Budget(store, LedgerWriter(), quoter.quote, lambda c: ComputeApi(c.project), workdir, said.append)
    with pytest.raises(Exception, match=r"has spent \$.* of its --budget \$1\.00: less than a minute is left"):
        poor.max_run_seconds(cluster, made(tmp_path / "poor", budget=1.0)[0],
                             Terraform(workdir("c"), project="demo-project"))
    # Without a budget: max_run_hours, and nothing is read.
    quiet = LedgerWriter()
    free = Budget(store, quiet, quoter.quote, lambda c: ComputeApi(c.project), workdir, said.append)
    assert free.max_run_seconds(cluster, made(tmp_path / "free", budget=0.0)[0],
                                Terraform(workdir("c"), project="demo-project")) == 24 * 3600
    assert quiet.synced == []


def test_the_budget_rate_is_the_applied_vms_and_spot_is_held_to_on_demand_without_live_prices(world, tmp_path):
    settings, store, workdir, cluster = made(tmp_path, spot=True)
    quoter, said = Quoter(store), []
    budget = Budget(store, LedgerWriter(), quoter.quote, lambda c: ComputeApi(c.project), workdir, said.append)
    quote = quoter.quote(settings, "demo-project", ZONE, 2, True, {**APPLIED, "spot": True})
    assert quote.in_use == quote.spot and not quote.live

    assert budget.hourly_rate(cluster, settings) == pytest.approx(quote.on_demand.total)
    assert said == [f"--budget: Spot VMs are held to the on-demand rate (${quote.on_demand.total:.2f}/hour): without "
                    "the live catalog the day's Spot price is unknown"]


def test_the_spend_tracker_keeps_the_ledger_from_what_compute_lists(world, tmp_path):
    settings, store, workdir, cluster = made(tmp_path)
    quoter = Quoter(store)
    tracker = SpendTracker(lambda c: ComputeApi(c.project), workdir, quoter.quote)
    book = Ledger(store.root, "c")
    book.append([Event(cluster.created_at, "c-worker-0", ledger.START, ledger.OWN)])

    # Compute lists no VM of the cluster (none was made in the world): the one the ledger holds running is
    # recorded gone, as observed; the prices in force are the applied VMs' quote; no bucket, no storage.
    assert tracker.sync(cluster, settings, book) == []
    [gone] = [e for e in book.events() if e.kind == ledger.DELETE]
    assert (gone.instance, gone.source, gone.detail) == ("c-worker-0", ledger.OBSERVED, "not listed")
    quote = quoter.quote(settings, "demo-project", ZONE, 2, False, APPLIED)
    prices = book.prices()
    assert prices.workers == 2 and prices.on_demand["gpu"] == pytest.approx(quote.on_demand.gpu)
    assert book.storage()[-1].bucket_bytes == 0
    # Synced again: nothing new (each event once).
    count = len(book.events())
    tracker.sync(cluster, settings, book)
    assert len(book.events()) == count
