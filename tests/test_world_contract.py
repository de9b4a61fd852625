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
VERTEX = f"https://us-central1-aiplatform.googleapis.com/v1/projects/{P}/locations/us-central1"
UNKNOWN_FIELD = "Invalid JSON payload received. Unknown name \"bogus\""


# One worker runs the module in file order on its module-scoped world (tests/scheduling.py).
pytestmark = pytest.mark.xdist_group("world_contract")


@pytest.fixture(scope="module")
def google(module_world):
    return module_world


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
    "aiplatform": (("POST", f"{VERTEX}/customJobs", {"displayName": "j", "bogus": 1}),
                   ("POST", f"{VERTEX}/customJobs", {"displayName": "j", "jobSpec": {"scheduling": {"strategy": "BOGUS"}}})),
    "logging": (("POST", "https://logging.googleapis.com/v2/entries:list", {"resourceNames": [f"projects/{P}"], "bogus": 1}),
                ("POST", "https://logging.googleapis.com/v2/entries:list?%24.xgafv=7", {"resourceNames": [f"projects/{P}"]})),
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


# ---------------------------------------------------------------- lists and operations


def test_the_products_compute_lists_read_every_page(google, monkeypatch):
    """A server may return fewer items than asked (AIP-158): with one item a page, the product's
    lists (google-cloud-compute's pagers) still find every instance and every leftover."""
    from tfcluster.backends import gcp

    for key, value in google.env().items():
        monkeypatch.setenv(key, value)
    state = google.compute.state
    state.page_limit = 1
    for index in range(3):
        state.instances[f"c-{index}"] = {"zone": "us-west1-b", "labels": {"tfcluster-cluster": "c"},
                                         "status": "RUNNING", "guest": {}}
    state.instances["other-0"] = {"zone": "us-west1-b", "labels": {}, "status": "RUNNING", "guest": {}}
    state.others["disks"] = {"c-0", "c-1", "c-2"}
    api = gcp.ComputeApi(state.project)
    assert sorted(vm.name for vm in api.list_cluster("us-west1-b", "c")) == ["c-0", "c-1", "c-2"]
    assert api.leftovers("us-west1-b", "c") == ["instance c-0", "instance c-1", "instance c-2",
                                                 "disk c-0", "disk c-1", "disk c-2"]
    pages = [r["query"].get("pageToken") for r in state.requests if r["path"].endswith("/zones/us-west1-b/instances")
             and r["query"].get("filter") == ["labels.tfcluster-cluster=c"]]
    assert pages[:3] == [None, ["p1"], ["p2"]], pages
    state.page_limit = 500
    for name in ("c-0", "c-1", "c-2", "other-0"):
        state.instances.pop(name)
    state.others["disks"] = set()


@pytest.mark.parametrize("expression", ["lables.tfcluster-cluster=c", "labels.tfcluster-cluster",
                                        "status eq RUNNING AND name eq c-0", "(name = c-0"])
def test_an_unparseable_filter_is_googles_400(google, expression):
    answer = requests.get(f"{COMPUTE}/zones/us-west1-b/instances", params={"filter": expression},
                          headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}, verify=str(google.ca), timeout=30)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["message"] == (f"Invalid value for field 'filter': '{expression}'. "
                                                 "Invalid list filter expression.")
    assert answer.json()["error"]["errors"][0]["reason"] == "invalid"


def test_a_change_applies_when_its_operation_is_done_and_a_second_waits(google):
    """setMetadata takes effect at DONE, and a change asked while one runs is 400 resourceNotReady."""
    state = google.compute.state
    state.instances["ops-0"] = {"zone": "us-west1-b", "labels": {}, "status": "RUNNING", "guest": {},
                                "metadata": {"a": "1"}}
    state.other_seconds = 60.0  # Long enough to look at it running.
    headers = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    url = f"{COMPUTE}/zones/us-west1-b/instances/ops-0"
    try:
        fingerprint = requests.get(url, headers=headers, verify=str(google.ca), timeout=30).json()["metadata"]["fingerprint"]
        change = {"fingerprint": fingerprint, "items": [{"key": "a", "value": "2"}]}
        first = requests.post(f"{url}/setMetadata", json=change, headers=headers, verify=str(google.ca), timeout=30)
        assert first.status_code == 200 and first.json()["status"] == "PENDING", first.text
        seen = requests.get(url, headers=headers, verify=str(google.ca), timeout=30).json()["metadata"]
        assert seen["items"] == [{"key": "a", "value": "1"}] and seen["fingerprint"] == fingerprint  # Not yet.
        second = requests.post(f"{url}/setLabels", json={"labels": {"b": "c"}, "labelFingerprint": "x"},
                               headers=headers, verify=str(google.ca), timeout=30)
        assert second.status_code == 400, second.text
        assert second.json()["error"]["errors"][0]["reason"] == "resourceNotReady"
        assert second.json()["error"]["message"] == \
            "The resource 'projects/demo-project/zones/us-west1-b/instances/ops-0' is not ready"
        state.operations[first.json()["name"]]["done_at"] = 0.0  # Its time has come.
        done = requests.get(f"{COMPUTE}/zones/us-west1-b/operations/{first.json()['name']}", headers=headers,
                            verify=str(google.ca), timeout=30).json()
        assert done["status"] == "DONE"
        seen = requests.get(url, headers=headers, verify=str(google.ca), timeout=30).json()["metadata"]
        assert seen["items"] == [{"key": "a", "value": "2"}] and seen["fingerprint"] != fingerprint
    finally:
        state.other_seconds = 0.3
        state.instances.pop("ops-0")


def test_the_products_bucket_reads_read_every_page(google, monkeypatch, tmp_path):
    """objects.list pages at the storage door (the emulator does not): with one object a page,
    the product's download of a prefix (google-cloud-storage's iterator) finds every object."""
    from tfcluster.backends.gcp.cloud import storage as gcs

    for key, value in google.env().items():
        monkeypatch.setenv(key, value)
    client = gcs.client(P)
    bucket = client.create_bucket("paged-bucket")
    for index in range(3):
        bucket.blob(f"runs/r/{index}.txt").upload_from_string(str(index))
    google.storage_proxy.page_limit = 1
    try:
        got = gcs.download_prefix(client, "gs://paged-bucket/runs/r", tmp_path / "down")
    finally:
        google.storage_proxy.page_limit = 1000
    assert sorted(path.name for path in got) == ["0.txt", "1.txt", "2.txt"]
    assert sum(1 for method, path, _, _ in google.storage_proxy.log
               if method == "GET" and path == "/storage/v1/b/paged-bucket/o") >= 3
