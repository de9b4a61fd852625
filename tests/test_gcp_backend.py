"""The gcp backend against a fake `terraform` and a fake Compute API (REST shapes), with the
VMs played by real sshd hosts in network namespaces (the SSH half is the real ssh backend)."""

from __future__ import annotations

import json
import re
import subprocess
import stat
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import Cli, assert_stopped_by, run_on_terminal, stop_while_attached, wait_for
from tests.fake_operations import advance
from tests.fake_compute import stop_instance
from tests.hostlab import SUBNET, HostLab, available
from tests.world.compute_resources import gpu_quota_exceeded
from tests.world.machines import LabMachines
from tests.world.compute_auth import account_of
from tests.world.iam_api import create_account
from tests.world.names import token_for
from tests.world.provider import mirror
from tfcluster.backends import gcp
from tfcluster.errors import ConfigError, HostErrors
from tfcluster.money import usd


@pytest.fixture
def fake_compute(world):
    """The Compute stand-in behind compute.googleapis.com in the test world."""
    return world.compute


def api_for(server) -> gcp.ComputeApi:
    """The real client with the operator's (throwaway) key, reaching compute.googleapis.com."""
    return gcp.ComputeApi(server.state.project)


# ---------------------------------------------------------------- units against the fake API


def test_preflight_names_the_zone_and_the_quota_fix(fake_compute):
    api = api_for(fake_compute)
    gcp.preflight_quota(api, "us-west1-b", "nvidia-tesla-t4", 1, 3, spot=False)  # Fits.
    fake_compute.state.accelerators["us-west1-b"] = ["nvidia-tesla-v100"]
    with pytest.raises(ConfigError, match=r"zone us-west1-b does not offer nvidia-tesla-t4 \(it has: "
                                          r"nvidia-tesla-v100\); pick a zone from `invoke offers --gpu t4`"):
        gcp.preflight_quota(api, "us-west1-b", "nvidia-tesla-t4", 1, 3, spot=False)
    fake_compute.state.accelerators["us-west1-b"] = ["nvidia-tesla-t4"]
    fake_compute.state.region_quotas["us-west1"]["NVIDIA_T4_GPUS"] = (4.0, 2.0)
    with pytest.raises(ConfigError, match=r"quota NVIDIA-T4-GPUS-per-project-region \(region:us-west1\) has 2 GPUs "
                                          r"free \(limit 4, in use 2\); the cluster needs 3; request more"):
        gcp.preflight_quota(api, "us-west1-b", "nvidia-tesla-t4", 1, 3, spot=False)
    fake_compute.state.region_quotas["us-west1"]["NVIDIA_T4_GPUS"] = (8.0, 0.0)
    fake_compute.state.project_quotas["GPUS_ALL_REGIONS"] = (2.0, 0.0)
    with pytest.raises(ConfigError, match="quota GPUS-ALL-REGIONS-per-project has 2 GPUs free"):
        gcp.preflight_quota(api, "us-west1-b", "nvidia-tesla-t4", 1, 3, spot=False)
    fake_compute.state.project_quotas["GPUS_ALL_REGIONS"] = (16.0, 0.0)
    # No PREEMPTIBLE_* quota granted: Spot VMs draw from the standard one.
    gcp.preflight_quota(api, "us-west1-b", "nvidia-tesla-t4", 1, 3, spot=True)
    fake_compute.state.region_quotas["us-west1"]["PREEMPTIBLE_NVIDIA_T4_GPUS"] = (2.0, 0.0)
    with pytest.raises(ConfigError, match=r"quota PREEMPTIBLE-NVIDIA-T4-GPUS-per-project-region \(region:us-west1\) has 2 GPUs free"):
        gcp.preflight_quota(api, "us-west1-b", "nvidia-tesla-t4", 1, 3, spot=True)
    # On-demand GPU VMs the hypervisor deletes within 7 days may use the preemptible quota too.
    fake_compute.state.region_quotas["us-west1"]["NVIDIA_T4_GPUS"] = (1.0, 0.0)
    fake_compute.state.region_quotas["us-west1"]["PREEMPTIBLE_NVIDIA_T4_GPUS"] = (4.0, 0.0)
    gcp.preflight_quota(api, "us-west1-b", "nvidia-tesla-t4", 1, 3, spot=False, deleted_within_hours=168)
    for hours in (None, 169):  # STOP, or a deadline past 7 days: the standard quota alone.
        with pytest.raises(ConfigError, match=r"quota NVIDIA-T4-GPUS-per-project-region \(region:us-west1\) has 1 GPUs free"):
            gcp.preflight_quota(api, "us-west1-b", "nvidia-tesla-t4", 1, 3, spot=False, deleted_within_hours=hours)
    with pytest.raises(ConfigError, match=r"quota PREEMPTIBLE-NVIDIA-T4-GPUS-per-project-region \(region:us-west1\) has 4 GPUs free"):
        gcp.preflight_quota(api, "us-west1-b", "nvidia-tesla-t4", 1, 5, spot=False, deleted_within_hours=12)
    fake_compute.state.region_quotas["us-west1"]["NVIDIA_T4_GPUS"] = (8.0, 0.0)
    # Rate limited twice, as 403 rateLimitExceeded and as 429: retried with backoff, then it answers.
    for status in (403, 429):
        fake_compute.state.rate_limited_calls, fake_compute.state.rate_limit_status = 2, status
        gcp.preflight_quota(api, "us-west1-b", "nvidia-tesla-t4", 1, 1, spot=False)
        assert fake_compute.state.rate_limited_calls == 0
    # acceleratorTypes.maximumCardsPerInstance bounds the GPUs of one VM (4 in this zone).
    with pytest.raises(ConfigError, match=r"gpu_count must be at most 4 for nvidia-tesla-t4 in us-west1-b"):
        gcp.preflight_quota(api, "us-west1-b", "nvidia-tesla-t4", 8, 1, spot=False)


def _boot(server, name: str, **guest) -> None:
    server.state.instances[name] = {"zone": "us-west1-b", "labels": {}, "status": "RUNNING",
                                    "guest": {f"tfcluster/{k}" if "/" not in k else k: v for k, v in guest.items()}}


def test_readiness_ready_error_and_timeout(fake_compute):
    api = api_for(fake_compute)
    _boot(fake_compute, "c-0", ready="n2:ok")
    _boot(fake_compute, "c-1", ready="n2:ok")
    seen = []
    gcp.wait_ready(api, "us-west1-b", ["c-0", "c-1"], timeout=5, on_progress=seen.append, poll_seconds=0.05,
                   nonce="n2")
    assert seen[-1] == {"c-0": "ok", "c-1": "ok"}

    _boot(fake_compute, "c-1", ready="n2:error: pip install tensorflow[and-cuda]==2.21.0 failed")
    with pytest.raises(HostErrors) as error:
        gcp.wait_ready(api, "us-west1-b", ["c-0", "c-1"], timeout=5, poll_seconds=0.05, nonce="n2")
    assert error.value.failures == {"c-1": "error: pip install tensorflow[and-cuda]==2.21.0 failed"}

    # An "ok" from the boot before a stop survives in the guest attributes: it is not this boot's.
    for stale in ("n1:ok", "ok", None):
        _boot(fake_compute, "c-1", **({"ready": stale} if stale else {}))
        with pytest.raises(HostErrors) as error:
            gcp.wait_ready(api, "us-west1-b", ["c-0", "c-1"], timeout=0.3, poll_seconds=0.05, nonce="n2")
        assert list(error.value.failures) == ["c-1"]
        assert "not ready after 0s (last: booting)" in error.value.failures["c-1"]
    assert "get-serial-port-output c-1 --zone us-west1-b" in error.value.failures["c-1"]


def test_host_key_comes_from_guest_attributes(fake_compute):
    api = api_for(fake_compute)
    _boot(fake_compute, "c-0", **{"hostkeys/ssh-rsa": "AAAArsa", "hostkeys/ssh-ed25519": "AAAAed"})
    assert gcp.pinned_host_key(api, "us-west1-b", "c-0") == "ssh-ed25519 AAAAed"
    _boot(fake_compute, "c-1", ready=":ok")
    with pytest.raises(Exception, match="c-1 published no SSH host key"):
        gcp.pinned_host_key(api, "us-west1-b", "c-1")


def test_outputs_parse_and_cost_estimate():
    raw = {"instances": {"sensitive": False, "type": "tuple", "value": [
        {"name": "d-0", "zone": "projects/p/zones/us-west1-b", "internal_ip": "10.128.0.2", "external_ip": "34.1.2.3"}]},
        "bucket": {"value": "p-d-a1b2c3"}, "service_accounts": {"value": ["d-vm-0@p.iam.gserviceaccount.com"]},
        "labels": {"value": {"tfcluster-cluster": "d"}}}
    outputs = gcp.TerraformOutputs.parse(raw)
    assert outputs.instances == [gcp.GcpInstance("d-0", "us-west1-b", "10.128.0.2", "34.1.2.3")]
    assert outputs.bucket == "p-d-a1b2c3"
    assert outputs.service_accounts == ["d-vm-0@p.iam.gserviceaccount.com"]
    cost = gcp.hourly_cost("n1-standard-8", "nvidia-tesla-t4", 1, 100, 3, spot=False)
    prices = json.loads(gcp.PRICES.read_text())
    vm = 8 * prices["n1_vcpu_hour"] + 30 * prices["n1_memory_gib_hour"]
    assert cost["per_vm"] == pytest.approx(vm + 0.35 + 100 * 0.10 / 730 + prices["external_ip_hour"]["standard"])
    assert cost["total"] == pytest.approx(3 * cost["per_vm"])
    assert prices["date"] and "cloud.google.com" in prices["source"]
    assert gcp.hourly_cost("n1-standard-8", "nvidia-tesla-t4", 1, 100, 1, spot=True)["gpu"] < 0.35


# ---------------------------------------------------------------- the CLI end to end

needs_hosts = pytest.mark.skipif(available() is not None, reason=f"test hosts: {available()}")
# Seconds IAM takes to see a new service account in test_up_status_down's world.
IAM_DELAY = 3.0


def bucket_of(emulator: str, name: str):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(project="demo-project", credentials=AnonymousCredentials(),
                          client_options={"api_endpoint": emulator}).bucket(name)


@pytest.fixture
def gcp_cli(tmp_path, world, fake_compute, synthetic_data):
    lab = HostLab(tmp_path / "lab", 2, tag="tg", listen_all=True, vm_login=True)
    cli = make_gcp_cli(tmp_path, world, lab, synthetic_data)
    yield cli
    if cli.cluster() is not None:
        cli.run("down", timeout=120)
    lab.teardown()


def make_gcp_cli(tmp_path, world, lab: HostLab, synthetic_data) -> Cli:
    """The CLI in the test world with the real terraform, whose providers (tests/world/provider)
    call the world's Compute; ``lab``'s hosts play the VMs that instances.insert creates."""
    # The product's own login, venv and remote folder: the lab's hosts are what startup.sh makes.
    assert lab.vm_login, "the gcp world's VMs are HostLab(..., vm_login=True)"
    fake_compute = world.compute
    cli = Cli(tmp_path / "state", synthetic_data)
    cli.lab = lab
    cli.compute = fake_compute
    cli.machines = LabMachines(lab)
    fake_compute.state.on_insert = cli.machines
    # The product looks up the operator's address itself; the world answers what the VMs see.
    world.checkip.public = f"{SUBNET}.1"
    cli.env.update(mirror.build(tmp_path / "providers"))
    cli.env.update({
        "INVOKE_TFCLUSTER_BACKEND": "gcp",
        "INVOKE_TFCLUSTER_PROJECT": fake_compute.state.project,
        "INVOKE_TFCLUSTER_ZONE": "us-west1-b",
        "INVOKE_TFCLUSTER_WORKERS": str(len(lab.hosts)),
        "INVOKE_TFCLUSTER_READY_TIMEOUT_SECONDS": "20",
    })
    cli.enter(world)
    cli.storage = world.storage_url
    return cli


def terraform_log(cli, cluster: str = "default") -> list[list[str]]:
    """Every terraform command the product ran, as argument lists after the binary and -chdir
    (the product logs each one in the cluster's terraform.log)."""
    log = cli.state_dir / "gcp" / cluster / "terraform.log"
    if not log.exists():
        return []
    return [line[2:].split()[2:] for line in log.read_text().splitlines() if line.startswith("$ ")]


def vm_deletes(cli, name: str, by: str) -> tuple[int, str]:
    """instances.delete of ``name`` as the watchdog on VM ``by`` makes it (startup/tfcluster_watchdog/gce.py):
    with the token of ``by``'s own service account, as its metadata server hands it. The status
    and Google's message (empty for a success), so a refusal shows in Google's words."""
    import ssl
    import urllib.error
    import urllib.request

    url = f"https://compute.googleapis.com/compute/v1/projects/demo-project/zones/us-west1-b/instances/{name}"
    token = token_for(account_of(cli.compute.state.instances[by]))
    request = urllib.request.Request(url, method="DELETE", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10, context=ssl.create_default_context(
                cafile=cli.env["REQUESTS_CA_BUNDLE"])) as response:
            return response.status, ""
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())["error"]["message"]


def terraform_calls(cli, cluster: str = "default") -> list[str]:
    return [call[0] for call in terraform_log(cli, cluster)]


@needs_hosts
def test_up_status_down(gcp_cli, world):
    """The whole gcp flow on a cluster whose name has a hyphen (every name terraform/ derives from
    it: instances, accounts, the custom role's id, bucket, registry, tag), in a world where IAM
    sees a new service account only seconds after its creation, as Google's can."""
    gcp_cli.env["INVOKE_TFCLUSTER_BUCKET_LOCATION"] = "US"  # A multi-region, not the VMs' region.
    gcp_cli.env["INVOKE_TFCLUSTER_CLUSTER"] = "my-run"
    world.compute.state.iam_delay_seconds = IAM_DELAY
    # On a terminal, `up` shows the plan and what it costs an hour and asks; "n" creates nothing.
    code, screen = run_on_terminal(gcp_cli.argv("up"), gcp_cli.env,
                                   lambda shown: b"n\n" if b"while they run?" in shown and b"): n" not in shown else None,
                                   180)
    assert code == 2 and re.search(r"Create 2 VM\(s\) in us-west1-b, about \$\d+\.\d\d an hour while they run\? "
                                   r"\[y/n\] \(n\): n", screen), screen[-3000:]
    assert "error: up cancelled: nothing was created" in screen and "/hour" in screen, screen[-3000:]
    assert "apply" not in terraform_calls(gcp_cli, "my-run") and gcp_cli.cluster("my-run") is None
    assert not gcp_cli.compute.state.instances
    # Without a terminal nothing is asked.
    up = gcp_cli.run("up", timeout=180)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "while they run?" not in up.stdout
    # The provider waited for each new account (three reads in a row that find it, as hashicorp/google
    # does) before the instance that runs as it: Compute refuses an account it does not see yet.
    log = world.compute.state.requests
    for index in range(2):
        email = f"my-run-vm-{index}@demo-project.iam.gserviceaccount.com"
        made = next(r["at"] for r in log if r["method"] == "POST" and r["path"].endswith("/serviceAccounts")
                    and (r["body"] or {}).get("accountId") == f"my-run-vm-{index}")
        inserted = next(r["at"] for r in log if r["method"] == "POST" and r["path"].endswith("/instances")
                        and (r["body"] or {}).get("name") == f"my-run-{index}")
        assert inserted - made >= IAM_DELAY, (index, inserted - made)
        assert sum(r["method"] == "GET" and r["path"].endswith(f"/serviceAccounts/{email}") for r in log) >= 3
    assert "plan: 2 x n1-standard-8 + 1 x nvidia-tesla-t4 in us-west1-b" in up.stdout
    # N1 has no compact placement (tfcluster/backends/gcp/zones/placement.py): none, and the plan says so in one line.
    assert "placement: none: N1 (T4, V100) does not support compact placement policies, so the VMs land anywhere " \
        "in the zone" in up.stdout and not world.compute.state.resources.get("resourcePolicies")
    assert "/hour" in up.stdout and "prices of 2026-10-15" in up.stdout
    assert "safety: idle watchdog stops a VM after 30 idle minutes" in up.stdout
    assert "hypervisor deadline STOP after 12 h" in up.stdout
    assert "bucket: objects are kept until you delete them (bucket_retention_days: 0); an object's old versions " \
        "are deleted a day after it is replaced" in up.stdout
    assert terraform_calls(gcp_cli, "my-run") == ["init", "apply", "output"]
    variables = json.loads((gcp_cli.state_dir / "gcp" / "my-run" / "terraform.tfvars.json").read_text())
    assert variables["operator_cidr"] == f"{SUBNET}.1/32" and variables["workers"] == 2
    assert variables["ssh_public_key"].startswith("ssh-ed25519 ")
    # What `invoke check` resolved, pinned for every VM of the cluster.
    assert variables["image"] == ("projects/deeplearning-platform-release/global/images/"
                                  "common-cu129-ubuntu-2204-nvidia-580-v20261115")
    assert variables["bucket_location"] == "US"

    state = gcp_cli.cluster("my-run")
    # random_id.suffix: three random bytes in hex.
    assert state["status"] == "up" and re.fullmatch(r"demo-project-my-run-[0-9a-f]{6}", state["bucket"])
    bucket_name = state["bucket"]
    bucket = bucket_of(gcp_cli.storage, bucket_name)
    bucket.reload()
    assert bucket.location == "US"
    # Both of iam.tf's grants on the bucket hold: terraform applies them at once, and each is a
    # read-modify-write of the one policy (a lost one is a VM that cannot write its checkpoints).
    # Each VM runs as its own service account, and each account holds both.
    members = [f"serviceAccount:{account_of(world.compute.state.instances[f'my-run-{i}'])}" for i in range(2)]
    assert members == [f"serviceAccount:my-run-vm-{i}@demo-project.iam.gserviceaccount.com" for i in range(2)]
    policy = world.storage_proxy.policies[bucket_name]
    for member in members:
        assert sorted(b["role"] for b in policy if member in b["members"]) == [
            "roles/storage.legacyBucketReader", "roles/storage.objectAdmin"]
    # And the VMs may pull from the cluster's registry, by a binding on that repository alone.
    registry_policy = world.artifacts.state.policies["projects/demo-project/locations/us-west1/repositories/my-run-images"]
    for member in members:
        assert [b["role"] for b in registry_policy if member in b["members"]] == ["roles/artifactregistry.reader"]
    assert [h["host_key"] for h in state["hosts"]] == [h.host_key_public for h in gcp_cli.lab.hosts]
    assert [h["instance"] for h in state["hosts"]] == ["my-run-0", "my-run-1"]
    # The watchdog's role: its id has no hyphen (custom role ids are [a-zA-Z0-9_.]), and each VM's
    # account holds it on its own instance.
    [role] = [name for name in world.compute.state.custom_roles if "tfclusterWatchdog_my_run_" in name]
    for index in range(2):
        bindings = world.compute.state.instances[f"my-run-{index}"]["iam_bindings"]
        assert bindings == [{"role": role, "members": [members[index]]}]
    key = Path(state["ssh_key"])
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and key.read_text().startswith("-----BEGIN OPENSSH")

    status = gcp_cli.run("status")
    assert status.returncode == 0, status.stderr
    assert "my-run-0" in status.stdout and "RUNNING" in status.stdout and "$" in status.stdout
    # Every cluster at once, with what it costs now: both VMs run, at the rate `status` quotes.
    rate = float(re.search(r"\(in use\): \$([0-9.]+)/hour", status.stdout).group(1))
    every = gcp_cli.run("status", "--all")
    row = next((line for line in every.stdout.splitlines() if "│ my-run " in line), "")
    assert every.returncode == 0 and re.search(rf"│ my-run +│ gcp +│ 2 +│ up +│ - +│ \${rate:.2f}/h \(2 of 2 VMs running\) +│", row), \
        every.stdout + every.stderr

    # A run on the VMs: code goes over SSH with the pinned keys; outputs are addressed to the bucket.
    script = gcp_cli.state_dir.parent / "report.py"
    script.write_text("import json, os\nprint('REPORT', os.environ['TFCLUSTER_WORKER_INDEX'], "
                      "os.environ['AIP_MODEL_DIR'], json.loads(os.environ['TF_CONFIG'])['task']['type'])\n")
    train = gcp_cli.run("train", "--script", str(script), timeout=120)
    assert train.returncode == 0, train.stdout + train.stderr
    run_dir = gcp_cli.runs("my-run")[-1]
    run = json.loads((run_dir / "run.json").read_text())
    model_url = f"gs://{bucket_name}/runs/{run['run_id']}/model"
    assert f"REPORT 0 {model_url} chief" in train.stdout and f"REPORT 1 {model_url} worker" in train.stdout
    assert (run_dir / "worker-1.log").exists()  # Logs come back over SSH.

    # An image on VMs made without Docker: the fix is a new cluster, and the line says so.
    image = "us-west1-docker.pkg.dev/demo-project/my-run-images/trainer:1"
    no_docker = gcp_cli.run("up", "--image", image, timeout=120)
    assert no_docker.returncode == 2 and no_docker.stderr.strip().splitlines() == [
        f"error: cluster my-run was created without Docker; run invoke down, then invoke up --image {image} "
        "(the bucket and registry are kept)"], no_docker.stdout + no_docker.stderr

    # `down` from another shell while `train --retries 2` is attached, mid-run: the launcher does not
    # restart the run on VMs being destroyed; it exits 1 naming `invoke down`, before down's ✓.
    ticker = gcp_cli.state_dir.parent / "ticker.py"
    ticker.write_text("import time, tfcluster\nfor step in range(1, 10000):\n    tfcluster.progress(step)\n"
                      "    time.sleep(0.5)\n")
    launcher = gcp_cli.popen("train", "--retries", "2", "--script", str(ticker))
    try:
        wait_for(lambda: all(any("ticker.py" in _cmdline(pid) for pid in host.pids()) for host in gcp_cli.lab.hosts),
                 120, what="the run's workers on both VMs")
        said, output, exited, stopper = stop_while_attached(gcp_cli, launcher, "down")
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(timeout=10)
    run_dir = gcp_cli.runs("my-run")[-1]
    run = json.loads((run_dir / "run.json").read_text())
    assert launcher.returncode == 1, output[-4000:]
    assert_stopped_by(output, run["run_id"], "down", stopper)
    assert run["outcome"] == "stopped" and run["attempts"] == 1, run
    assert exited, f"down printed its ✓ before the launcher exited:\n{said}"
    assert not any("ticker.py" in _cmdline(pid) for host in gcp_cli.lab.hosts for pid in host.pids())
    assert "verified through the Compute API (label tfcluster-cluster=my-run and network my-run-net): " \
        "nothing left that bills by the hour" in said
    assert terraform_calls(gcp_cli, "my-run")[-1] == "destroy"
    assert not bucket_of(gcp_cli.storage, bucket_name).exists()  # It was empty.
    assert gcp_cli.compute.state.instances == {}
    assert gcp_cli.cluster("my-run") is None
    assert not [email for email in world.compute.state.service_accounts if email.startswith("my-run-")]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@needs_hosts
def test_down_reports_an_instance_that_survived_destroy(gcp_cli):
    assert gcp_cli.run("up", timeout=180).returncode == 0
    # Someone took the VM, the service account, the custom role and the (empty) bucket out of the state
    # (`terraform state rm`): destroy leaves them, and `down` finds each by its own API and removes it, the
    # bucket too though the cluster's record names it (an empty bucket is never kept: tfcluster issue 46).
    workdir = gcp_cli.state_dir / "gcp" / "default"
    bucket = gcp_cli.cluster()["bucket"]
    for address in ("google_compute_instance_iam_member.watchdog[1]", "google_compute_instance.worker[1]",
                    "google_service_account.vm[1]", "google_project_iam_custom_role.watchdog[0]",
                    "google_storage_bucket_iam_member.vm_objects", "google_storage_bucket_iam_member.vm_bucket_reader",
                    "google_storage_bucket.cluster"):
        forgot = subprocess.run([mirror.TERRAFORM, f"-chdir={workdir}", "state", "rm", address], env=gcp_cli.env,
                                capture_output=True, text=True)
        assert forgot.returncode == 0, forgot.stderr
    state = gcp_cli.compute.state
    [role] = [name for name in state.custom_roles if "/roles/tfclusterWatchdog_default_" in name]
    # The project's own 25 service accounts list before the cluster's: VM 1's account is on
    # IAM's second page (20 to a page), which `down` must read too.
    for index in range(25):
        create_account(state, "demo-project", f"app-{index:02d}", {})
        state.account_visible_at.pop(f"app-{index:02d}@demo-project.iam.gserviceaccount.com")  # Long made.
    down = gcp_cli.run("down", timeout=120)
    # As what a killed `terraform apply` made but never recorded (tfcluster issue 46): found by the cluster's
    # label and names, VM 1's own account by listing (VM 0's went with the destroy), and removed: what
    # stands on the network (and bills by the hour) before the destroy deletes the network, the rest after.
    assert down.returncode == 0, down.stdout + down.stderr
    said = " ".join(down.stdout.split())
    assert ("! destroying the firewall rules, network and service account, and the empty bucket and registry ! removing "
            "2 resource(s) of 'default' that a killed terraform made but never recorded: instance default-1, disk "
            "default-1 ! removing 3 resource(s) of 'default' that a killed terraform made but never recorded: service "
            f"account default-vm-1@demo-project.iam.gserviceaccount.com, custom role {role}, bucket {bucket}" in said), \
        down.stdout
    with urllib.request.urlopen(f"{gcp_cli.storage}/storage/v1/b?project=demo-project", timeout=30) as answer:
        assert bucket not in [item["name"] for item in json.load(answer).get("items", [])]
    assert "default-1" not in state.instances and not state.others["disks"] and role in state.deleted_roles
    assert "default-vm-1@demo-project.iam.gserviceaccount.com" not in state.service_accounts
    assert gcp_cli.cluster() is None
    assert "verified through IAM: no service account of the cluster's VMs (default-vm-N@demo-project." \
        "iam.gserviceaccount.com) and no watchdog role is left" in " ".join(down.stdout.split())


@needs_hosts
def test_preflight_failure_creates_nothing(gcp_cli):
    gcp_cli.compute.state.region_quotas["us-west1"]["NVIDIA_T4_GPUS"] = (1.0, 0.0)
    up = gcp_cli.run("up", timeout=60)
    assert up.returncode == 2
    assert up.stderr.strip().splitlines()[-1].startswith(
        "error: quota NVIDIA-T4-GPUS-per-project-region (region:us-west1) has 1 GPUs free")
    assert "apply" not in terraform_calls(gcp_cli)
    assert gcp_cli.cluster() is None and gcp_cli.compute.state.instances == {}


@needs_hosts
def test_failed_apply_is_resumed_or_torn_down(gcp_cli):
    gcp_cli.compute.state.insert_errors.append(gpu_quota_exceeded("NVIDIA_T4_GPUS", "us-west1"))
    first = gcp_cli.run("up", timeout=60)
    assert first.returncode == 2
    # Google's error inside terraform's output becomes the fix, not a raw provider line.
    assert "error: terraform apply: quota NVIDIA_T4_GPUS is exhausted in project demo-project; request " \
        "more in the console" in first.stderr
    assert "Traceback" not in first.stderr
    assert gcp_cli.cluster()["status"] == "provisioning"  # Remembered, not forgotten while billing.
    tfvars = gcp_cli.state_dir / "gcp" / "default" / "terraform.tfvars.json"
    nonce = json.loads(tfvars.read_text())["boot_nonce"]
    # As if a kill had cut the apply between the role's create and its recording (tfcluster issue 46): the
    # resumed `up` deletes the unrecorded role, and terraform makes it again under the same id, which IAM
    # keeps reserved after a delete: the provider undeletes it (resource_google_project_iam_custom_role.go).
    workdir, state = gcp_cli.state_dir / "gcp" / "default", gcp_cli.compute.state
    [role] = [name for name in state.custom_roles if "/roles/tfclusterWatchdog_default_" in name]
    forgot = subprocess.run([mirror.TERRAFORM, f"-chdir={workdir}", "state", "rm",
                             "google_project_iam_custom_role.watchdog[0]"], env=gcp_cli.env, capture_output=True, text=True)
    assert forgot.returncode == 0, forgot.stderr
    second = gcp_cli.run("up", timeout=180)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "Resuming the unfinished `up`" in second.stdout
    assert (f"removing 1 resource(s) of 'default' that a killed terraform made but never recorded: custom role {role}"
            in " ".join(second.stdout.split())), second.stdout
    assert role in state.custom_roles and role not in state.deleted_roles and state.custom_roles[role]
    assert gcp_cli.cluster()["status"] == "up"
    # VMs the failed apply made booted with the first nonce; the resumed one waits for that one.
    assert json.loads(tfvars.read_text())["boot_nonce"] == nonce


@needs_hosts
def test_vm_error_and_wrong_host_key_name_the_vm(gcp_cli):
    gcp_cli.machines.ready["default-1"] = "error: nvidia-smi finds no GPU after 15 minutes"
    up = gcp_cli.run("up", timeout=60)
    assert up.returncode == 2
    assert "VM start-up failed on 1 host(s): default-1: error: nvidia-smi finds no GPU" in up.stderr
    down = gcp_cli.run("down", timeout=60)  # The half-made cluster is torn down.
    assert down.returncode == 0, down.stderr
    assert gcp_cli.compute.state.instances == {}

    # The guest agent publishes a key the VM's sshd does not have: refused, never trusted.
    gcp_cli.machines.ready.clear()
    gcp_cli.machines.published_keys["default-1"] = gcp_cli.lab.hosts[0].host_key_public
    up = gcp_cli.run("up", timeout=120)
    assert up.returncode == 2
    assert f"worker-1 ({SUBNET}.11): host key CHANGED" in up.stderr


def test_the_operator_address_is_looked_up_around_a_proxy(world, monkeypatch):
    from tfcluster.backends.gcp.backend import detect_operator_cidr

    world.checkip.public = "203.0.113.7"
    # A proxy for everything else: the lookup must not go through it (it would answer the proxy's
    # address), and this one refuses every connection.
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert detect_operator_cidr() == "203.0.113.7/32"
    # The first service down: the next one answers.
    world.checkip.down.add("checkip.amazonaws.com")
    assert detect_operator_cidr() == "203.0.113.7/32"
    assert world.checkip.asked[-2:] == ["checkip.amazonaws.com", "api.ipify.org"]


def test_missing_terraform_and_credentials(tmp_path, synthetic_data, fake_compute):
    cli = Cli(tmp_path / "state", synthetic_data)
    cli.env.update({"INVOKE_TFCLUSTER_BACKEND": "gcp", "INVOKE_TFCLUSTER_PROJECT": "demo-project",
                    "INVOKE_TFCLUSTER_ZONE": "us-west1-b", "TFCLUSTER_TERRAFORM": str(tmp_path / "none")})
    missing = cli.run("up")
    assert missing.returncode == 2
    assert "error: terraform is not installed; install Terraform >= 1.9, the module's required_version" in missing.stderr

    wrapper = tmp_path / "terraform"
    wrapper.write_text("#!/bin/sh\nexit 0\n")
    wrapper.chmod(0o755)
    cli.env.update({"TFCLUSTER_TERRAFORM": str(wrapper), "HOME": str(tmp_path), "CLOUDSDK_CONFIG": str(tmp_path),
                    "NO_GCE_CHECK": "True"})
    cli.env.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
    no_credentials = cli.run("up", timeout=60)
    assert no_credentials.returncode == 2
    assert "error: no Google Cloud credentials; run `gcloud auth application-default login`" in no_credentials.stderr

    cli.env["INVOKE_TFCLUSTER_GPU"] = "a200"
    bad_gpu = cli.run("up")
    assert "gpu must be one of t4, v100, l4, a100, a100-80gb, h100 (got 'a200')" in bad_gpu.stderr


# 300 steps of 20 ms reported with their total; the chief backs up every 5 steps, says so as the
# trainer's --backup-every-steps does (a "backup" event), and would resume from it.
BUDGET_SCRIPT = """
import json, os, time
from pathlib import Path
backup = Path("budget-backup.json").resolve()
chief = os.environ["TFCLUSTER_WORKER_INDEX"] == "0"
start = json.loads(backup.read_text())["step"] if backup.exists() else 0
print("STEPS", os.environ["TFCLUSTER_WORKER_INDEX"], flush=True)
if chief:
    print("BACKUP", backup, flush=True)
for step in range(start + 1, 30001):
    time.sleep(0.02)
    if chief and step % 5 == 0:
        backup.write_text(json.dumps({"step": step}))
        print("TFCLUSTER_EVENT " + json.dumps({"event": "backup", "epoch": 1, "batch": step - 1}), flush=True)
    print("TFCLUSTER_EVENT " + json.dumps({"event": "progress", "step": step, "total": 30000, "time": time.time()}),
          flush=True)
print("DONE", step, flush=True)
"""


@needs_hosts
def test_idle_control_status_and_restart_of_stopped_vms(gcp_cli):
    assert gcp_cli.run("up", timeout=180).returncode == 0
    instances = gcp_cli.compute.state.instances

    changed = gcp_cli.run("idle", "--minutes", "7")
    assert changed.returncode == 0, changed.stderr
    assert {name: vm["metadata"]["tfcluster-idle-minutes"] for name, vm in instances.items()} == \
        {"default-0": "7", "default-1": "7"}
    off = gcp_cli.run("idle", "--off")
    assert off.returncode == 0 and "hypervisor deadline" in off.stdout
    assert all(vm["metadata"]["tfcluster-idle-minutes"] == "0" for vm in instances.values())
    assert "give exactly one of --minutes N or --off" in gcp_cli.run("idle").stderr

    # What each VM's watchdog published, as the guest agent would serve it.
    status_doc = {"busy": False, "idle_seconds": 420.0, "acts_at": 4102444800.0, "action": "stop",
                  "idle_minutes": 30, "readings": {"jobs": False, "ssh": False}}
    for name, vm in instances.items():
        vm["guest"]["tfcluster/watchdog"] = json.dumps(status_doc)
    status = gcp_cli.run("status")
    assert status.returncode == 0, status.stderr
    assert "Idle shutdown" in status.stdout and "idle" in status.stdout
    assert "stop at 2100-01-01" in status.stdout or "stop at 2099-12-31" in status.stdout
    assert status.stdout.count("7m00s") >= 2  # Idle for 420 s on both VMs.

    # The watchdog stopped both VMs overnight. Compute Engine cleared their termination timestamps and released
    # their external IPs; their old "ok" still sits in the guest attributes.
    lab = gcp_cli.lab
    new_ips = []
    for index, host in enumerate(lab.hosts):  # The hosts answer on a second address, as after a start.
        new_ips.append(f"{SUBNET}.{60 + index}")
        subprocess.run(["ip", "-n", host.netns, "addr", "add", f"{new_ips[-1]}/24", "dev", "eth0"], check=True)
    gcp_cli.compute.state.next_external_ip = {f"default-{i}": ip for i, ip in enumerate(new_ips)}
    old_nonces = {name: vm["guest"]["tfcluster/ready"] for name, vm in instances.items()}
    for name in list(instances):
        stop_instance(gcp_cli.compute.state, name)
    # A stop keeps the time limit (the termination timestamp goes): status shows no deadline while stopped.
    assert all(vm["max_run_seconds"] == 12 * 3600 for vm in instances.values())
    calls_before = terraform_calls(gcp_cli)
    mark = len(gcp_cli.compute.state.requests)
    # With the cluster's budget (`up --budget`): each VM's deadline is what the budget buys at the cluster's
    # rate (spent: none counted, the VMs stopped with no stop time known), never more than max_run_hours.
    again = gcp_cli.run("up", "--budget", "4", timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    status = gcp_cli.run("status")
    rate = float(re.search(r"\(in use\): \$([0-9.]+)/hour", status.stdout).group(1))  # As `up` prints it.
    seconds = instances["default-0"]["max_run_seconds"]
    assert abs(seconds - 4 / rate * 3600) < 0.01 * seconds and seconds < 12 * 3600, (seconds, rate)
    assert f"starting 2 stopped VM(s): default-0, default-1; the hypervisor deadline ({seconds / 3600:.4g} h, STOP) " \
        "is set again first" in again.stdout
    assert terraform_calls(gcp_cli) == calls_before  # Nothing re-created, no apply that could stop VMs.
    assert all(vm["status"] == "RUNNING" for vm in instances.values())
    assert all(vm["max_run_seconds"] == seconds and vm["termination_action"] == "STOP" for vm in instances.values())
    # Kept in the tfvars, for a VM re-created by a targeted apply.
    assert json.loads((gcp_cli.state_dir / "gcp" / "default" / "terraform.tfvars.json").read_text())[
        "budget_run_seconds"] == seconds
    for index in (0, 1):
        verbs = [r["path"].rsplit("/", 1)[1] for r in gcp_cli.compute.state.requests[mark:]
                 if f"/instances/default-{index}/" in r["path"] and r["method"] == "POST"]
        assert verbs.index("setMetadata") < verbs.index("setScheduling") < verbs.index("start"), verbs
    # Readiness took only this boot's nonce, and the new addresses were saved and used.
    for name, vm in instances.items():
        assert vm["guest"]["tfcluster/ready"] != old_nonces[name]
        assert vm["guest"]["tfcluster/ready"] == vm["metadata"]["tfcluster-boot-nonce"] + ":ok"
    assert [h["ssh_address"] for h in gcp_cli.cluster()["hosts"]] == new_ips
    assert all(vm["metadata"]["tfcluster-idle-minutes"] == "30" for vm in instances.values())  # --off undone.
    # A fresh hypervisor deadline (the stop cleared the old one), the budget's 2.7 h, for both VMs. (The
    # watchdog column has its own "(in ...)".)
    fresh = re.findall(r"\(in 2h(?:3\d|4\d)m", status.stdout)
    assert status.returncode == 0 and len(fresh) == 2, status.stdout
    assert "unreachable" not in status.stdout
    # A run's budget (`train --budget`): after 20 steps the projection is over it, so the run backs up,
    # stops, and exits 2 with one line. The budget buys two minutes at the cluster's rate (its end time,
    # which halts the VMs, is then well past the 20th step however slowly the run starts), and the
    # run's 30000 steps of 20 ms are ten.
    budget = round(rate * 120 / 3600, 4)
    steps = gcp_cli.state_dir.parent / "steps.py"
    steps.write_text(BUDGET_SCRIPT)
    over = gcp_cli.run("train", "--script", str(steps), "--budget", str(budget), timeout=120)  # Over SSH, new addresses.
    lines = over.stderr.strip().splitlines()
    assert over.returncode == 2 and len(lines) == 1 and "STEPS 1" in over.stdout, over.stdout + over.stderr
    run_id = gcp_cli.latest_run()[1]["run_id"]
    assert re.fullmatch(
        rf"error: run {run_id} projected at \$[0-9.]+ at step (\d+) \(median step 0\.0\d+ s × \d+ steps left × "
        rf"\${rate:.2f}/h \+ \$[0-9.]+ spent\) is over --budget {re.escape(usd(budget))}; the largest run that fits "
        rf"is \d+ "
        rf"steps; the run is stopped after its next backup: `invoke train --resume {run_id}` continues it",
        lines[0]), lines[0]
    projected_at = int(re.search(r"at step (\d+)", lines[0]).group(1))
    assert 20 <= projected_at < 100 and gcp_cli.latest_run()[1]["outcome"] == "stopped"
    # The budget's end time reached each VM's metadata for the run, and was cleared at its end.
    ends = {int(item["value"]) for r in gcp_cli.compute.state.requests if r["path"].endswith("/setMetadata")
            for item in (r["body"] or {}).get("items", []) if item["key"] == "tfcluster-budget-end" and item["value"]}
    assert len(ends) == 1 and abs(ends.pop() - time.time() - budget / rate * 3600) < 60, ends
    assert all(vm["metadata"]["tfcluster-budget-end"] == "" for vm in instances.values())
    # Its backup (in the chief's run folder) is from after the projection, for `train --resume` (which
    # tests/test_spot.py exercises on a run whose VM was preempted).
    backup = Path(re.search(r"BACKUP (\S+)", over.stdout).group(1))
    assert json.loads(backup.read_text())["step"] > projected_at


@needs_hosts
def test_deleted_vm_is_shown_skipped_and_recreated(gcp_cli, tmp_path):
    # Signed in as the README says, `gcloud auth application-default login` (a user's refresh
    # token), not with a service-account key: every call below, terraform's too, runs on it.
    adc = tmp_path / "application_default_credentials.json"
    adc.write_text(json.dumps({"type": "authorized_user", "client_id": "764086051850-x.apps.googleusercontent.com",
                               "client_secret": "d-FL95Q19q7MQmFpd7hHD0Ty", "refresh_token": "1//operator-login"}))
    gcp_cli.env["GOOGLE_APPLICATION_CREDENTIALS"] = str(adc)
    up = gcp_cli.run("up", timeout=180)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "✓ credentials: operator@example.com (application default credentials)" in up.stdout
    state = gcp_cli.compute.state
    # The idle action `delete` runs on default-1 with the VM's own token (its own service account):
    # iam.tf's binding on the instance allows it; on its sibling default-0, whose binding names
    # default-0's account alone, and on a VM of the project outside the cluster it is refused.
    state.instances["other-0"] = {"zone": "us-west1-b", "labels": {}, "status": "RUNNING", "guest": {}}
    required = "Required 'compute.instances.delete' permission for 'projects/demo-project/zones/us-west1-b/instances/"
    assert vm_deletes(gcp_cli, "other-0", by="default-1") == (403, required + "other-0'")
    assert vm_deletes(gcp_cli, "default-0", by="default-1") == (403, required + "default-0'")
    assert vm_deletes(gcp_cli, "default-1", by="default-1") == (200, "")  # Its scopes and its binding allow it.
    wait_for(lambda: advance(state) or "default-1" not in state.instances, 10, what="default-1 deleted")
    state.instances.pop("other-0")
    status = gcp_cli.run("status")
    assert status.returncode == 0, status.stderr
    assert "DELETED (`invoke up` re-creates it)" in status.stdout and "Traceback" not in status.stderr
    idle = gcp_cli.run("idle", "--minutes", "9")
    assert idle.returncode == 0, idle.stderr
    assert "skipped deleted VM(s) default-1: `invoke up` re-creates them" in idle.stdout
    again = gcp_cli.run("up", timeout=180)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "re-creating 1 deleted VM(s): default-1" in again.stdout
    apply = [call for call in terraform_log(gcp_cli) if call[0] == "apply"][-1]
    assert "-target=google_compute_instance.worker[1]" in apply
    assert "-target=google_compute_instance_iam_member.watchdog[1]" in apply
    assert not any(arg.startswith("-target=google_compute_instance.worker[0]") for arg in apply)
    assert gcp_cli.compute.state.instances["default-1"]["status"] == "RUNNING"


@needs_hosts
def test_down_keeps_a_bucket_with_results_and_deletes_it_when_asked(gcp_cli, world):
    assert gcp_cli.run("up", timeout=180).returncode == 0
    kept_name = gcp_cli.cluster()["bucket"]
    kept = bucket_of(gcp_cli.storage, kept_name)
    kept.blob("runs/r1/model/model.keras").upload_from_string(b"x" * 3_000_000)
    down = gcp_cli.run("down", timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert ["state", "rm", "-no-color", "google_storage_bucket.cluster"] in terraform_log(gcp_cli)
    assert f"kept bucket gs://{kept_name}: 1 objects, 0.00 GB" in down.stdout
    assert f"gcloud storage rm --recursive gs://{kept_name}" in down.stdout
    assert "bucket: objects are kept until you delete them" in down.stdout  # The rule in force, said.
    assert "nothing left that bills by the hour" in down.stdout
    assert kept.exists() and gcp_cli.compute.state.instances == {} and gcp_cli.cluster() is None

    # destroy took random_id.suffix with it: the next cluster gets a bucket of its own.
    assert gcp_cli.run("up", timeout=180).returncode == 0
    name = gcp_cli.cluster()["bucket"]
    assert name != kept_name
    bucket = bucket_of(gcp_cli.storage, name)
    bucket.blob("runs/r2/model/model.keras").upload_from_string(b"y" * 1000)
    # Storage refuses the operator (granted Compute, not Storage): the VMs are gone all the same,
    # and `down` stops with one line and keeps the cluster's record, to be run again.
    world.storage_proxy.owner_missing = {"storage.objects.list"}
    refused = gcp_cli.run("down", "--delete-bucket", timeout=120)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith("error: down (the VMs are destroyed; the bucket, registry, network and service account "
                           "are not yet): your account lacks the permission storage.objects.list"), line
    assert gcp_cli.compute.state.instances == {} and gcp_cli.cluster() is not None
    world.storage_proxy.owner_missing = set()
    gone = gcp_cli.run("down", "--delete-bucket", timeout=120)
    assert gone.returncode == 0, gone.stdout + gone.stderr
    calls = terraform_log(gcp_cli)
    assert ["apply", "-input=false", "-auto-approve", "-no-color", "-target=google_storage_bucket.cluster"] in calls
    assert f"deleting bucket gs://{name} with its 1 objects" in gone.stdout
    assert not bucket.exists() and kept.exists()


@needs_hosts
def test_google_errors_are_one_line_with_the_fix(gcp_cli):
    gcp_cli.compute.state.service_disabled = True
    up = gcp_cli.run("up", timeout=60)
    assert up.returncode == 2 and "Traceback" not in up.stderr
    # Seen by `up`'s own check (Service Usage) before any Compute call.
    assert up.stderr.strip().splitlines() == [
        "error: the API compute.googleapis.com is off in project demo-project: run `gcloud services enable "
        "compute.googleapis.com --project demo-project`"]
    assert gcp_cli.cluster() is None

