"""`invoke offers` in the test world: the zones that offer a GPU (acceleratorTypes.aggregatedList),
one VM's price per hour on-demand and Spot (the catalog stand-in, else the dated table), the
region's free quota (one regions.list), cheapest first. Nothing is created."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import Cli
from tfcluster.backends.gcp.prices.cost import PRICES


@pytest.fixture
def offers_cli(tmp_path, world, synthetic_data):
    """The CLI in the world, with L4 in four zones of four regions (one the catalog has no price for)."""
    state = world.compute.state
    state.accelerators.update({"us-west1-b": ["nvidia-tesla-t4", "nvidia-l4"], "us-central1-a": ["nvidia-l4"],
                               "us-central1-b": ["nvidia-tesla-t4"], "europe-west4-a": ["nvidia-l4"],
                               "asia-east1-a": ["nvidia-l4"]})
    state.region_quotas.update({"us-central1": {"NVIDIA_L4_GPUS": (2.0, 0.0)},
                                "europe-west4": {"NVIDIA_L4_GPUS": (8.0, 3.0), "PREEMPTIBLE_NVIDIA_L4_GPUS": (16.0, 0.0)},
                                "asia-east1": {"NVIDIA_L4_GPUS": (1.0, 0.0)}})
    state.region_quotas["us-west1"]["NVIDIA_L4_GPUS"] = (4.0, 1.0)
    cli = Cli(tmp_path / "state", synthetic_data)
    cli.enter(world)
    cli.env["INVOKE_TFCLUSTER_PROJECT"] = state.project
    cli.world = world
    return cli


def rows(stdout: str) -> list[list[str]]:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("zone "))
    return [line.split() for line in lines[start + 1:] if re.fullmatch(r"[a-z]+-[a-z]+\d+-[a-z]", line.split()[0])]


def test_offers_lists_every_zone_cheapest_first_with_the_regions_quota(offers_cli):
    from tests.world.capacity import Reservation

    world = offers_cli.world
    world.billing.catalog.disabled_projects.clear()
    world.compute.state.capacity.reservations = {
        ("us-west1-b", "g2s"): Reservation("g2s", "us-west1-b", "g2-standard-8", 3, in_use={"other-vm"}),
        ("us-west1-b", "a2s"): Reservation("a2s", "us-west1-b", "a2-highgpu-1g", 4)}
    mark = len(world.compute.state.requests)
    listed = offers_cli.run("offers", "--gpu", "l4", timeout=120)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert listed.stdout.startswith("l4: 4 zone(s) offer nvidia-l4; one VM is g2-standard-8 with 1 GPU(s); cheapest "
                                    "on-demand first; quota: GPUs free of NVIDIA-L4-GPUS-per-project-region in the zone's region")
    # g2-standard-8 (8 vCPUs, 32 GB) + 1 L4 at tests/world/billing.py's prices, + the external IPv4 address
    # ($0.005 an hour, $0.0025 on Spot: prices.json): the Netherlands are cheaper than the Americas; Taiwan
    # has no SKU in the catalog, so no price, and comes last.
    # Flex-start: G2's bills on-demand (tests/world/facts.py, FLEX_START_DISCOUNT; the catalog sells no G2 or L4
    # DWS SKU). A reservation holding 3 g2-standard-8 VMs, 1 in use, in us-west1-b: 2 free there.
    assert rows(listed.stdout) == [["europe-west4-a", "$0.71", "$0.25", "$0.71", "5", "0"],
                                   ["us-central1-a", "$0.87", "$0.33", "$0.87", "2", "0"],
                                   ["us-west1-b", "$0.87", "$0.33", "$0.87", "3", "2"],
                                   ["asia-east1-a", "?", "?", "?", "1", "0"]]
    assert "prices: Cloud Billing Catalog, read now\n" in listed.stdout  # No table price stood in for Flex-start.
    # One aggregatedList of each and one regions.list, not a call per zone or region.
    paths = [r["path"].split("/demo-project", 1)[1] for r in world.compute.state.requests[mark:]]
    assert paths == ["/aggregated/acceleratorTypes", "/regions", "/aggregated/reservations"], paths

    # --spot: ordered by the Spot price, with the PREEMPTIBLE_ quota where the region has one.
    spot = offers_cli.run("offers", "--gpu", "l4", "--spot", timeout=120)
    assert spot.returncode == 0, spot.stdout + spot.stderr
    assert [row[0] for row in rows(spot.stdout)] == ["europe-west4-a", "us-central1-a", "us-west1-b", "asia-east1-a"]
    assert rows(spot.stdout)[0][4] == "16"

    # --gpu-count picks the machine type the price is for: g2-standard-24 has 2 L4s.
    two = offers_cli.run("offers", "--gpu", "l4", "--gpu-count", "2", timeout=120)
    assert "one VM is g2-standard-24 with 2 GPU(s)" in two.stdout
    assert rows(two.stdout)[0][:2] == ["europe-west4-a", f"${24 * 0.026 + 96 * 0.003 + 2 * 0.40 + 0.005:.2f}"]


def test_offers_falls_back_to_the_table_and_refuses_in_one_line(offers_cli):
    # The world's project starts without the Cloud Billing API: the dated table prices every zone alike.
    listed = offers_cli.run("offers", "--gpu", "l4", timeout=120)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert [row[0] for row in rows(listed.stdout)] == ["asia-east1-a", "europe-west4-a", "us-central1-a", "us-west1-b"]
    assert "tfcluster's table (us-central1 list prices" in listed.stdout and "G2 and its GPU: approximate" in listed.stdout
    assert "catalog unavailable: the cloudbilling.googleapis.com API is not enabled" in listed.stdout

    for args, line in [
        (("--gpu", "l4", "--gpu-count", "3"), "error: gpu_count must be one of 1, 2, 4, 8 for l4 on G2 (got 3)"),
        (("--gpu", "a100"), "error: no zone offers nvidia-tesla-a100 to project demo-project; see "
                            "https://cloud.google.com/compute/docs/gpus/gpu-regions-zones")]:
        refused = offers_cli.run("offers", *args, timeout=120)
        assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [line], refused.stderr
    # No project yet (choosing a GPU first): the dated table's price of one VM, marked as such, no zones
    # or quota, and nothing asked of Google.
    offers_cli.env.pop("INVOKE_TFCLUSTER_PROJECT")
    mark = len(offers_cli.world.compute.state.requests)
    table = json.loads(PRICES.read_text())
    g2 = table["families"]["rates"]["g2"]
    vm = 8 * g2["vcpu_hour"] + 32 * g2["memory_gib_hour"] + table["gpu_hour"]["nvidia-l4"]
    alone = offers_cli.run("offers", "--gpu", "l4", "--gpu-count", "1", timeout=120)
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert alone.stdout.splitlines() == [
        f"l4: one VM is g2-standard-8 with 1 x nvidia-l4: ${vm + 0.005:.2f}/h on-demand, "
        f"${vm * (1 - table['spot_discount']) + 0.0025:.2f}/h Spot, "
        f"${vm + 0.005:.2f}/h Flex-start",
        f"prices of {table['families']['date']}: tfcluster's table (us-central1 list prices, Spot as a flat 70% off, "
        f"Flex-start at on-demand (G2 is not discounted); G2 and its GPU: {table['families']['note']}, "
        f"{table['families']['date']}); "
        "no project given, so no zones "
        "and no quota: `invoke offers --project P` lists the zones that offer it, priced for their region, with "
        "your quota"]
    assert len(offers_cli.world.compute.state.requests) == mark
    a3 = offers_cli.run("offers", "--gpu", "h100", "--gpu-count", "8", timeout=120)
    assert "one VM is a3-highgpu-8g with 8 x nvidia-h100-80gb and 6000 GB of bundled Local SSD: $" in a3.stdout


@pytest.mark.parametrize("spelling", ["h100", "H100"])
def test_offers_for_a_gpu_lists_every_machine_type_in_every_provisioning_model(spelling, tmp_path, capsys, monkeypatch):
    """Issue 47: `offers --gpu h100` refused ("a3-highgpu-1g is offered only as Spot or Flex-start");
    `sky show-gpus H100` just answers. Every A3 type is listed, "-" where Google makes none, with the flags
    that make each; a spot-only type asked for by --gpu-count is priced too, never on-demand."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("INVOKE_TFCLUSTER_PROJECT", raising=False)
    listed = tfcluster(["offers", "--gpu", spelling], capsys)
    table = [line.split() for line in listed if line.startswith("a3-")]
    assert [(row[0], row[1], row[2]) for row in table] == [
        ("a3-highgpu-1g", "1", "-"), ("a3-highgpu-2g", "2", "-"), ("a3-highgpu-4g", "4", "-"),
        ("a3-highgpu-8g", "8", table[3][2])] and table[3][2].startswith("$")
    assert all(row[3].startswith("$") and row[4].startswith("$") for row in table)  # Spot and Flex-start for each.
    assert " ".join(table[0][5:]) == "--gpu h100 --gpu-count 1 and --spot or --provisioning flex-start"
    assert " ".join(table[3][5:]) == "--gpu h100 --gpu-count 8"
    one = tfcluster(["offers", "--gpu", spelling, "--gpu-count", "1"], capsys)[0]
    assert "on-demand (none: Spot or Flex-start only), $" in one and "/h Spot, $" in one
    vertex = tfcluster(["offers", "--backend", "vertex", "--gpu", "t4"], capsys)  # No project needed either.
    assert vertex[0].startswith("t4 on Vertex AI: one replica is n1-standard-8 with 1 GPU(s): $")


def tfcluster(argv: list[str], capsys) -> list[str]:
    """The installed command in process; its stdout lines (it must succeed)."""
    from tfcluster import cli, program

    try:
        program.TfclusterProgram(namespace=cli.ns, name="tfcluster", binary="tfcluster").run(["tfcluster", *argv])
    except SystemExit as ended:
        assert ended.code == 0, capsys.readouterr()
    out, err = capsys.readouterr()
    assert err == "", err
    return out.splitlines()
