"""The world keeps to Google's discovery documents (tests/world/discovery.py): every REST stand-in
refuses what Google refuses, in Google's words, and a stand-in that answers outside its document
fails the test that saw it."""

from __future__ import annotations

import pytest
import requests

from tests.world import discovery
from tests.world.compute_auth import OPERATOR_TOKEN

P = "demo-project"
COMPUTE = f"https://compute.googleapis.com/compute/v1/projects/{P}"
AR = f"https://artifactregistry.googleapis.com/v1/projects/{P}/locations/us-west1/repositories"
UNKNOWN_FIELD = "Invalid JSON payload received. Unknown name \"bogus\""


@pytest.fixture(scope="module")
def google(tmp_path_factory):
    """One world for the module's requests (they change nothing in it)."""
    from tests.world.names import GoogleWorld

    world = GoogleWorld(tmp_path_factory.mktemp("world"))
    with world.resolving():
        yield world
    world.close()


# Per stand-in: (verb, url, JSON body) with an unknown field, and with a value its enum lacks.
# Where the method takes no body, a query parameter carries the mistake (the system parameter
# $.xgafv is an enum of every document).
CASES = {
    "compute": ((("POST", f"{COMPUTE}/zones/us-west1-b/instances", {"name": "vm-1", "bogus": 1})),
                ("POST", f"{COMPUTE}/zones/us-west1-b/instances",
                 {"name": "vm-1", "scheduling": {"provisioningModel": "BOGUS"}})),
    "iam": (("POST", f"https://iam.googleapis.com/v1/projects/{P}/serviceAccounts",
             {"accountId": "a-1", "serviceAccount": {"bogus": "x"}}),
            ("POST", f"https://iam.googleapis.com/v1/projects/{P}/roles",
             {"roleId": "r", "role": {"stage": "BOGUS"}})),
    "artifactregistry": (("POST", f"{AR}?repositoryId=r", {"format": "DOCKER", "bogus": 1}),
                         ("POST", f"{AR}?repositoryId=r", {"format": "BOGUS"})),
    "cloudbilling": (("GET", "https://cloudbilling.googleapis.com/v1/services?bogus=1", None),
                     ("GET", "https://cloudbilling.googleapis.com/v1/services?%24.xgafv=7", None)),
    "serviceusage": (("GET", f"https://serviceusage.googleapis.com/v1/projects/{P}/services:batchGet"
                             f"?names=projects/{P}/services/compute.googleapis.com&bogus=1", None),
                     ("GET", f"https://serviceusage.googleapis.com/v1/projects/{P}/services:batchGet"
                             f"?names=projects/{P}/services/compute.googleapis.com&%24.xgafv=7", None)),
    "cloudresourcemanager": (("POST", f"https://cloudresourcemanager.googleapis.com/v1/projects/{P}:testIamPermissions",
                              {"permissions": ["compute.instances.get"], "bogus": 1}),
                             ("POST", f"https://cloudresourcemanager.googleapis.com/v1/projects/{P}:testIamPermissions"
                                      "?%24.xgafv=7", {"permissions": ["compute.instances.get"]})),
    "orgpolicy": (("GET", f"https://orgpolicy.googleapis.com/v2/projects/{P}/policies/"
                          "compute.requireOsLogin:getEffectivePolicy?bogus=1", None),
                  ("GET", f"https://orgpolicy.googleapis.com/v2/projects/{P}/policies/"
                          "compute.requireOsLogin:getEffectivePolicy?%24.xgafv=7", None)),
    "monitoring": (("GET", f"https://monitoring.googleapis.com/v3/projects/{P}/timeSeries?filter=x&bogus=1", None),
                   ("GET", f"https://monitoring.googleapis.com/v3/projects/{P}/timeSeries?filter=x&view=BOGUS", None)),
    "storage": (("POST", f"https://storage.googleapis.com/storage/v1/b?project={P}", {"name": "b-1", "bogus": 1}),
                ("GET", "https://storage.googleapis.com/storage/v1/b/b-1?projection=bogus", None)),
}


@pytest.mark.parametrize("mistake", ["unknown field", "invalid enum value"])
@pytest.mark.parametrize("stand_in", sorted(CASES))
def test_every_stand_in_refuses_what_its_document_lacks(google, stand_in, mistake):
    verb, url, body = CASES[stand_in][mistake == "invalid enum value"]
    answer = requests.request(verb, url, json=body, timeout=30, verify=str(google.ca),
                              headers={"Authorization": f"Bearer {OPERATOR_TOKEN}",
                                       "x-goog-user-project": P})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    if mistake == "unknown field":
        assert error["message"].startswith(UNKNOWN_FIELD), error
    elif stand_in == "compute":  # Compute's enums are strings in its protos: Compute itself refuses.
        assert error["message"] == "Invalid value for field 'resource.scheduling.provisioningModel': 'BOGUS'.", error
    else:
        assert error["message"].startswith("Invalid value at '"), error
    assert error.get("status") == "INVALID_ARGUMENT", error
    assert error["details"][0]["@type"] == "type.googleapis.com/google.rpc.BadRequest"
    assert discovery.take_violations(), "the refusal is also recorded, so a product that sends it fails its test"


def test_google_system_parameters_and_integer_enums_are_accepted(google):
    """What the google-cloud clients' REST transports send ($alt=json;enum-encoding=int, integer
    enums) and the system parameters every front end takes."""
    headers = {"Authorization": f"Bearer {OPERATOR_TOKEN}", "x-goog-user-project": P}
    region = requests.get(f"{COMPUTE}/regions/us-west1", headers=headers, verify=str(google.ca), timeout=30,
                          params={"$alt": "json;enum-encoding=int", "prettyPrint": "false", "fields": "quotas",
                                  "quotaUser": "me", "alt": "json", "$.xgafv": "2", "userIp": "10.0.0.1"})
    assert region.status_code == 200, region.text
    created = requests.post(f"{AR}?repositoryId=ints&%24alt=json%3Benum-encoding%3Dint", headers=headers,
                            json={"format": 1}, verify=str(google.ca), timeout=30)  # 1 is DOCKER.
    assert created.status_code == 200, created.text
    assert discovery.take_violations() == []


def test_a_quota_metric_compute_does_not_have_fails_the_response_check(google):
    """regions.get answers only Quota.metric's values (compute.v1.json): a world that grants
    NVIDIA_H100_GPUS there has invented a metric, and the test that reads it fails."""
    google.compute.state.region_quotas["us-west1"]["NVIDIA_H100_GPUS"] = (8.0, 0.0)
    try:
        answer = requests.get(f"{COMPUTE}/regions/us-west1", headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"},
                              verify=str(google.ca), timeout=30)
    finally:
        del google.compute.state.region_quotas["us-west1"]["NVIDIA_H100_GPUS"]
    assert answer.status_code == 200  # The answer goes out as it is; the test fails at teardown.
    found = discovery.take_violations()
    assert any("compute.regions.get" in v and ".metric' = \"NVIDIA_H100_GPUS\"" in v
               and "not one of Quota.metric's" in v for v in found), found


def test_the_response_check_names_what_the_world_invented():
    compute = discovery.api("compute.v1")
    call, refused = discovery.check("compute.v1", "GET", f"/compute/v1/projects/{P}/zones/us-west1-b/instances/vm-1",
                                    {}, None)
    assert refused is None and call.id == "compute.instances.get"
    found = compute.check_response(call, 200, {
        "name": "vm-1", "id": 7, "status": "WARMING", "scheduling": {"provisioningModel": "SPOT", "spotness": 1},
        "labels": {"a": "b"}, "disks": [{"diskSizeGb": "10"}]})
    assert discovery.take_violations() == found
    assert [f.split(" answer has ", 1)[1] for f in found] == [
        "'id' = 7: an uint64 is a JSON string of digits",
        "'status' = \"WARMING\": not one of Instance.status's 12 values "
        "['DEPROVISIONING', 'PENDING', 'PENDING_STOP', 'PROVISIONING', 'REPAIRING', 'RUNNING', 'STAGING', "
        "'STOPPED', 'STOPPING', 'SUSPENDED', 'SUSPENDING', 'TERMINATED']",
        "'scheduling.spotness' = 1: Scheduling has no field 'spotness'"]


def test_documents_load_once_per_process():
    assert discovery.api("compute.v1") is discovery.api("compute.v1")
    assert discovery.api("compute.v1").doc["revision"] == "20261106"  # The one the lock pins.
