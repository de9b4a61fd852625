"""The boot script on machines that really boot (tests/vmlab.py): systemd as PID 1, the boot
unit running startup/startup.sh from the metadata, the watchdog as a real service, a real halt.

Four machines boot at once in one module fixture; the tests then assert on each:
- healthy:  offline wheelhouse and apt repo -> ready "<nonce>:ok" (python3-venv installed by the
            fallback, the image lacks it), the watchdog first, Restart=always, a second boot, and
            finally the idle rule's `stop` halting it;
- deadpip:  a dead package index -> "<nonce>:error: pip install ... failed", then halted as idle;
- hungpip:  an index that never answers -> the boot grace ends the boot's activity, halted;
- deadapt:  no venv and a dead apt source -> the exact venv error in the ready attribute;
- docker:   tfcluster-docker=true -> docker.io installed after the watchdog, before pip; the
            daemon's own start-up error (it cannot run unprivileged here) as one line.
The tests of `healthy` run in file order (kill, second boot, halt).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.conftest import wait_for
from tests.imagelab import ensure_dockerd
from tests.vmlab import VmLab, terraform_metadata_keys

TF_VERSION = "2.21.0"
VENV_ERROR = "The virtual environment was not created successfully because ensurepip is not available."

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("debootstrap") is None,
                                reason="needs root, debootstrap and Docker (.ci/run installs them)")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    reason = ensure_dockerd()
    if reason:
        pytest.skip(reason)
    lab = VmLab(tmp_path_factory.mktemp("vmlab"))
    try:
        lab.boot("healthy", nonce="healthy-1", idle_minutes=60)
        lab.boot("deadpip", nonce="deadpip-1", pip="dead", idle_minutes=0.1)
        lab.boot("hungpip", nonce="hungpip-1", pip="hung", idle_minutes=0.1,
                 extra={"tfcluster-boot-grace-minutes": "0.5"})
        lab.boot("deadapt", nonce="deadapt-1", apt="dead", idle_minutes=60)
        # A cluster for `train --image` (variable docker): Docker from the offline apt repository.
        # dockerd itself cannot run in an unprivileged container (no overlay mounts, no iptables),
        # so this machine shows the install and that a daemon failure is one line naming the cause.
        lab.boot("docker", nonce="docker-1", pip="dead", idle_minutes=60, extra={"tfcluster-docker": "true"})
        yield {machine.name: machine for machine in lab.machines}
    finally:
        lab.close()


def statuses(machine) -> list[tuple[float, dict]]:
    return [(write.at, json.loads(write.value)) for write in machine.metadata.history("tfcluster/watchdog")]


def ready_values(machine) -> list[str]:
    return [write.value for write in machine.metadata.history("tfcluster/ready")]


def test_machines_get_the_metadata_keys_terraform_sets(lab):
    served = {key.removeprefix("instance/attributes/") for key in lab["healthy"].metadata.values}
    assert terraform_metadata_keys() <= served


def test_healthy_machine_in_order(lab):
    """One machine's life, in order (each step needs the one before; pytest's order across tests
    is not a contract): boot, a killed watchdog, a second boot without reinstall, the idle halt."""
    _boot_is_ready_with_tensorflow_and_the_watchdog_came_first(lab)
    _killed_watchdog_is_restarted_by_systemd(lab)
    _second_boot_uses_the_installed_environment_and_the_new_nonce(lab)
    _the_watchdog_stop_action_halts_an_idle_machine(lab)


def _boot_is_ready_with_tensorflow_and_the_watchdog_came_first(lab):
    machine = lab["healthy"]
    wait_for(lambda: machine.ready() not in (None, "healthy-1:starting"), 900, 1, "the healthy boot to finish")
    assert machine.ready() == "healthy-1:ok", machine.journal("google-startup-scripts")
    assert ready_values(machine) == ["healthy-1:starting", "healthy-1:ok"]
    version = machine.exec("/opt/tfcluster/venv/bin/python", "-c", "import tensorflow as tf; print(tf.__version__)",
                           timeout=180)
    assert version.stdout.strip() == TF_VERSION, version.stderr[-2000:]
    # The image has no python3-venv (see deadapt): the fallback installed it from the offline repo.
    assert machine.exec("dpkg-query", "-W", "-f", "${Status}", "python3-venv").stdout == "install ok installed"
    assert machine.exec("systemctl", "is-active", "tfcluster-watchdog").stdout.strip() == "active"
    # Order: the watchdog published its first status before pip asked the wheelhouse for anything.
    first_status = statuses(machine)[0][0]
    first_pip_request = machine.wheels.requests[0][0]
    assert first_status < first_pip_request


def _killed_watchdog_is_restarted_by_systemd(lab):
    machine = lab["healthy"]
    assert machine.ready() == "healthy-1:ok"

    def main_pid() -> int:
        return int(machine.exec("systemctl", "show", "-p", "MainPID", "--value", "tfcluster-watchdog").stdout)

    before = main_pid()
    assert before > 0
    machine.exec("bash", "-c", f"kill -9 {before}", check=True)
    after = wait_for(lambda: (pid := main_pid()) not in (0, before) and pid, 60, 0.5, "a new watchdog process")
    assert machine.exec("systemctl", "is-active", "tfcluster-watchdog").stdout.strip() == "active"
    assert int(machine.exec("systemctl", "show", "-p", "NRestarts", "--value", "tfcluster-watchdog").stdout) >= 1
    assert after != before


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


def _second_boot_uses_the_installed_environment_and_the_new_nonce(lab):
    machine = lab["healthy"]
    assert machine.ready() == "healthy-1:ok"
    stamp = f"/opt/tfcluster/venv/.installed-tensorflow-{TF_VERSION}-tuner"
    stamp_mtime = machine.exec("stat", "-c", "%Y", stamp, check=True).stdout
    # A reinstall would now fail: the package index is gone for this boot.
    machine.set_pip("[global]\nindex-url = http://127.0.0.1:9/simple\ntimeout = 3\nretries = 0\n")
    machine.stop()
    assert not machine.running()
    writes_before = len(machine.metadata.writes)
    machine.metadata.values["instance/attributes/tfcluster-boot-nonce"] = "healthy-2"
    machine.start()
    wait_for(lambda: machine.ready() not in ("healthy-1:ok", "healthy-2:starting"), 300, 1, "the second boot")
    assert machine.ready() == "healthy-2:ok", machine.journal("google-startup-scripts")
    second = [w.value for w in machine.metadata.writes[writes_before:] if w.key == "tfcluster/ready"]
    assert second == ["healthy-2:starting", "healthy-2:ok"]
    assert machine.exec("stat", "-c", "%Y", stamp, check=True).stdout == stamp_mtime
    assert machine.exec("systemctl", "is-active", "tfcluster-watchdog").stdout.strip() == "active"


def _the_watchdog_stop_action_halts_an_idle_machine(lab):
    machine = lab["healthy"]
    assert machine.running() and machine.ready() == "healthy-2:ok"
    # `invoke idle --minutes 0.1` changes the metadata; the watchdog reads it at every poll.
    machine.metadata.values["instance/attributes/tfcluster-idle-minutes"] = "0.1"
    wait_for(lambda: not machine.running(), 180, 1, "the watchdog to halt the idle machine")
    last = statuses(machine)[-1][1]
    assert last["act"] is True and last["action"] == "stop"


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
