"""Compute's rules across an instance's fields (tests/world/instance_rules.py), each refused at
instances.insert in Compute's words."""

from __future__ import annotations

import copy

import pytest
import requests

from tests.world.compute_auth import OPERATOR_TOKEN

P, ZONE = "demo-project", "us-west1-b"
IMAGE = "projects/deeplearning-platform-release/global/images/common-cu129-ubuntu-2204-nvidia-580-v20261115"
BODY = {
    "name": "rules-0", "machineType": f"zones/{ZONE}/machineTypes/n1-standard-8",
    "labels": {"tfcluster-cluster": "default"},
    "disks": [{"boot": True, "autoDelete": True, "initializeParams": {
        "sourceImage": IMAGE, "diskType": f"projects/{P}/zones/{ZONE}/diskTypes/pd-balanced"}}],
    "networkInterfaces": [{"accessConfigs": [{"type": "ONE_TO_ONE_NAT"}]}],
    "guestAccelerators": [{"acceleratorType": f"projects/{P}/zones/{ZONE}/acceleratorTypes/nvidia-tesla-t4",
                           "acceleratorCount": 1}],
    "scheduling": {"onHostMaintenance": "TERMINATE", "automaticRestart": True, "provisioningModel": "STANDARD"},
}
NO_MIGRATION = "Instances with guest accelerators do not support live migration."
LABEL_VALUE = ("Invalid value for field 'resource.labels': ''. Label value 'Default' violates format constraints. "
               "The value can only contain lowercase letters, numeric characters, underscores and dashes. The value "
               "can be at most 63 characters long. International characters are allowed.")
LABEL_KEY = ("Invalid value for field 'resource.labels': ''. Label key 'Cluster' violates format constraints. The "
             "key must start with a lowercase character, can only contain lowercase letters, numeric characters, "
             "underscores and dashes. The key can be at most 63 characters long. International characters are "
             "allowed.")


def _with(**changes) -> dict:
    body = copy.deepcopy(BODY)
    for path, value in changes.items():
        *parents, last = path.split("__")
        node = body
        for parent in parents:
            node = node[parent]
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return body


CASES = {
    "a capitalised label value": (_with(labels={"tfcluster-cluster": "Default"}), LABEL_VALUE),
    "a capitalised label key": (_with(labels={"Cluster": "default"}), LABEL_KEY),
    "GPUs that live-migrate": (_with(scheduling__onHostMaintenance="MIGRATE"), NO_MIGRATION),
    "GPUs with the default maintenance (MIGRATE)": (_with(scheduling__onHostMaintenance=None), NO_MIGRATION),
    "a G2 machine that live-migrates": (_with(machineType=f"zones/{ZONE}/machineTypes/g2-standard-8",
                                              guestAccelerators=None, scheduling__onHostMaintenance="MIGRATE"),
                                        NO_MIGRATION),
    "an A3 machine that live-migrates": (
        _with(machineType=f"zones/{ZONE}/machineTypes/a3-highgpu-8g", guestAccelerators=None,
              scheduling__onHostMaintenance="MIGRATE", networkInterfaces=[{"nicType": "GVNIC"}]),
        "Invalid value for field 'resource.scheduling.onHostMaintenance': 'MIGRATE'. Scheduling must have "
        "onHostMaintenance be one of the following valid types: [TERMINATE]. But was MIGRATE"),
    "Spot with automatic restart": (
        _with(scheduling={"onHostMaintenance": "TERMINATE", "automaticRestart": True, "provisioningModel": "SPOT",
                          "preemptible": True, "instanceTerminationAction": "STOP"}),
        "Invalid value for field 'resource.scheduling.preemptible': 'true'. Scheduling must have preemptible be "
        "false when AutomaticRestart is true."),
    # tests/world/facts.py, PREEMPTIBLE_MIGRATE: GPU or not (travis-ci/worker#487's VM had none).
    "a Spot VM without GPUs that live-migrates": (
        _with(guestAccelerators=None, scheduling={"onHostMaintenance": "MIGRATE", "automaticRestart": False,
                                                  "provisioningModel": "SPOT", "preemptible": True,
                                                  "instanceTerminationAction": "STOP"}),
        "Invalid value for field 'resource.scheduling.preemptible': 'true'. Scheduling must have preemptible be "
        "false when OnHostMaintenance isn't TERMINATE."),
    "three T4s": (_with(guestAccelerators=[{**BODY["guestAccelerators"][0], "acceleratorCount": 3}]),
                  "Invalid value for field 'resource.guestAccelerators[0].acceleratorCount': '3'. Number of "
                  "accelerator cards attached to an instance must be one of [1, 2, 4]."),
    "one V100 with 16 vCPUs": (
        _with(machineType=f"zones/{ZONE}/machineTypes/n1-standard-16", guestAccelerators=[
            {"acceleratorType": f"projects/{P}/zones/{ZONE}/acceleratorTypes/nvidia-tesla-v100", "acceleratorCount": 1}]),
        "Invalid value for field 'resource.guestAccelerators[0].acceleratorCount': '1'. At most 12 vCPUs can be "
        "used along with 1 accelerator cards in an instance."),
    "an L4 on N1": (_with(guestAccelerators=[{"acceleratorType": f"projects/{P}/zones/{ZONE}/acceleratorTypes/nvidia-l4",
                                              "acceleratorCount": 1}]),
                    "[n1-standard-8, nvidia-l4] features are not compatible for creating instance."),
}


# One worker runs the module in file order on its module-scoped world (tests/scheduling.py).
pytestmark = pytest.mark.xdist_group("world_rules")


@pytest.fixture(scope="module")
def google(module_world):
    module_world.compute.state.accelerators[ZONE] = ["nvidia-tesla-t4", "nvidia-tesla-v100", "nvidia-l4"]
    return module_world


def insert(google, body: dict) -> requests.Response:
    return requests.post(f"https://compute.googleapis.com/compute/v1/projects/{P}/zones/{ZONE}/instances", json=body,
                         headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}, verify=str(google.ca), timeout=30)


@pytest.mark.parametrize("case", sorted(CASES))
def test_compute_refuses_what_its_rules_forbid(google, case):
    body, message = CASES[case]
    answer = insert(google, body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["message"] == message
    assert "rules-0" not in google.compute.state.instances


def test_an_instance_within_the_rules_is_made(google):
    for body in (BODY, _with(scheduling={"onHostMaintenance": "TERMINATE", "automaticRestart": False,
                                         "provisioningModel": "SPOT", "preemptible": True,
                                         "instanceTerminationAction": "STOP"}, name="rules-1"),
                 _with(labels={"ключ": "значение", "a_b-1": ""}, name="rules-2")):  # International characters.
        answer = insert(google, body)
        assert answer.status_code == 200, answer.text
