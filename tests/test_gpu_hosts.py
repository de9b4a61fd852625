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
