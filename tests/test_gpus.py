"""The GPUs beside T4 and V100 (tfcluster/gpus.py) in the gcp world: the family's vCPU quota beside
the GPU quota, and L4 (G2) and A100 (A2) clusters through the real terraform, readiness and down."""

from __future__ import annotations

import json

import pytest

from tests.conftest import Cli
from tests.hostlab import HostLab
from tests.test_gcp_backend import api_for, fake_compute, make_gcp_cli, needs_hosts, terraform_calls  # noqa: F401
from tfcluster.backends import gcp
from tfcluster.errors import ConfigError


def test_preflight_checks_the_family_vcpu_quota_beside_the_gpus(fake_compute):
    """G2, A2 and A3 VMs count against their family's vCPU quota too (tfcluster/gpus.py); one line
    names every quota that falls short."""
    api = api_for(fake_compute)
    state = fake_compute.state
    state.accelerators["us-west1-b"] = ["nvidia-tesla-t4", "nvidia-l4"]
    state.region_quotas["us-west1"].update({"NVIDIA_L4_GPUS": (4.0, 0.0), "G2_CPUS": (48.0, 0.0)})
    gcp.preflight_quota(api, "us-west1-b", "nvidia-l4", 2, 2, spot=False, machine_type="g2-standard-24")
    state.region_quotas["us-west1"].update({"NVIDIA_L4_GPUS": (4.0, 3.0), "G2_CPUS": (32.0, 0.0)})
    with pytest.raises(ConfigError) as error:
        gcp.preflight_quota(api, "us-west1-b", "nvidia-l4", 2, 2, spot=False, machine_type="g2-standard-24")
    assert str(error.value) == (
        "quota NVIDIA_L4_GPUS in us-west1 has 1 GPUs free (limit 4, used 3); the cluster needs 4, and quota G2_CPUS "
        "in us-west1 has 32 vCPUs free (limit 32, used 0); the cluster needs 48. Request more in the console: "
        "IAM & Admin > Quotas, filter NVIDIA_L4_GPUS, G2_CPUS, region us-west1")
    # Spot: the PREEMPTIBLE_ forms where granted, for the GPUs and the vCPUs alike.
    state.region_quotas["us-west1"].update({"PREEMPTIBLE_NVIDIA_L4_GPUS": (8.0, 0.0), "PREEMPTIBLE_G2_CPUS": (8.0, 0.0)})
    with pytest.raises(ConfigError, match=r"^quota PREEMPTIBLE_G2_CPUS in us-west1 has 8 vCPUs free"):
        gcp.preflight_quota(api, "us-west1-b", "nvidia-l4", 2, 2, spot=True, machine_type="g2-standard-24")
    # N1's vCPUs are the general CPUS quota, which is not checked.
    gcp.preflight_quota(api, "us-west1-b", "nvidia-tesla-t4", 1, 2, spot=False, machine_type="n1-standard-8")


def single_host_cli(tmp_path, world, synthetic_data, tag: str) -> Cli:
    """The gcp CLI in the world with one lab host for one VM (`up --workers 1`)."""
    lab = HostLab(tmp_path / "lab", 1, tag=tag, listen_all=True, vm_login=True)
    return make_gcp_cli(tmp_path, world, lab, synthetic_data)


@needs_hosts
def test_up_l4_and_a100_through_terraform_readiness_and_down(tmp_path, world, synthetic_data):
    """G2 and A2 VMs: the machine type carries the GPUs (no guestAccelerators), the quota line names
    the family's vCPU metric, and the price is the family's: from the table (L4), then the catalog (A100)."""
    cli = single_host_cli(tmp_path, world, synthetic_data, "tl")
    state = cli.compute.state
    state.accelerators["us-west1-b"] += ["nvidia-l4", "nvidia-tesla-a100"]
    state.region_quotas["us-west1"].update({"NVIDIA_L4_GPUS": (1.0, 0.0), "G2_CPUS": (4.0, 0.0),
                                            "NVIDIA_A100_GPUS": (1.0, 0.0), "A2_CPUS": (12.0, 0.0)})
    table = json.loads(gcp.PRICES.read_text())
    try:
        refused = cli.run("up", "--gpu", "l4", "--workers", "1", timeout=60)
        assert refused.returncode == 2 and refused.stderr.strip().splitlines()[-1] == (
            "error: quota G2_CPUS in us-west1 has 4 vCPUs free (limit 4, used 0); the cluster needs 8. Request more "
            "in the console: IAM & Admin > Quotas, filter G2_CPUS, region us-west1"), refused.stderr
        assert "apply" not in terraform_calls(cli) and state.instances == {}
        state.region_quotas["us-west1"]["G2_CPUS"] = (8.0, 0.0)

        up = cli.run("up", "--gpu", "l4", "--workers", "1", timeout=180)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "✓ quota: 1 x nvidia-l4, G2 vCPUs fit in us-west1-b's region" in up.stdout
        assert "plan: 1 x g2-standard-8 + 1 x nvidia-l4 in us-west1-b" in up.stdout
        g2 = table["families"]["rates"]["g2"]
        per_vm = 8 * g2["vcpu_hour"] + 32 * g2["memory_gib_hour"] + table["gpu_hour"]["nvidia-l4"] + 100 * 0.1 / 730
        assert f"cost: on-demand (in use): ${per_vm:.2f}/hour for 1 VM(s)" in up.stdout
        assert f"prices of {table['families']['date']}: tfcluster's table" in up.stdout
        body = state.instances["default-0"]["body"]
        assert body["machineType"].endswith("/machineTypes/g2-standard-8") and not body.get("guestAccelerators")
        assert body["disks"][0]["initializeParams"]["diskType"].endswith("/diskTypes/pd-balanced")
        assert cli.cluster()["status"] == "up"
        down = cli.run("down", timeout=120)
        assert down.returncode == 0 and state.instances == {}, down.stdout + down.stderr

        world.billing.catalog.disabled_projects.clear()  # The catalog answers: its A2 and A100 SKUs.
        (cli.state_dir / "cache" / "prices-us-west1.json").unlink()  # The refusal is remembered for an hour.
        up = cli.run("up", "--gpu", "a100", "--workers", "1", timeout=180)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "✓ quota: 1 x nvidia-tesla-a100, A2 vCPUs fit" in up.stdout
        assert "plan: 1 x a2-highgpu-1g + 1 x nvidia-tesla-a100 in us-west1-b" in up.stdout
        per_vm = 12 * 0.032 + 85 * 0.0043 + 3.00 + 100 * 0.1 / 730  # tests/world/billing.py FAMILY/GPU_PRICES.
        assert f"cost: on-demand (in use): ${per_vm:.2f}/hour" in up.stdout and "Cloud Billing Catalog" in up.stdout
        body = state.instances["default-0"]["body"]
        assert body["machineType"].endswith("/machineTypes/a2-highgpu-1g") and not body.get("guestAccelerators")
        variables = json.loads((cli.state_dir / "gcp" / "default" / "terraform.tfvars.json").read_text())
        assert (variables["gpu_type"], variables["gpu_count"], variables["machine_type"]) == (
            "nvidia-tesla-a100", 1, "a2-highgpu-1g")
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
                "scheduling": {"provisioningModel": "SPOT" if spot else "STANDARD"},
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
