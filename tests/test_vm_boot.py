"""The boot script on machines that really boot (tests/vmlab.py): systemd as PID 1, the boot
unit running startup/startup.sh from the metadata, the watchdog as a real service, a real halt.

The unhappy boots, at once in one module fixture; the tests then assert on each:
- deadpip:  a dead package index -> "<nonce>:error: pip install ... failed", then halted as idle;
- hungpip:  an index that never answers -> the boot grace ends the boot's activity, halted;
- deadapt:  no venv and a dead apt source -> the exact venv error in the ready attribute;
- docker:   tfcluster-docker=true -> docker.io installed after the watchdog, before pip; the
            daemon's own start-up error (it cannot run unprivileged here) as one line;
- gpu:      the metadata terraform plans for a GPU VM (an N1 with a T4), and the offline
            wheelhouse, which holds no CUDA wheels -> startup.sh takes its GPU branch and fails at
            its first GPU-only step (pip install tensorflow[and-cuda]) with its own error line.
The healthy boot (TensorFlow installed, the watchdog first and restarted when killed, a second
boot without reinstall, the idle halt) is part of the booted cluster's scenario
(tests/test_booted_cluster.py), on the VMs the product itself creates and trains on.
"""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from tests.conftest import wait_for
from tests.imagelab import ensure_dockerd
from tests.vmlab import VmLab, terraform_metadata_keys

TF_VERSION = "2.21.0"
VENV_ERROR = "The virtual environment was not created successfully because ensurepip is not available."

pytestmark = [pytest.mark.skipif(os.geteuid() != 0 or shutil.which("debootstrap") is None,
                                reason="needs root, debootstrap and Docker (.ci/run installs them)"),
              # One worker boots the module's machines once (the `lab` fixture) for all its tests.
              pytest.mark.xdist_group("vm_boot")]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    reason = ensure_dockerd()
    if reason:
        pytest.skip(reason)
    lab = VmLab(tmp_path_factory.mktemp("vmlab"))
    try:
        lab.boot("deadpip", nonce="deadpip-1", pip="dead", idle_minutes=0.1)
        hung = lab.boot("hungpip", nonce="hungpip-1", pip="hung", idle_minutes=0.1,
                        extra={"tfcluster-boot-grace-minutes": "0.5"})
        lab.boot("deadapt", nonce="deadapt-1", apt="dead", idle_minutes=60)
        # A cluster for `train --image` (variable docker): Docker from the offline apt repository.
        # dockerd itself cannot run in an unprivileged container (no overlay mounts, no iptables),
        # so this machine shows the install and that a daemon failure is one line naming the cause.
        lab.boot("docker", nonce="docker-1", pip="dead", idle_minutes=60, extra={"tfcluster-docker": "true"})
        # The GPU machine (terraform's plan, then pip downloading TensorFlow's wheel to resolve its
        # [and-cuda] extra) starts once the hung machine's pip has reached its index (or after 3
        # minutes), so it does not eat into that boot's 30-second grace on a busy machine.
        deadline = time.monotonic() + 180
        while not hung.hung.accepted and time.monotonic() < deadline:
            time.sleep(1)
        gpu_metadata = planned_metadata(tmp_path_factory.mktemp("gpu-plan"), gpu="nvidia-tesla-t4", gpu_count=1)
        lab.boot("gpu", nonce="gpu-1", planned=gpu_metadata)
        yield {machine.name: machine for machine in lab.machines}
    finally:
        lab.close()


def planned_metadata(workdir, **settings) -> dict[str, str]:
    """The metadata terraform plans for VM 0 of a cluster with ``settings`` (as `up` writes them)."""
    from tests.test_terraform_agreement import product_variables
    from tests.world.provider import mirror, planning

    env = {**os.environ, **mirror.build(workdir / "providers")}
    shown = planning.plan(env, workdir / "cluster", product_variables(**settings))
    return planning.planned_values(shown, "google_compute_instance.worker[0]")["metadata"]


def statuses(machine) -> list[tuple[float, dict]]:
    return [(write.at, json.loads(write.value)) for write in machine.metadata.history("tfcluster/watchdog")]


def ready_values(machine) -> list[str]:
    return [write.value for write in machine.metadata.history("tfcluster/ready")]


def test_machines_get_the_metadata_keys_terraform_sets(lab):
    served = {key.removeprefix("instance/attributes/") for key in lab["deadapt"].metadata.values}
    assert terraform_metadata_keys() <= served


def test_dead_pip_index_reports_the_error_and_the_idle_rule_halts_the_machine(lab):
    machine = lab["deadpip"]
    wait_for(lambda: machine.ready() not in (None, "deadpip-1:starting"), 600, 1, "the boot to fail")
    assert machine.ready() == f"deadpip-1:error: pip install tensorflow=={TF_VERSION} failed"
    failed_at = machine.metadata.history("tfcluster/ready")[-1].at
    wait_for(lambda: not machine.running(), 240, 1, "the idle watchdog to halt the machine")
    # The watchdog outlived the failure: it kept publishing, saw the boot over, and acted.
    after = [status for at, status in statuses(machine) if at > failed_at]
    assert after, "no watchdog status after the failed install"
    assert after[-1]["readings"]["boot"] is False and after[-1]["busy"] is False
    assert after[-1]["act"] is True


def test_hung_pip_is_bounded_by_the_boot_grace(lab):
    machine = lab["hungpip"]
    wait_for(lambda: not machine.running(), 400, 1, "the boot grace to end and the watchdog to halt the machine")
    # Halted while pip still waited on the index: the boot never finished.
    assert ready_values(machine) == ["hungpip-1:starting"]
    assert machine.hung.accepted, "pip never reached the hanging index"
    readings = [status["readings"]["boot"] for _, status in statuses(machine)]
    assert readings[0] is True and readings[-1] is False


def test_without_venv_and_a_dead_apt_source_the_ready_attribute_carries_the_venv_error(lab):
    machine = lab["deadapt"]
    wait_for(lambda: machine.ready() not in (None, "deadapt-1:starting"), 600, 1, "the boot to fail")
    value = machine.ready()
    assert value.startswith("deadapt-1:error: python3 -m venv failed: " + VENV_ERROR), value
    assert " Installing python3-venv failed: E: " in value, value
    assert "\n" not in value
    # The image really lacks python3-venv (what made the healthy machine's fallback run).
    assert machine.exec("dpkg-query", "-W", "-f", "${Status}", "python3-venv").stdout != "install ok installed"
    assert machine.exec("systemctl", "is-active", "tfcluster-watchdog").stdout.strip() == "active"


def test_an_image_cluster_installs_docker_after_the_watchdog_and_names_a_daemon_failure(lab):
    machine = lab["docker"]
    wait_for(lambda: machine.ready() not in (None, "docker-1:starting"), 600, 1, "the boot to end")
    value = machine.ready()
    assert value.startswith("docker-1:error: Docker is installed but its daemon did not start: "
                            "failed to start daemon: "), value
    assert "\n" not in value
    assert machine.exec("dpkg-query", "-W", "-f", "${Status}", "docker.io").stdout == "install ok installed"
    assert machine.exec("systemctl", "is-active", "tfcluster-watchdog").stdout.strip() == "active"
    # Docker came before the Python environment: pip never ran on this machine.
    assert machine.exec("test", "-e", "/opt/tfcluster/venv").returncode != 0


def test_a_gpu_vm_takes_the_gpu_branch_and_fails_at_its_first_gpu_step(lab):
    """The GPU path runs as terraform writes it: the planned metadata says install-nvidia-driver,
    startup.sh's GPU branch asks pip for TensorFlow with CUDA, and the offline wheelhouse has no
    CUDA wheels, so the boot ends there with startup.sh's own line (a VM whose metadata and script
    disagree on the flag would install the CPU build instead and report ok)."""
    machine = lab["gpu"]
    wait_for(lambda: machine.ready() not in (None, "gpu-1:starting"), 600, 1, "the GPU boot to end")
    assert machine.ready() == f"gpu-1:error: pip install tensorflow[and-cuda]=={TF_VERSION} failed"
    assert machine.wheels.requests, "pip never reached the wheelhouse"
    assert machine.exec("systemctl", "is-active", "tfcluster-watchdog").stdout.strip() == "active"
