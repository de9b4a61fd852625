"""`invoke check` on Google Cloud, in the test world: every ✗ and ? a real project can give, the
lines' fixes, the exit codes, and `up` stopping on a ✗ before anything is created."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import Cli
from tfcluster import config
from tfcluster.backends.gcp.access import check


def settings(**overrides) -> config.Settings:
    return config.load({"backend": "gcp", "project": "demo-project", "zone": "us-west1-b", "workers": 2,
                        "operator_cidr": "203.0.113.9/32", **overrides})


def lines(**overrides) -> dict[str, str]:
    """subject -> its line, for one run of every check."""
    return {finding.subject: finding.line() for finding in check.run(settings(**overrides)).findings}


def test_a_sandbox_project_passes_and_the_default_family_resolves_to_its_newest_image(world):
    report = check.run(settings())
    # As in most projects, the Cloud Billing API is off: live prices are a ?, naming the fix.
    [prices] = [f for f in report.findings if f.holds is not True]
    assert prices.line() == (
        "? live prices: the Cloud Billing Catalog cannot be read (the cloudbilling.googleapis.com API is not enabled "
        "in project demo-project: enable it with `gcloud services enable cloudbilling.googleapis.com --project "
        "demo-project`); estimates use tfcluster's dated table of us-central1 list prices, and a --budget holds Spot "
        "to the on-demand rate and refuses regions outside the US ones the table covers: `gcloud services enable "
        "cloudbilling.googleapis.com "
        "--project demo-project`")
    world.billing.catalog.disabled_projects.clear()
    assert lines()["live prices"].startswith("✓ live prices: the Cloud Billing Catalog answers")
    # The family's newest image that is not deprecated: v20261001 is, v20261115 replaced it.
    assert report.image == "projects/deeplearning-platform-release/global/images/common-cu129-ubuntu-2204-nvidia-580-v20261115"
    assert any(p.endswith("services:batchGet") for _, p in world.project_apis.apis.requests)


def test_an_api_off_and_a_missing_permission_name_their_fix(world):
    world.project_apis.apis.disabled.add("artifactregistry.googleapis.com")
    world.compute.state.service_disabled = True
    world.compute.state.missing_permissions |= {"iam.serviceAccounts.actAs", "compute.firewalls.create"}
    found = lines()
    assert found["APIs"] == ("✗ APIs: the APIs artifactregistry.googleapis.com, compute.googleapis.com are off in "
                             "project demo-project: run `gcloud services enable artifactregistry.googleapis.com "
                             "compute.googleapis.com --project demo-project`")
    assert found["permissions"] == (
        "✗ permissions: your account lacks compute.firewalls.create (up); iam.serviceAccounts.actAs (up) in project "
        "demo-project; ask a project owner for roles/compute.admin, roles/iam.serviceAccountUser")
    # With Compute off, what Compute answers cannot be told: ?, not a false ✗.
    assert found["quota"].startswith("? quota: cannot read it (SERVICE_DISABLED")
    assert found["boot image"].startswith("? boot image: cannot read ") and "its API is off" in found["boot image"]


def test_reads_that_are_refused_are_question_marks(world):
    world.compute.state.missing_permissions |= {"serviceusage.services.get", "orgpolicy.policies.get"}
    found = lines()
    assert found["APIs"].startswith("? APIs: cannot read them (403 IAM_PERMISSION_DENIED")
    # Org Policy v2 refused: the legacy constraints through Resource Manager v1, the managed ones ?.
    assert found["constraints/compute.requireOsLogin"] == "✓ constraints/compute.requireOsLogin: not enforced"
    assert found["managed constraints"].startswith(
        "? managed constraints: cannot read compute.managed.requireOsLogin, compute.managed.vmExternalIpAccess, "
        "compute.managed.disableGuestAttributesAccess (Org Policy v2: 403 IAM_PERMISSION_DENIED")
    world.project_apis.apis.policies["compute.requireOsLogin"] = [{"enforce": True}]
    assert lines(ssh_identity="metadata")["constraints/compute.requireOsLogin"].startswith(
        "✗ constraints/compute.requireOsLogin: enforced: the VMs take the cluster's SSH key from metadata")
    world.compute.state.missing_permissions.clear()
    world.project_apis.apis.policies.clear()
    world.project_apis.apis.disabled.add("orgpolicy.googleapis.com")
    assert lines()["managed constraints"].endswith(
        "(Org Policy v2: its API is off; Resource Manager v1 cannot express them): enable orgpolicy.googleapis.com "
        "(`gcloud services enable orgpolicy.googleapis.com`) or ask for roles/orgpolicy.policyViewer")
    world.compute.state.missing_permissions.add("orgpolicy.policy.get")
    assert lines()["organisation policies"].startswith("? organisation policies: cannot read them (Org Policy v2: "
                                                       "its API is off; Resource Manager v1: 403 IAM_PERMISSION_DENIED")
    world.project_apis.apis.disabled.add("cloudresourcemanager.googleapis.com")
    assert lines()["permissions"] == "? permissions: cannot test them (its API is off)"


@pytest.mark.parametrize("name, rules, expected", [
    ("compute.requireOsLogin", [{"enforce": True}], "enforced: the VMs take the cluster's SSH key from metadata"),
    ("compute.requireShieldedVm", [{"enforce": True}], "enforced: it requires Secure Boot"),
    ("compute.disableGuestAttributesAccess", [{"enforce": True}], "enforced: readiness and the VMs' host keys"),
    ("iam.disableServiceAccountCreation", [{"enforce": True}], "enforced: terraform creates one service account"),
    ("compute.vmExternalIpAccess", [{"denyAll": True}], "denies all: the VMs need an external IP"),
    ("compute.vmExternalIpAccess", [{"values": {"allowedValues": [
        "projects/demo-project/zones/us-west1-b/instances/default-0"]}}],
     "does not allow projects/demo-project/zones/us-west1-b/instances/default-1"),
    ("compute.trustedImageProjects", [{"values": {"allowedValues": ["projects/my-golden-images"]}}],
     "does not allow projects/deeplearning-platform-release: the boot image's project must be trusted"),
    ("gcp.resourceLocations", [{"values": {"allowedValues": ["in:europe-west4-locations"]}}], None),
    ("gcp.resourceLocations", [{"values": {"deniedValues": ["in:us-locations"]}}], "denies us-west1-b"),
    ("compute.managed.requireOsLogin", [{"enforce": True}], "enforced: the VMs take the cluster's SSH key"),
    ("compute.managed.disableGuestAttributesAccess", [{"enforce": True}], "enforced: readiness and the VMs' host"),
    ("compute.managed.vmExternalIpAccess", [{"enforce": True}], "enforced: the VMs need an external IP"),
    ("compute.managed.vmExternalIpAccess", [{"enforce": True, "parameters": {"allowedInstances": ["x"]}}], None),
])
def test_each_organisation_constraint_that_refuses_the_cluster_is_named(world, name, rules, expected):
    world.project_apis.apis.policies[name] = rules
    line = lines(ssh_identity="metadata")[f"constraints/{name}"]  # OS Login would comply (test_oslogin.py).
    if expected is None and "parameters" in rules[0]:  # A managed constraint's parameters: only Google can tell.
        assert line.startswith(f"? constraints/{name}: enforced with parameters tfcluster cannot judge")
        return
    if expected is None:  # A value group tfcluster cannot expand: only Google can tell.
        assert line == (f"? constraints/{name}: cannot tell whether in:europe-west4-locations covers us-west1-b")
        return
    assert line.startswith(f"✗ constraints/{name}: {expected}"), line
    assert line.endswith("ask your organisation's admin to exempt project demo-project")


def test_constraints_that_allow_the_cluster_hold(world):
    policies = world.project_apis.apis.policies
    policies["compute.trustedImageProjects"] = [{"values": {"allowedValues": ["projects/deeplearning-platform-release"]}}]
    policies["gcp.resourceLocations"] = [{"values": {"allowedValues": ["in:us-locations"]}}]
    policies["compute.requireOsLogin"] = [{"enforce": False}]
    policies["compute.vmExternalIpAccess"] = [{"values": {"allowedValues": [
        f"projects/demo-project/zones/us-west1-b/instances/default-{i}" for i in (0, 1)]}}]
    assert [f.subject for f in check.run(settings()).findings if f.holds is not True] == ["live prices"]


def test_boot_images_unknown_obsolete_deprecated_and_the_v100_driver(world):
    dlvm = "projects/deeplearning-platform-release/global/images"
    assert lines(boot_image=f"{dlvm}/family/no-such-family")["boot image"].startswith(
        f"✗ boot image: {dlvm}/family/no-such-family does not exist: pick one from `gcloud compute images list")
    obsolete = lines(boot_image=f"{dlvm}/common-cu124-ubuntu-2204-nvidia-550-v20250101")["boot image"]
    assert obsolete.startswith(f"✗ boot image: {dlvm}/common-cu124-ubuntu-2204-nvidia-550-v20250101 is OBSOLETE")
    deprecated = check.run(settings(boot_image=f"{dlvm}/common-cu129-ubuntu-2204-nvidia-580-v20261001"))
    assert deprecated.image == f"{dlvm}/common-cu129-ubuntu-2204-nvidia-580-v20261001"  # Still boots: a warning.
    assert deprecated.findings[-2].line().endswith(
        "warning: DEPRECATED, replaced by common-cu129-ubuntu-2204-nvidia-580-v20261115")
    # Driver branch 590 on T4 is fine; V100 (Volta) ends at 580.
    newer = f"{dlvm}/family/common-cu130-ubuntu-2204-nvidia-590"
    assert lines(boot_image=newer, gpu="t4")["boot image"].startswith("✓ boot image:")
    assert lines(boot_image=newer, gpu="v100")["boot image"] == (
        f"✗ boot image: {dlvm}/common-cu130-ubuntu-2204-nvidia-590-v20261115 has NVIDIA driver branch 590, and V100 "
        f"(Volta) needs 580 or older: use --boot-image {check.DEFAULT_FAMILY}")


def test_user_credentials_say_whose_and_an_expired_login_is_a_cross(world, tmp_path, monkeypatch):
    adc = tmp_path / "application_default_credentials.json"  # What `gcloud auth application-default login` writes.
    adc.write_text(json.dumps({"type": "authorized_user", "client_id": "764086051850-x.apps.googleusercontent.com",
                               "client_secret": "d-FL95Q19q7MQmFpd7hHD0Ty", "refresh_token": "1//user-refresh"}))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
    found = lines()
    assert found["credentials"] == "✓ credentials: operator@example.com (application default credentials)"
    assert found["permissions"].startswith("✓ permissions:")  # The user's token reaches the APIs.
    world.compute.state.revoked_refresh_tokens.add("1//user-refresh")
    found = lines()
    assert found["credentials"] == ("✗ credentials: Google refused your credentials (invalid_grant: Token has been "
                                    "expired or revoked.); run `gcloud auth application-default login` again")
    assert found["Google Cloud"].startswith("? Google Cloud: not checked without credentials")


@pytest.fixture
def check_cli(tmp_path, world):
    cli = Cli(tmp_path / "state", None)
    cli.env.update({"INVOKE_TFCLUSTER_BACKEND": "gcp", "INVOKE_TFCLUSTER_PROJECT": "demo-project",
                    "INVOKE_TFCLUSTER_ZONE": "us-west1-b", "INVOKE_TFCLUSTER_WORKERS": "2"})
    cli.enter(world)
    world.checkip.public = "203.0.113.9"
    return cli


def test_the_command_exits_2_on_a_cross_0_on_a_question_mark_and_up_stops_before_creating(check_cli, world,
                                                                                        tmp_path):
    world.billing.catalog.disabled_projects.clear()  # Live prices: the Cloud Billing API on.
    passed = check_cli.run("check", timeout=120)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert passed.stdout.splitlines()[0] == "✓ terraform: " + passed.stdout.splitlines()[0].split(": ", 1)[1]
    assert "✓ your address: 203.0.113.9/32; SSH is opened to it alone" in passed.stdout
    assert passed.stdout.rstrip().endswith("18 of 18 checks hold; `invoke up` may go ahead")

    world.project_apis.apis.disabled.add("orgpolicy.googleapis.com")
    unknown = check_cli.run("check", timeout=120)
    assert unknown.returncode == 0 and "1 could not be made (?)" in unknown.stdout

    # terraform 1.8 on PATH: the module's `>= 1.9` is refused before terraform would refuse it.
    old = tmp_path / "bin" / "terraform"
    old.parent.mkdir()
    old.write_text('#!/bin/sh\necho \'{"terraform_version":"1.8.5","platform":"linux_amd64"}\'\n')
    old.chmod(0o755)
    check_cli.env["PATH"] = f"{old.parent}:{check_cli.env['PATH']}"
    world.project_apis.apis.policies["compute.requireOsLogin"] = [{"enforce": True}]
    world.project_apis.apis.disabled.clear()
    check_cli.env["INVOKE_TFCLUSTER_SSH_IDENTITY"] = "metadata"  # Which the constraint refuses.
    failed = check_cli.run("check", timeout=120)
    assert failed.returncode == 2, failed.stdout + failed.stderr
    assert "✗ terraform: 1.8.5 is older than the module's required_version >= 1.9.0: upgrade it" in failed.stdout
    assert failed.stderr.strip().splitlines() == [
        "error: 2 of 18 checks fail (terraform, constraints/compute.requireOsLogin); fix what their ✗ lines name, "
        "then run invoke check again"]

    # `up` runs the same checks first: nothing is created, nothing is remembered.
    up = check_cli.run("up", timeout=120)
    assert up.returncode == 2 and "✗ constraints/compute.requireOsLogin: enforced" in up.stdout
    assert up.stderr.strip().splitlines() == [
        "error: 2 prerequisites fail (terraform, constraints/compute.requireOsLogin); each ✗ line above names its fix"]
    assert world.compute.state.instances == {} and check_cli.cluster() is None
    assert not (check_cli.state_dir / "gcp" / "default" / "terraform.tfvars.json").exists()


def test_no_credentials_is_a_cross_that_names_the_login(check_cli, tmp_path):
    check_cli.env.pop("GOOGLE_APPLICATION_CREDENTIALS")
    check_cli.env.update({"HOME": str(tmp_path), "CLOUDSDK_CONFIG": str(tmp_path / "gcloud")})
    result = check_cli.run("check", timeout=120)
    assert result.returncode == 2
    assert ("✗ credentials: none found: run `gcloud auth application-default login` (or set "
            "GOOGLE_APPLICATION_CREDENTIALS to a key file)") in result.stdout
    assert "Traceback" not in result.stderr


def test_the_driver_branch_must_fit_the_gpu():
    """Each GPU's bounds from tfcluster/gpus.py: Volta ends at 580; Ada and Hopper start at 525."""
    from tfcluster.backends.gcp.access import prerequisites as rules

    assert rules.driver_fits("nvidia-tesla-v100", 590) == "V100 (Volta) needs 580 or older"
    assert rules.driver_fits("nvidia-tesla-v100", 580) == ""
    assert rules.driver_fits("nvidia-l4", 470) == "L4 (Ada) needs 525 or newer"
    assert rules.driver_fits("nvidia-h100-80gb", 470) == "H100 (Hopper) needs 525 or newer"
    assert [rules.driver_fits(gpu, 590) for gpu in ("nvidia-l4", "nvidia-tesla-a100", "nvidia-h100-80gb")] == [""] * 3


# ---------------------------------------------------------------- quota where Google keeps it

GPU_FAMILY, VM_FAMILY = "GPUS-PER-GPU-FAMILY-per-project-region", "CPUS-PER-VM-FAMILY-per-project-region"


def quota_line(**overrides) -> str:
    return lines(**overrides)["quota"]


def quota_only(**overrides) -> str:
    """The quota line alone (check.quota_finding, as check.run asks it), without the other checks."""
    from tfcluster.backends.gcp.cloud.compute import gpu_type

    wanted = settings(**overrides)
    return check.quota_finding(wanted, gpu_type(wanted.gpu), [wanted.zone])[0].line()


def h100_project(world, h100: int) -> dict:
    """A project whose Cloud Quotas grant ``h100`` on-demand H100s and 416 A3 vCPUs in us-central1 (and
    512 vCPUs in all regions, without which those could not be used), as Google reports such grants:
    DimensionsInfos of the family quotas; regions.get has only the Local SSD the A3s bundle."""
    state = world.compute.state
    state.accelerators["us-central1-a"] = ["nvidia-h100-80gb"]
    state.region_quotas["us-central1"] = {"LOCAL_SSD_TOTAL_GB": (24000.0, 0.0)}  # Two a3-highgpu-8g take 12,000 GB.
    state.family_quotas = {GPU_FAMILY: [({"region": "us-central1", "gpu_family": "NVIDIA_H100"}, h100), ({}, 0)],
                           VM_FAMILY: [({"region": "us-central1", "vm_family": "A3"}, 416), ({}, 24)]}
    state.project_quotas["CPUS_ALL_REGIONS"] = (512.0, 0.0)
    return {"gpu": "h100", "gpu_count": 8, "workers": 2, "zone": "us-central1-a"}


def hold_h100s(world, count: int) -> None:
    """Another VM of the project holds ``count`` H100s in us-central1 (the world counts its usage)."""
    from tests.world import quotas as table

    body = {"machineType": f"zones/us-central1-a/machineTypes/a3-highgpu-{count}g",
            "scheduling": {"provisioningModel": "STANDARD"}}
    world.compute.state.instances["someone-elses"] = {
        "zone": "us-central1-a", "status": "RUNNING", "guest": {}, "labels": {},
        "quota_charges": table.charges(world.compute.state, "us-central1-a", body)}


def test_h100_quota_is_read_from_cloud_quotas_and_its_usage_from_monitoring(world):
    wanted = h100_project(world, 16)
    # A project that has never run an H100: Monitoring holds no family series (tests/world/facts.py,
    # USAGE_POINTS_ARE_RARE). No data is not 0: the GPU and vCPU family quotas are ?, never ✓.
    line = quota_line(**wanted)
    assert line.startswith("? quota: 2 x a3-highgpu-8g with 8 x nvidia-h100-80gb in us-central1-a: cannot tell: "), line
    assert ("quota GPUS-PER-GPU-FAMILY-per-project-region (gpu_family:NVIDIA_H100, region:us-central1) has a limit of "
            "16 GPUs and the cluster needs 16; how much is in use cannot be read (Cloud Monitoring holds no point of "
            "compute.googleapis.com/quota/gpus_per_gpu_family/usage for gpu_family:NVIDIA_H100 in us-central1 in "
            "the last 25 hours; it writes one when usage changes)") in line
    asked = [path for path, _ in world.cloudquotas.quotas.requests]
    assert asked == [f"/v1/projects/demo-project/locations/global/services/compute.googleapis.com/quotaInfos/{q}"
                     for q in (VM_FAMILY, GPU_FAMILY)]
    # Compute's own family series, on its Location resource (facts.FAMILY_USAGE_SERIES), not consumer_quota's.
    filters = [query["filter"][0] for _, query in world.monitoring.monitoring.requests]
    assert filters == [f'metric.type = "compute.googleapis.com/quota/{m}/usage" AND resource.type = '
                       '"compute.googleapis.com/Location"' for m in ("cpus_per_vm_family", "gpus_per_gpu_family")]
    # Nothing from regions.get names a metric Google does not have there.
    assert not any("H100_GPUS" == r["path"] for r in world.compute.state.requests)

    # Another VM holds 8 of the 16 H100s (the Location series, named by the dimension) and 208 vCPUs: one line
    # names every quota that falls short, each as the console filters it.
    hold_h100s(world, 8)
    line = quota_only(**wanted)
    assert line.startswith("✗ quota: quota CPUS-PER-VM-FAMILY-per-project-region (vm_family:A3, region:us-central1) "
                           "has 208 vCPUs free (limit 416, in use 208); the cluster needs 416; "), line
    assert ("; quota GPUS-PER-GPU-FAMILY-per-project-region (gpu_family:NVIDIA_H100, region:us-central1) has 8 GPUs "
            "free (limit 16, in use 8); the cluster needs 16; ") in line
    assert re.findall(r"quota ([A-Z-]+-per-project(?:-region)?)", line) == [
        VM_FAMILY, "CPUS-ALL-REGIONS-per-project", GPU_FAMILY, "GPUS-ALL-REGIONS-per-project"]
    assert line.endswith("; request more in the console (IAM & Admin > Quotas & System Limits: filter by each quota "
                         "ID and its dimensions)")
    # The other way Google's pages leave open: the series carry the family under a name that is not the
    # dimension's. They are every family's together: "up to 8 in use" cannot say short, nor ✓.
    world.monitoring.monitoring.family_label = "unnamed"
    world.compute.state.project_quotas.update({"CPUS_ALL_REGIONS": (1024.0, 0.0), "GPUS_ALL_REGIONS": (32.0, 0.0)})
    line = quota_only(**wanted)
    assert line.startswith("? quota: 2 x a3-highgpu-8g with 8 x nvidia-h100-80gb in us-central1-a: cannot tell: "), line
    assert ("quota GPUS-PER-GPU-FAMILY-per-project-region (gpu_family:NVIDIA_H100, region:us-central1) has a limit of "
            "16 GPUs, the cluster needs 16, and up to 8 are in use (Cloud Monitoring does not tell the family's "
            "share)") in line
    world.compute.state.instances.clear()

    # Usage that cannot be read is ?, naming the role; `up` stops only on ✗.
    world.monitoring.monitoring.refused = True
    report = check.run(settings(**wanted))
    [quota] = [f for f in report.findings if f.subject == "quota"]
    assert quota.holds is None and report.failed == [] and report.zones == ["us-central1-a"]
    assert ("has a limit of 16 GPUs and the cluster needs 16; how much is in use cannot be read "
            "(monitoring.googleapis.com refused it (403): ask for roles/monitoring.viewer)") in quota.detail
    # Limits that cannot be read: ?, with the API to enable.
    world.project_apis.apis.disabled.add("cloudquotas.googleapis.com")
    assert ("its limit cannot be read (cloudquotas.googleapis.com is off: `gcloud services enable "
            "cloudquotas.googleapis.com`)") in quota_only(**wanted)

    # No H100 granted: the ✗ names the quota and the family as the console filters them.
    world.project_apis.apis.disabled.clear()
    world.monitoring.monitoring.refused = False
    h100_project(world, 0)
    assert quota_only(**wanted).startswith(
        "✗ quota: quota GPUS-PER-GPU-FAMILY-per-project-region (gpu_family:NVIDIA_H100, region:us-central1) has a "
        "limit of 0 GPUs and the cluster needs 16, whatever is in use; request more")
    # A grant with room, seen in use: ✓ (either way the label is named, the series tell enough).
    h100_project(world, 32)
    world.compute.state.family_quotas[VM_FAMILY][0] = ({"region": "us-central1", "vm_family": "A3"}, 832)
    world.compute.state.project_quotas.update({"CPUS_ALL_REGIONS": (1024.0, 0.0), "GPUS_ALL_REGIONS": (32.0, 0.0)})
    hold_h100s(world, 8)
    for label in ("dimension", "unnamed"):
        world.monitoring.monitoring.family_label = label
        assert quota_only(**wanted).startswith("✓ quota: 2 x a3-highgpu-8g with 8 x nvidia-h100-80gb in "
                                               "us-central1-a: 8 quotas have room"), label
    # The same VMs, and a Monitoring that shows no family series (facts.USAGE_POINTS_ARE_RARE, "absent"): ?, not ✓.
    world.monitoring.monitoring.family_series = False
    assert quota_only(**wanted).startswith("? quota: 2 x a3-highgpu-8g with 8 x nvidia-h100-80gb in us-central1-a: "
                                           "cannot tell: ")


def test_user_credentials_read_cloud_quotas_and_monitoring_with_the_clusters_quota_project(world, tmp_path,
                                                                                           monkeypatch):
    """Cloud Quotas is client-based: user credentials without a quota project are refused (facts.QUOTA_PROJECT);
    Monitoring is run both ways (facts.QUOTA_PROJECT_APIS). The product names the cluster's project."""
    adc = tmp_path / "application_default_credentials.json"
    adc.write_text(json.dumps({"type": "authorized_user", "client_id": "764086051850-x.apps.googleusercontent.com",
                               "client_secret": "d-FL95Q19q7MQmFpd7hHD0Ty", "refresh_token": "1//user-refresh"}))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
    wanted = h100_project(world, 16)
    hold_h100s(world, 4)
    world.compute.state.project_quotas.update({"CPUS_ALL_REGIONS": (1024.0, 0.0), "GPUS_ALL_REGIONS": (32.0, 0.0)})
    world.compute.state.family_quotas[VM_FAMILY][0] = ({"region": "us-central1", "vm_family": "A3"}, 832)
    world.compute.state.family_quotas[GPU_FAMILY][0] = ({"region": "us-central1", "gpu_family": "NVIDIA_H100"}, 32)
    for required in (False, True):
        world.monitoring.monitoring.quota_project_required = required
        line = quota_only(**wanted)
        assert line.startswith("✓ quota: 2 x a3-highgpu-8g with 8 x nvidia-h100-80gb in us-central1-a: 8 quotas have "
                               "room"), line


def test_local_ssd_quota_is_preflighted(world):
    """Two a3-highgpu-8g bundle 12,000 GB of Local SSD; a common LOCAL_SSD_TOTAL_GB is 10,000 a region
    (tests/world/quotas.py): `check` says ✗ naming it, before the insert would be refused."""
    wanted = h100_project(world, 16)
    world.compute.state.region_quotas["us-central1"] = {}
    line = quota_line(**wanted)
    assert line.startswith("✗ quota: quota LOCAL-SSD-TOTAL-GB-per-project-region (region:us-central1) has 10000 GB "
                           "free (limit 10000, in use 0); the cluster needs 12000; request more"), line


def test_an_n1_t4_cluster_does_not_need_cloud_quotas_or_monitoring(world):
    """Every quota of an N1/T4 cluster is in regions.get: the family quotas' APIs being off cannot stop it;
    an H100 cluster still needs them."""
    world.project_apis.apis.disabled |= {"cloudquotas.googleapis.com", "monitoring.googleapis.com"}
    assert lines()["APIs"].startswith("✓ APIs: 5 enabled"), lines()["APIs"]
    assert lines(**h100_project(world, 16))["APIs"].startswith(
        "✗ APIs: the APIs cloudquotas.googleapis.com, monitoring.googleapis.com are off")


def test_a_new_projects_defaults_refuse_four_t4_vms_naming_every_shortfall_in_one_line(world):
    # A new project: 24 vCPUs and 8 in-use addresses per region (tests/world/quotas.py); 6 addresses are taken.
    world.compute.state.region_quotas["us-west1"]["IN_USE_ADDRESSES"] = (8.0, 6.0)
    assert quota_line(workers=4) == (
        "✗ quota: quota CPUS-per-project-region (region:us-west1) has 24 vCPUs free (limit 24, in use 0); the cluster "
        "needs 32; quota IN-USE-ADDRESSES-per-project-region (region:us-west1) has 2 addresses free (limit 8, in use "
        "6); the cluster needs 4; request more in the console (IAM & Admin > Quotas & System Limits: filter by each "
        "quota ID and its dimensions)")
    # A metric regions.get does not list is unknown, never a limit of 0.
    world.compute.state.region_quotas["us-west1"]["CPUS"] = None
    assert "quota CPUS-per-project-region (region:us-west1): its limit cannot be read (regions.get for us-west1 " \
        "does not list CPUS)" in quota_line(workers=2)


def test_the_cloud_quotas_stand_in_speaks_the_clients_types(world):
    """No discovery document exists for Cloud Quotas: the stand-in binds query parameters to the
    request message's fields and parses its own answers back into the client's types."""
    import requests
    from google.cloud import cloudquotas_v1

    from tests.world import cloudquotas

    base = "https://cloudquotas.googleapis.com/v1/projects/demo-project/locations/global/services/compute.googleapis.com"
    headers = {"Authorization": "Bearer ya29.test-world"}
    unknown = requests.get(f"{base}/quotaInfos", params={"filter": "x"}, headers=headers, timeout=10)
    assert unknown.status_code == 400 and unknown.json()["error"]["message"].startswith(
        'Invalid JSON payload received. Unknown name "filter": Cannot bind query parameter.')
    listed = requests.get(f"{base}/quotaInfos", params={"pageSize": 3}, headers=headers, timeout=10).json()
    assert len(listed["quotaInfos"]) == 3 and listed["nextPageToken"]
    assert requests.get(f"{base}/quotaInfos/NO-SUCH-per-project", headers=headers, timeout=10).status_code == 404
    assert requests.get(f"{base}/quotaInfos", timeout=10).status_code == 401
    with pytest.raises(Exception, match="quotaValue"):  # A field Google's type does not have.
        cloudquotas.checked({"quotaId": "CPUS-per-project-region", "dimensionsInfos": [{"details": {"quotaValue": 5}}]},
                            cloudquotas_v1.QuotaInfo)


def test_the_monitoring_stand_in_checks_requests_and_answers_against_monitoring_v3(world):
    import requests

    from tests.world import discovery, monitoring

    url = "https://monitoring.googleapis.com/v3/projects/demo-project/timeSeries"
    headers = {"Authorization": "Bearer ya29.test-world"}
    good = {"filter": f'metric.type = "{monitoring.USAGE}"', "interval.endTime": "2026-11-26T10:00:00Z"}
    assert requests.get(url, params=good, headers=headers, timeout=10).json() == {}
    for params, words in [({**good, "view": "PARTIAL"}, "Invalid value at 'view'"),
                          ({**good, "interval.end": "x"}, 'Unknown name "interval.end": Cannot bind query parameter'),
                          ({**good, "filter": "metric.type = "}, "Field filter had an invalid value"),
                          ({"filter": good["filter"]}, "Field interval.endTime had an invalid value")]:
        refused = requests.get(url, params=params, headers=headers, timeout=10)
        assert refused.status_code == 400 and words in refused.json()["error"]["message"], refused.text
    discovery.take_violations()  # The refused requests above were planted.
    call, _ = discovery.check("monitoring.v3", "GET", "/v3/projects/demo-project/timeSeries", good, None)
    [invented] = call.api.check_response(call, 200, {"timeSeries": [{"quotaMetric": "x"}]})
    [bad_enum] = call.api.check_response(call, 200, {"timeSeries": [{"metricKind": "SOMETIMES"}]})
    assert "timeSeries[0].quotaMetric" in invented and "SOMETIMES" in bad_enum
    discovery.take_violations()


def test_an_unreachable_or_garbled_api_is_a_question_mark_never_a_traceback(world):
    world.project_apis.close()  # Service Usage, Resource Manager and Org Policy stop answering.
    found = lines()
    assert found["APIs"].startswith("? APIs: cannot read them (cannot reach serviceusage.googleapis.com: ")
    assert found["permissions"].startswith("? permissions: cannot test them (cannot reach cloudresourcemanager")
    assert found["quota"].startswith("✓ quota:")  # Compute still answers.


def test_up_stops_before_terraform_when_the_boot_image_is_a_question_mark(world, tmp_path):
    """terraform refuses `"image": null`: an image that could not be resolved stops `up` first, unless
    a resumed `up` keeps the image its VMs booted."""
    from tfcluster.backends.base import Finding

    class Workdir:
        workdir = tmp_path

        @staticmethod
        def variables():
            return json.loads((tmp_path / "terraform.tfvars.json").read_text())

    unknown = Finding("boot image", None, "cannot read projects/p/global/images/family/f (its API is off)")
    report = check.Report([Finding("quota", True, "fits"), unknown], None, ["us-west1-b"])
    [stop] = check.blocking(report, Workdir)
    assert stop.line() == ("✗ boot image: `up` needs the exact boot image and could not resolve it (cannot read "
                           "projects/p/global/images/family/f (its API is off)); fix that, or pass --boot-image "
                           "projects/P/global/images/NAME")
    (tmp_path / "terraform.tfvars.json").write_text(json.dumps({"image": "projects/p/global/images/i-1"}))
    assert check.blocking(report, Workdir) == []
