"""The GPUs beside T4 and V100 (tfcluster/gpus.py) in the gcp world: the family's vCPU quota beside
the GPU quota (where Google keeps each), the world refusing an insert over quota, and L4 (G2) and A100 (A2) clusters through the real terraform, readiness and down."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import Cli
from tests.hostlab import HostLab
from tests.test_gcp_backend import api_for, fake_compute, make_gcp_cli, needs_hosts, terraform_calls  # noqa: F401
from tests.world.provider import mirror
from tfcluster.backends import gcp
from tfcluster.errors import ConfigError


def test_preflight_checks_the_family_vcpu_quota_beside_the_gpus(fake_compute):
    """G2 and A3 vCPUs count on Cloud Quotas' CPUS-PER-VM-FAMILY-per-project-region (vm_family), A2's on
    regions.get's A2_CPUS, N1's on CPUS (tfcluster/gpus.py); one line names every quota that falls short."""
    api = api_for(fake_compute)
    state = fake_compute.state
    state.accelerators["us-west1-b"] = ["nvidia-tesla-t4", "nvidia-l4"]
    state.region_quotas["us-west1"].update({"NVIDIA_L4_GPUS": (4.0, 0.0)})
    state.family_quotas["CPUS-PER-VM-FAMILY-per-project-region"] = [({"region": "us-west1", "vm_family": "G2"}, 48)]
    state.project_quotas["CPUS_ALL_REGIONS"] = (64.0, 0.0)
    gcp.preflight_quota(api, "us-west1-b", "nvidia-l4", 2, 2, spot=False, machine_type="g2-standard-24")
    state.region_quotas["us-west1"].update({"NVIDIA_L4_GPUS": (4.0, 3.0)})
    state.family_quotas["CPUS-PER-VM-FAMILY-per-project-region"] = [({"region": "us-west1", "vm_family": "G2"}, 32)]
    with pytest.raises(ConfigError) as error:
        gcp.preflight_quota(api, "us-west1-b", "nvidia-l4", 2, 2, spot=False, machine_type="g2-standard-24")
    assert str(error.value) == (
        "quota CPUS-PER-VM-FAMILY-per-project-region (vm_family:G2, region:us-west1) has a limit of 32 vCPUs and the "
        "cluster needs 48, whatever is in use; quota NVIDIA-L4-GPUS-per-project-region (region:us-west1) has 1 GPUs free "
        "(limit 4, in use 3); the cluster needs 4; request more in the console (IAM & Admin > Quotas & System Limits: "
        "filter by each quota ID and its dimensions)")
    # Spot: the GPUs' PREEMPTIBLE_ form where granted; the family's vCPUs have no such form.
    state.region_quotas["us-west1"].update({"PREEMPTIBLE_NVIDIA_L4_GPUS": (2.0, 0.0)})
    with pytest.raises(ConfigError, match=r"^quota CPUS-PER-VM-FAMILY-per-project-region .*; quota "
                                          r"PREEMPTIBLE-NVIDIA-L4-GPUS-per-project-region \(region:us-west1\) has 2 GPUs"):
        gcp.preflight_quota(api, "us-west1-b", "nvidia-l4", 2, 2, spot=True, machine_type="g2-standard-24")
    # N1's vCPUs are the CPUS quota (24 in a new project): 2 x n1-standard-8 fit, 4 do not.
    gcp.preflight_quota(api, "us-west1-b", "nvidia-tesla-t4", 1, 2, spot=False, machine_type="n1-standard-8")
    with pytest.raises(ConfigError, match=r"^quota CPUS-per-project-region \(region:us-west1\) has 24 vCPUs free"):
        gcp.preflight_quota(api, "us-west1-b", "nvidia-tesla-t4", 1, 4, spot=False, machine_type="n1-standard-8")


def test_the_world_refuses_an_insert_over_quota_as_google_does(fake_compute):
    """instances.insert past a quota: 403 quotaExceeded in Google's words, nothing made (tests/world/quotas.py)."""
    from google.api_core import exceptions
    from google.cloud import compute_v1

    api = api_for(fake_compute)
    # GPU machines stop on host maintenance (tests/world/instance_rules.py), as terraform/ sets them.
    body = {"name": "big", "machine_type": "zones/us-west1-b/machineTypes/n1-standard-32",
            "scheduling": compute_v1.Scheduling(on_host_maintenance="TERMINATE"),
            "disks": [compute_v1.AttachedDisk(boot=True, initialize_params=compute_v1.AttachedDiskInitializeParams(
                source_image="projects/deeplearning-platform-release/global/images/"
                             "common-cu129-ubuntu-2204-nvidia-580-v20261115", disk_size_gb=100,
                disk_type="zones/us-west1-b/diskTypes/pd-balanced"))]}
    with pytest.raises(exceptions.Forbidden) as refused:
        api.instances.insert(project="demo-project", zone="us-west1-b", instance_resource=compute_v1.Instance(**body))
    assert refused.value.message.endswith(": Quota 'CPUS' exceeded.  Limit: 24.0 in region us-west1.")
    assert [e["reason"] for e in refused.value.errors] == ["quotaExceeded"] and "big" not in fake_compute.state.instances
    # H100s on demand: the family quota, by its metric's name.
    fake_compute.state.accelerators["us-west1-b"].append("nvidia-h100-80gb")
    body.update(machine_type="zones/us-west1-b/machineTypes/a3-highgpu-8g",
                network_interfaces=[compute_v1.NetworkInterface(nic_type="GVNIC")])
    with pytest.raises(exceptions.Forbidden, match=r"Quota 'CPUS_PER_VM_FAMILY' exceeded.  Limit: 24.0 in region"):
        api.instances.insert(project="demo-project", zone="us-west1-b", instance_resource=compute_v1.Instance(**body))
    fake_compute.state.family_quotas["CPUS-PER-VM-FAMILY-per-project-region"] = [({"vm_family": "A3"}, 208)]
    fake_compute.state.project_quotas["CPUS_ALL_REGIONS"] = (208.0, 0.0)
    with pytest.raises(exceptions.Forbidden, match=r"Quota 'GPUS_PER_GPU_FAMILY' exceeded.  Limit: 0.0 in region"):
        api.instances.insert(project="demo-project", zone="us-west1-b", instance_resource=compute_v1.Instance(**body))


def single_host_cli(tmp_path, world, synthetic_data, tag: str) -> Cli:
    """The gcp CLI in the world with one lab host for one VM (`up --workers 1`)."""
    lab = HostLab(tmp_path / "lab", 1, tag=tag, listen_all=True, vm_login=True)
    return make_gcp_cli(tmp_path, world, lab, synthetic_data)


@needs_hosts
def test_up_l4_and_a100_through_terraform_readiness_and_down(tmp_path, world, synthetic_data):
    """G2 and A2 VMs: the machine type carries the GPUs (no guestAccelerators), the quota line names
    the family's vCPU quota, and the price is the family's: from the table (L4), then the catalog (A100
    80GB, whose bundled Local SSD is priced, discarded at a deadline's stop, and replaces nothing when read back)."""
    cli = single_host_cli(tmp_path, world, synthetic_data, "tl")
    state = cli.compute.state
    state.accelerators["us-west1-b"] += ["nvidia-l4", "nvidia-a100-80gb"]
    state.region_quotas["us-west1"].update({"NVIDIA_L4_GPUS": (1.0, 0.0), "NVIDIA_A100_80GB_GPUS": (1.0, 0.0),
                                            "A2_CPUS": (12.0, 0.0)})
    g2 = "CPUS-PER-VM-FAMILY-per-project-region"  # G2's vCPUs: in Cloud Quotas, not in regions.get.
    state.family_quotas[g2] = [({"region": "us-west1", "vm_family": "G2"}, 4)]
    table = json.loads(gcp.PRICES.read_text())
    try:
        refused = cli.run("up", "--gpu", "l4", "--workers", "1", timeout=60)
        assert refused.returncode == 2 and refused.stderr.strip().splitlines()[-1] == (
            "error: quota CPUS-PER-VM-FAMILY-per-project-region (vm_family:G2, region:us-west1) has a limit of 4 vCPUs "
            "and the cluster needs 8, whatever is in use; request more in the console (IAM & Admin > Quotas & System "
            "Limits: filter by each quota ID and its dimensions)"), refused.stderr
        assert "apply" not in terraform_calls(cli) and state.instances == {}
        state.family_quotas[g2] = [({"region": "us-west1", "vm_family": "G2"}, 8)]

        up = cli.run("up", "--gpu", "l4", "--workers", "1", timeout=180)
        assert up.returncode == 0, up.stdout + up.stderr
        # No G2 VM has run in the project, so Monitoring holds no usage point for the family: `?`, never ✓.
        assert "? quota: 1 x g2-standard-8 with 1 x nvidia-l4 in us-west1-b: cannot tell: quota " \
            "CPUS-PER-VM-FAMILY-per-project-region (vm_family:G2, region:us-west1) has a limit of 8 vCPUs and the " \
            "cluster needs 8; how much is in use cannot be read" in up.stdout
        assert "plan: 1 x g2-standard-8 + 1 x nvidia-l4 in us-west1-b" in up.stdout
        g2 = table["families"]["rates"]["g2"]
        per_vm = (8 * g2["vcpu_hour"] + 32 * g2["memory_gib_hour"] + table["gpu_hour"]["nvidia-l4"] + 100 * 0.1 / 730
                  + table["external_ip_hour"]["standard"])
        assert f"cost: on-demand (in use): ${per_vm:.2f}/hour for 1 VM(s)" in up.stdout
        assert f"prices of {table['families']['date']}: tfcluster's table" in up.stdout
        body = state.instances["default-0"]["body"]
        # The provider sends no guestAccelerators for an empty list (instance_body.py, as the real one).
        assert body["machineType"].endswith("/machineTypes/g2-standard-8") and not body.get("guestAccelerators")
        assert body["disks"][0]["initializeParams"]["diskType"].endswith("/diskTypes/pd-balanced")
        assert cli.cluster()["status"] == "up"
        down = cli.run("down", timeout=120)
        assert down.returncode == 0 and state.instances == {}, down.stdout + down.stderr

        # A100 80GB (a2-ultragpu-1g, with 375 GB of bundled Local SSD), priced by the catalog: the SKU as
        # Google spells it ("Nvidia Tesla A100 80GB GPU running in ..."), the Local SSD and the address.
        world.billing.catalog.disabled_projects.clear()
        (cli.state_dir / "cache" / "prices-us-west1.json").unlink()  # The refusal is remembered for an hour.
        up = cli.run("up", "--gpu", "a100-80gb", "--workers", "1", timeout=180)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "✓ quota: 1 x a2-ultragpu-1g with 1 x nvidia-a100-80gb in us-west1-b: 8 quotas have room " \
            "(A2-CPUS-per-project-region," in up.stdout and "LOCAL-SSD-TOTAL-GB-per-project-region)" in up.stdout
        assert "plan: 1 x a2-ultragpu-1g + 1 x nvidia-a100-80gb in us-west1-b" in up.stdout
        per_vm = (12 * 0.032 + 170 * 0.0043 + 4.00  # tests/world/billing.py's FAMILY/GPU_PRICES.
                  + 100 * 0.1 / 730 + 0.005 + 375 * table["local_ssd_gib_month"] / 730)  # Disk, IP, Local SSD.
        assert f"cost: on-demand (in use): ${per_vm:.2f}/hour" in up.stdout and "Cloud Billing Catalog" in up.stdout
        assert f"+ Local SSD ${375 * table['local_ssd_gib_month'] / 730:.2f})" in up.stdout
        body = state.instances["default-0"]["body"]
        assert body["machineType"].endswith("/machineTypes/a2-ultragpu-1g") and not body.get("guestAccelerators")
        assert body["scheduling"]["onInstanceStopAction"] == {"discardLocalSsd": True}
        variables = json.loads((cli.state_dir / "gcp" / "default" / "terraform.tfvars.json").read_text())
        assert (variables["gpu_type"], variables["gpu_count"], variables["machine_type"]) == (
            "nvidia-a100-80gb", 1, "a2-ultragpu-1g")
        # What a resumed `up` applies: Compute's own Local SSD, read back, replaces nothing.
        plan = subprocess.run([*cli.prefix, mirror.TERRAFORM, f"-chdir={cli.state_dir / 'gcp' / 'default'}", "plan",
                               "-input=false",
                               "-no-color", "-detailed-exitcode"], env=cli.env, capture_output=True, text=True,
                              timeout=300)
        assert plan.returncode == 0, plan.stdout + plan.stderr
        down = cli.run("down", timeout=120)
        assert down.returncode == 0 and state.instances == {}, down.stdout + down.stderr
    finally:
        if cli.cluster() is not None:
            cli.run("down", timeout=120)
        cli.lab.teardown()


def test_the_world_refuses_what_google_refuses_of_accelerator_optimized_vms(fake_compute):
    """The Compute stand-in's instances.insert (tests/world/compute_resources.py) refuses, in Google's
    words, what config.py and variables.tf refuse first: so a rule lost on both sides still fails."""
    from tests.world.compute_resources import _refusal

    def body(machine: str, disk: str = "pd-balanced", nic: str = "", spot: bool = False, gpus: int = 0) -> dict:
        return {"machineType": f"zones/us-west1-b/machineTypes/{machine}",
                "disks": [{"initializeParams": {"diskType": f"diskTypes/{disk}", "sourceImage":
                           "projects/deeplearning-platform-release/global/images/common-cu129-ubuntu-2204-nvidia-580-v20261115"}}],
                "networkInterfaces": [{"nicType": nic} if nic else {}],
                "scheduling": {"provisioningModel": "SPOT" if spot else "STANDARD", "onHostMaintenance": "TERMINATE"},
                "guestAccelerators": [{"acceleratorType": "nvidia-l4", "acceleratorCount": gpus}] if gpus else []}

    state = fake_compute.state
    assert _refusal(state, "us-west1-b", body("g2-standard-8")) is None
    assert _refusal(state, "us-west1-b", body("a3-highgpu-8g", nic="GVNIC")) is None
    assert _refusal(state, "us-west1-b", body("a3-highgpu-2g", nic="GVNIC", spot=True)) is None
    refusals = {case: _refusal(state, "us-west1-b", b)[1]["error"]["message"] for case, b in {
        "attached": body("g2-standard-8", gpus=1), "pd-standard": body("g2-standard-8", disk="pd-standard"),
        "virtio": body("a3-highgpu-8g"), "spot-only": body("a3-highgpu-2g", nic="GVNIC")}.items()}
    assert "comes with its GPUs" in refusals["attached"]
    assert refusals["pd-standard"] == "[pd-standard] features are not compatible for creating instance."
    assert "requires GVNIC" in refusals["virtio"] and "only with Spot VMs" in refusals["spot-only"]


def test_a_vm_with_bundled_local_ssd_is_stopped_with_discard_local_ssd(fake_compute):
    """Compute refuses a stop without discardLocalSsd when the VM has Local SSD (400, Google's words);
    `train --then stop` (vm_control.stop_all) and host maintenance (stop_some) still stop an a3-highgpu-8g."""
    from google.api_core import exceptions
    from google.cloud import compute_v1

    from tfcluster.backends.gcp.vms import vm_control
    from tfcluster.state import ClusterState, HostRecord

    api = api_for(fake_compute)
    for name in ("h-0", "h-1"):
        fake_compute.state.instances[name] = {
            "zone": "us-central1-a", "labels": {}, "status": "RUNNING", "guest": {}, "metadata": {},
            "body": {"machineType": "zones/us-central1-a/machineTypes/a3-highgpu-8g"}}
    with pytest.raises(exceptions.BadRequest) as refused:
        api.instances.stop(request=compute_v1.StopInstanceRequest(project="demo-project", zone="us-central1-a",
                                                                  instance="h-0"))
    assert refused.value.message.endswith(
        "VM has a Local SSD attached but an undefined value for `discard-local-ssd`. If using gcloud, please add "
        "`--discard-local-ssd=false` or `--discard-local-ssd=true` to your command.")
    cluster = ClusterState(name="h", backend="gcp", hosts=[
        HostRecord(name=f"worker-{i}", address=f"10.0.0.{i}", tf_port=2222, instance=f"h-{i}") for i in (0, 1)],
        project="demo-project", zone="us-central1-a")
    assert vm_control.stop_all(api, cluster) == ["h-0", "h-1"]
    assert {vm["status"] for vm in fake_compute.state.instances.values()} == {"TERMINATED"}
    stops = [r for r in fake_compute.state.requests if r["path"].endswith("/stop")]
    assert [r["query"].get("discardLocalSsd") for r in stops] == [None, ["true"], ["true"]]
