"""GPU hosts checked before they train, on own hosts: two real sshd hosts whose nvidia-smi is the
world's stand-in (tests/world/nvidia_smi.py, as NVIDIA's manual documents it), each bad value planted
on one host, and the run refused (the ssh backend's preflight, where `train` checks its hosts) with one
error naming the host, the GPU and the field."""

from __future__ import annotations

import sys

import pytest

from tests.hostlab import HostLab, available
from tests.world import nvidia_smi
from tfcluster import gpu_health
from tfcluster.backends.ssh.backend import SshBackend
from tfcluster.errors import ClusterError
from tfcluster.state import ClusterState, HostRecord

pytestmark = pytest.mark.skipif(available() is not None, reason=available() or "")


@pytest.fixture
def gpu_lab(tmp_path):
    """Two hosts with two L4s each (host 1's folder is the one the test plants in)."""
    folders = {index: nvidia_smi.install(tmp_path / f"sbin{index}", "nvidia-l4", count=2) for index in (0, 1)}
    lab = HostLab(tmp_path / "lab", 2, tag="gpu", sbin=folders)
    lab.gpu_folders = folders
    yield lab
    lab.teardown()


def test_each_bad_gpu_value_on_one_own_host_refuses_the_run_naming_host_gpu_and_field(gpu_lab, tmp_path):
    # The ssh backend's own hosts, as `train` gets them for its preflight (the check's place: before the
    # TensorFlow import check and before anything is staged or started).
    records = [HostRecord(name=f"worker-{i}", address=h.address, tf_port=23456, host_key=h.host_key_public,
                          remote_root=str(tmp_path / "remote")) for i, h in enumerate(gpu_lab.hosts)]
    cluster = ClusterState(name="gpu", backend="ssh", hosts=records, ssh_user="root", ssh_key=str(gpu_lab.client_key),
                           python=sys.executable)
    backend = SshBackend(store=None, announce=lambda text: None)
    hosts = backend.hosts(cluster)
    assert gpu_health.check_hosts(hosts) == []
    folder = gpu_lab.gpu_folders[1]
    # [N/A] and [Not Supported] are "does not apply": never a failure.
    nvidia_smi.plant(folder, 0, "ecc.errors.uncorrected.volatile.total", "[N/A]")
    nvidia_smi.plant(folder, 1, "remapped_rows.failure", "[Not Supported]")
    healthy = (folder / "gpus.json").read_text()
    assert gpu_health.check_hosts(hosts) == []

    # The run is refused with one line naming the host, the GPU and the field, and nothing else.
    nvidia_smi.plant(folder, 1, "ecc.errors.uncorrected.volatile.total", "3")
    with pytest.raises(ClusterError) as refused:
        backend.preflight(cluster, hosts, need_tensorflow=True)
    assert str(refused.value) == (
        f"GPU check failed, so nothing was started: worker-1 ({gpu_lab.hosts[1].address}) GPU 1: "
        "ecc.errors.uncorrected.volatile.total is 3 (uncorrectable ECC errors since the driver loaded). "
        "Repair or replace that host (a GPU reset or a reboot clears pending retirements and remappings), "
        "or leave it out of the cluster")
    assert "\n" not in str(refused.value)

    plants = [
        (0, "retired_pages.pending", "Yes", "GPU 0: retired_pages.pending is Yes (a page retirement waits"),
        (1, "remapped_rows.pending", "Yes", "GPU 1: remapped_rows.pending is Yes (a row remapping at "
         "00000000:00:05.0 waits for a GPU reset)"),
        (0, "remapped_rows.failure", "Yes", "GPU 0: remapped_rows.failure is Yes (row remapping failed"),
        (1, "", "gone", "its GPUs: count is 1 (expected 2: a GPU is missing from the machine)"),
        (0, "name", "NVIDIA A100-SXM4-40GB", "GPU 0: name is NVIDIA A100-SXM4-40GB (expected NVIDIA L4)"),
    ]
    for index, field, value, said in plants:
        (folder / "gpus.json").write_text(healthy)
        nvidia_smi.plant(folder, index, field, value)
        found = [fault.line() for fault in gpu_health.check_hosts(hosts)]
        assert len(found) == 1 and found[0].startswith(f"worker-1 ({gpu_lab.hosts[1].address}) ") and said in found[0], \
            (field, found)


def test_a_gcp_cluster_expects_the_gpus_up_applied_on_every_vm(tmp_path):
    """gcp VMs are held to what `up` applied (terraform.tfvars.json): gpu_count GPUs of gpu_type, by the
    words of the name nvidia-smi prints on those VMs (tests/world/nvidia_smi.py's MODELS)."""
    from types import SimpleNamespace

    from tfcluster.backends.gcp.backend import GcpBackend

    backend = GcpBackend(store=SimpleNamespace(root=tmp_path), announce=lambda text: None)
    cluster = ClusterState(name="c", backend="gcp", hosts=[])
    assert backend.gpu_expectation(cluster) == (None, ())  # Nothing applied yet: the majority rule.
    (tmp_path / "gcp" / "c").mkdir(parents=True)
    (tmp_path / "gcp" / "c" / "terraform.tfvars.json").write_text('{"gpu_type": "nvidia-a100-80gb", "gpu_count": 2}')
    count, words = backend.gpu_expectation(cluster)
    assert (count, words) == (2, ("A100", "80GB"))
    one = gpu_health.HostGpus("worker-0 (10.0.0.2)", [["0", "NVIDIA A100-SXM4-40GB", "0", "[N/A]"]], [])
    assert [fault.line() for fault in gpu_health.faults(one, count, words)] == [
        "worker-0 (10.0.0.2) its GPUs: count is 1 (expected 2: a GPU is missing from the machine)",
        "worker-0 (10.0.0.2) GPU 0: name is NVIDIA A100-SXM4-40GB (expected A100 80GB)"]
    healthy = [[str(i), name, "0", "[N/A]"] for i, name in enumerate([nvidia_smi.MODELS["nvidia-a100-80gb"][0]] * 2)]
    assert gpu_health.faults(gpu_health.HostGpus("w", healthy, []), count, words) == []


class StandInHost:
    """A WorkerHost whose commands run on this machine with its own nvidia-smi stand-in first on PATH
    (what a VM of the world answers; no booted VM needed for the check's decisions)."""

    def __init__(self, name: str, address: str, folder):
        self.record, self.folder = HostRecord(name=name, address=address, tf_port=2222), folder

    def run_command(self, argv: list[str], timeout: float = 60):
        import os
        import subprocess

        from tfcluster.backends.base import CommandResult

        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "PATH": f"{self.folder}:{os.environ['PATH']}"})
        return CommandResult(done.returncode, done.stdout, done.stderr)


def test_a_gcp_vm_whose_gpus_fail_the_check_is_recreated_under_retries_and_refused_without(tmp_path):
    """Issue 44, item 4: on gcp, --retries re-creates the VM whose GPUs fail the check (a new VM, other
    hardware: its stand-in answers healthy GPUs) and checks again; without retries, or on own hosts (no
    replace), the run is refused as before; a re-created VM that fails again spends the next retry."""
    folders = {i: nvidia_smi.install(tmp_path / f"vm{i}", "nvidia-a100-80gb", count=2) for i in (0, 1)}
    hosts = [StandInHost(f"worker-{i}", f"10.0.0.{i + 2}", folders[i]) for i in (0, 1)]
    expected = (2, gpu_health.model_words("a100-80gb"))
    said, replaced = [], []

    def preflight():
        gpu_health.require_healthy(hosts, *expected)

    def recreate(bad_again: bool):
        def replace(workers):
            replaced.append(list(workers))
            for worker in workers:  # Compute places the new VM on other hardware.
                index = int(worker.rsplit("-", 1)[1])
                nvidia_smi.install(folders[index], "nvidia-a100-80gb", count=2)
                if bad_again:
                    nvidia_smi.plant(folders[index], 0, "remapped_rows.failure", "Yes")
        return replace

    nvidia_smi.plant(folders[1], 1, "ecc.errors.uncorrected.volatile.total", "3")
    for retries, replace in [(0, recreate(False)), (2, None)]:
        with pytest.raises(gpu_health.GpuCheckFailed) as refused:
            gpu_health.checked_replacing(preflight, replace, retries, said.append)
        assert "worker-1 (10.0.0.3) GPU 1: ecc.errors.uncorrected.volatile.total is 3" in str(refused.value)
        assert refused.value.workers == ["worker-1"]
        assert str(refused.value).endswith("or run again with --retries 1 to re-create it on other hardware") \
            == (retries == 0)
    assert (replaced, said) == ([], [])

    assert gpu_health.checked_replacing(preflight, recreate(False), 2, said.append) == 1
    assert replaced == [["worker-1"]]
    assert said == ["GPU check failed on worker-1 (worker-1 (10.0.0.3) GPU 1: ecc.errors.uncorrected.volatile.total is 3 "
                    "(uncorrectable ECC errors since the driver loaded)); re-creating it on other hardware (--retries: "
                    "1 of 2)"], said

    nvidia_smi.plant(folders[0], 0, "remapped_rows.pending", "Yes")
    with pytest.raises(gpu_health.GpuCheckFailed, match="worker-0 .* GPU 0: remapped_rows.failure is Yes"):
        gpu_health.checked_replacing(preflight, recreate(True), 1, said.append)
    assert replaced[1:] == [["worker-0"]]


def test_gcp_replaces_a_vm_by_deleting_it_for_the_deleted_vm_path(world, tmp_path, monkeypatch):
    """GcpBackend.replace_machines deletes the VM through Compute, then brings the cluster back as `up`
    does (refresh -> restart.bring_back, whose deleted-VM branch re-creates it by a targeted apply)."""
    from types import SimpleNamespace

    from tests.test_capacity import ZONE, _body, _grant_h100_quota, _insert
    from tfcluster.backends.gcp.backend import GcpBackend
    from tfcluster.backends.gcp.cloud.compute import ComputeApi

    _grant_h100_quota(world.compute.state)
    standard = {"provisioningModel": "STANDARD", "onHostMaintenance": "TERMINATE"}
    for index in (0, 1):
        _insert(_body(f"c-{index}", machine="a2-highgpu-1g", model="STANDARD", scheduling=standard)).result(timeout=20)
    backend = GcpBackend(store=SimpleNamespace(root=tmp_path), announce=lambda text: None)
    cluster = ClusterState(name="c", backend="gcp", project="demo-project", zone=ZONE, hosts=[
        HostRecord(name=f"worker-{i}", address=f"10.0.0.{i + 2}", tf_port=2222, instance=f"c-{i}") for i in (0, 1)])
    seen = []
    api = ComputeApi("demo-project")
    monkeypatch.setattr(backend, "refresh", lambda cluster, settings: seen.append(
        {name: api.instance_or_none(ZONE, name) is not None for name in ("c-0", "c-1")}))
    backend.replace_machines(cluster, SimpleNamespace(), ["worker-1"])
    assert seen == [{"c-0": True, "c-1": False}]
    assert backend.can_replace_machines and not SshBackend.can_replace_machines
