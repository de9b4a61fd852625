"""Zone failover at `up` (tfcluster/backends/gcp/zones/failover.py): in the gcp world, with capacity
scripted per zone for instances.insert (tests/fake_compute.py no_capacity_zones, zone_room), the
real terraform and provider stand-ins move a new cluster to the next zone, remove what they made in
a full one, and never move (replace) the bucket or the registry."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tests.test_gcp_backend import bucket_of, fake_compute, gcp_cli, needs_hosts, terraform_log  # noqa: F401
from tfcluster import config
from tfcluster.backends.gcp.cloud.errors import terraform_error_line, zone_refusal
from tfcluster.errors import ConfigError


def test_zones_setting_and_what_counts_as_a_full_zone():
    # `zone` first, then `zones` (a list in invoke.yaml, "a,b" from INVOKE_TFCLUSTER_ZONES), each once.
    settings = config.load({"zones": ["us-west1-a", "us-central1-a"]}, zone="us-central1-a")
    assert (settings.zone, settings.zones) == ("us-central1-a", ("us-central1-a", "us-west1-a"))
    assert config.load({"zones": "us-west1-a, us-west1-b"}).zones == ("us-west1-a", "us-west1-b")
    with pytest.raises(ConfigError, match=r"^a zone must be a name such as us-west1-b, or auto alone in --zone or "
                                          r"tfcluster.zone \(got 'auto'\); fix --zone"):
        config.load({"zones": ["us-west1-a", "auto"]})
    # As the google provider prints a failed insert: the operation's messages (writeOperationError).
    for text, why in [
        ("Error waiting for instance to create: The zone 'projects/p/zones/us-west1-a' does not have enough "
         "resources available to fulfill the request.  Try a different zone, or try again later.",
         "no capacity (ZONE_RESOURCE_POOL_EXHAUSTED)"),
        ("Error waiting for instance to create: A n1-standard-8 VM instance with 1 nvidia-tesla-t4 is currently "
         "unavailable in the us-west1-b zone. Capacity changes frequently, so try your request in a different zone",
         "no capacity (ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS)"),
        ("Error waiting for instance to create: The region 'projects/p/regions/us-west1' does not have enough "
         "resources available to fulfill the request.", "no capacity in its region (REGION_RESOURCE_POOL_EXHAUSTED)"),
        ("Error creating instance: googleapi: Error 503: Insufficient capacity, insufficientCapacity",
         "no capacity (insufficientCapacity)"),
        ("Error creating instance: googleapi: Error 403: Quota 'NVIDIA_T4_GPUS' exceeded.  Limit: 0.0 in region "
         "us-west1., quotaExceeded", "no quota (NVIDIA_T4_GPUS)"),
        ("Error creating instance: googleapi: Error 400: Invalid value for field 'resource.machineType'", None),
    ]:
        assert zone_refusal(f"╷\n│ Error: {text}\n╵") == why, text
    # The one-line fix for a single zone names the _WITH_DETAILS message as no capacity too.
    details = "Error: Error waiting for instance to create: A g2-standard-8 VM instance is currently unavailable " \
        "in the us-central1-a zone."
    assert terraform_error_line(details, "p").startswith("the zone has no capacity for these VMs right now")


@needs_hosts
def test_up_lands_in_the_third_zone_and_keeps_the_bucket(gcp_cli, world):
    state = gcp_cli.compute.state
    for zone in ("us-west1-a", "us-central1-a"):
        state.accelerators[zone] = ["nvidia-tesla-t4"]
    state.region_quotas["us-central1"] = {"NVIDIA_T4_GPUS": (8.0, 0.0)}
    state.no_capacity_zones = {"us-west1-a": "ZONE_RESOURCE_POOL_EXHAUSTED",
                               "us-west1-b": "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"}

    # Two zones, both full: one line, no VM left, and the cluster remembered (the bucket exists).
    gcp_cli.env["INVOKE_TFCLUSTER_ZONE"] = ""
    gcp_cli.env["INVOKE_TFCLUSTER_ZONES"] = "us-west1-a,us-west1-b"
    state.zone_room = {}
    first = gcp_cli.run("up", timeout=120)
    assert first.returncode == 2 and first.stderr.strip().splitlines() == [
        "error: no zone could take the cluster (us-west1-a: no capacity (ZONE_RESOURCE_POOL_EXHAUSTED); us-west1-b: "
        "no capacity (ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS)); no VM is left in them. Add zones to "
        "tfcluster.zones (`invoke offers` lists where the GPU is), request more of a quota it names, or run `invoke "
        "up` again later; `invoke down` removes what was created"], first.stdout + first.stderr
    assert gcp_cli.cluster()["status"] == "provisioning" and state.instances == {}
    tfvars = gcp_cli.state_dir / "gcp" / "default" / "terraform.tfvars.json"
    pinned = json.loads(tfvars.read_text())
    assert (pinned["bucket_location"], pinned["registry_location"]) == ("US-WEST1", "us-west1")
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(project="demo-project", credentials=AnonymousCredentials(),
                            client_options={"api_endpoint": gcp_cli.storage})
    [bucket_name] = [b.name for b in client.list_buckets() if b.name.startswith("demo-project-default-")]
    bucket_of(gcp_cli.storage, bucket_name).blob("data/train-00000.tfrecord").upload_from_string(b"z" * 4096)

    # Four zones: europe-west4 has no T4 quota (a new project's none), so its zone is dropped before
    # anything is made there; us-west1-a has no room; us-west1-b takes one of the two VMs, then has
    # none; the fourth (another region) takes the cluster.
    state.accelerators["europe-west4-a"] = ["nvidia-tesla-t4"]
    state.zone_room = {"us-west1-b": 1}
    gcp_cli.env["INVOKE_TFCLUSTER_ZONES"] = "europe-west4-a,us-west1-a,us-west1-b,us-central1-a"
    up = gcp_cli.run("up", timeout=240)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "plan: 2 x n1-standard-8 + 1 x nvidia-tesla-t4 in us-west1-a (else us-west1-b, us-central1-a, in " \
        "turn), bucket" in up.stdout
    lines = [line[2:] for line in up.stdout.splitlines() if line.startswith("! zone ")]
    assert lines == [
        "zone europe-west4-a dropped: quota NVIDIA-T4-GPUS-per-project-region (region:europe-west4) has 0 GPUs free "
        "(limit 0, in use 0); the cluster needs 2; request more in the console (IAM & Admin > Quotas & System Limits: "
        "filter by each quota ID and its dimensions)",
        "zone us-west1-a (1 of 3): no capacity (ZONE_RESOURCE_POOL_EXHAUSTED); removed the 0 VM(s) made there; "
        "trying us-west1-b",
        "zone us-west1-b (2 of 3): no capacity (ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS); removed the 1 VM(s) "
        "made there; trying us-central1-a",
        "zone us-central1-a is in us-central1; the bucket stays in US-WEST1 and the registry stays in us-west1 "
        "(never moved): the VMs' reads and image pulls from there are inter-region data transfer, billed per GB "
        "(https://cloud.google.com/storage/pricing#network-egress)",
        "zone us-central1-a (3 of 3): the cluster's VMs are created here"], up.stdout
    cluster = gcp_cli.cluster()
    assert cluster["status"] == "up" and cluster["zone"] == "us-central1-a"
    assert {name: vm["zone"] for name, vm in state.instances.items()} == {
        "default-0": "us-central1-a", "default-1": "us-central1-a"}
    # us-west1-b's VM was made, then deleted there before us-central1-a was tried.
    deletes = [r["path"] for r in state.requests if r["method"] == "DELETE" and "/instances/" in r["path"]]
    assert len(deletes) == 1 and "/zones/us-west1-b/instances/default-" in deletes[0]
    # The bucket and the registry stayed where the first `up` put them, the bucket with its objects.
    assert cluster["bucket"] == bucket_name
    assert bucket_of(gcp_cli.storage, bucket_name).blob("data/train-00000.tfrecord").exists()
    tfstate = json.loads((gcp_cli.state_dir / "gcp" / "default" / "terraform.tfstate").read_text())
    located = {r["type"]: r["instances"][0]["attributes"]["location"] for r in tfstate["resources"]
               if r["type"] in ("google_storage_bucket", "google_artifact_registry_repository")}
    assert located == {"google_storage_bucket": "US-WEST1", "google_artifact_registry_repository": "us-west1"}
    assert cluster["registry"] == "us-west1-docker.pkg.dev/demo-project/default-images"
    assert ["destroy", "-input=false", "-auto-approve", "-no-color", "-target=google_compute_instance.worker"] \
        in terraform_log(gcp_cli)


def test_a_quota_refusal_moves_past_what_the_quota_covers():
    """A regional quota is the same in every zone of the region; a project-wide one everywhere."""
    from tfcluster.backends.gcp.zones.failover import after_refusal

    zones = ["us-west1-a", "us-west1-b", "us-central1-a", "us-central1-b"]
    assert after_refusal(zones, 0, "no capacity (ZONE_RESOURCE_POOL_EXHAUSTED)") == (zones[1:], "")
    assert after_refusal(zones, 0, "no quota (CPUS)") == (
        ["us-central1-a", "us-central1-b"], "skipping us-west1-b: CPUS is us-west1's, the same in each of its zones")
    assert after_refusal(zones, 1, "no quota (GPUS_PER_GPU_FAMILY)") == (["us-central1-a", "us-central1-b"], "")
    assert after_refusal(zones, 0, "no quota (GPUS_ALL_REGIONS)") == (
        [], "GPUS_ALL_REGIONS is project-wide: no other zone has more of it")
    assert after_refusal(zones, 2, "no quota (CPUS_ALL_REGIONS)")[0] == []


def test_zone_auto_is_the_offered_zones_with_quota_cheapest_first(world):
    from tfcluster.backends.gcp.zones.failover import next_zones, with_auto_zones

    state = world.compute.state
    state.accelerators.update({"us-central1-a": ["nvidia-l4"], "europe-west4-a": ["nvidia-l4"],
                               "asia-east1-a": ["nvidia-l4"], "us-west1-b": ["nvidia-l4"]})
    state.region_quotas.update({"us-central1": {"NVIDIA_L4_GPUS": (2.0, 0.0)},
                                "europe-west4": {"NVIDIA_L4_GPUS": (8.0, 3.0)},
                                "asia-east1": {"NVIDIA_L4_GPUS": (9.0, 0.0)}})
    state.region_quotas["us-west1"]["NVIDIA_L4_GPUS"] = (4.0, 1.0)
    world.billing.catalog.disabled_projects.clear()  # Prices per region (tests/world/billing.py).
    said = []
    settings = config.load({"backend": "gcp", "project": "demo-project", "gpu": "l4", "workers": 2}, zone="auto")
    assert (settings.zone, settings.zones) == ("auto", ("auto",))
    # europe-west4 is the cheapest; us-central1-a and us-west1-b cost the same (then by name); Taiwan
    # has no price (last). Each region has at least 2 L4s free: all four, in that order.
    resolved = with_auto_zones(settings, said.append)
    assert resolved.zones == ("europe-west4-a", "us-central1-a", "us-west1-b", "asia-east1-a")
    assert resolved.zone == "europe-west4-a" and resolved.workers == 2
    assert said == ["zone auto: europe-west4-a, us-central1-a, us-west1-b, asia-east1-a (the zones `invoke offers` "
                    "lists with 2 nvidia-l4 GPU(s) of quota free, cheapest on-demand first; tried in turn)"]
    # Three VMs need 3 GPUs free: us-central1 (2) drops out.
    three = with_auto_zones(dataclasses.replace(settings, workers=3), said.append)
    assert three.zones == ("europe-west4-a", "us-west1-b", "asia-east1-a")
    with pytest.raises(ConfigError, match=r"^zone auto found no zone whose quota has 20 nvidia-l4 GPU\(s\) free "
                                          r"\(4 zone\(s\) offer it; `invoke offers` lists them"):
        with_auto_zones(dataclasses.replace(settings, workers=20), said.append)
    assert with_auto_zones(config.load({}, zone="us-west1-b"), said.append).zones == ("us-west1-b",)  # Not auto.
    with pytest.raises(ConfigError, match=r"^a zone must be a name such as us-west1-b, or auto alone in --zone"):
        config.load({"zones": ["us-west1-a"]}, zone="auto")  # Not with zones: auto picks them.
    # Where a cluster whose zone stays full moves: the zones after it, then those before it.
    assert next_zones("b", ["a", "b", "c"]) == ["c", "a"] and next_zones("b", ["b"]) == []
    assert next_zones("x", ["a", "b"]) == ["a", "b"]
