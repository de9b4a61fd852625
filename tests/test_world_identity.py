"""Identity as Google has it, in every stand-in (tests/world/compute_auth.py): an unknown token is
401 everywhere, a token carries scopes and a call they do not cover is 403, tokens expire and the
google clients refresh them, and IAM changes take effect after the world's delay."""

from __future__ import annotations

import time

import pytest
import requests

from tests.conftest import wait_for
from tests.world import compute_auth, discovery
from tests.world.compute_auth import OPERATOR_TOKEN, token_for
from tests.world.iam_api import create_account

P = "demo-project"
COMPUTE = f"https://compute.googleapis.com/compute/v1/projects/{P}"
# One ordinary read per stand-in (the storage door's JSON and XML APIs both).
READS = {
    "compute": f"{COMPUTE}/regions/us-west1",
    "iam": f"https://iam.googleapis.com/v1/projects/{P}/serviceAccounts",
    "artifactregistry": f"https://artifactregistry.googleapis.com/v1/projects/{P}/locations/us-west1/repositories/r",
    "cloudbilling": "https://cloudbilling.googleapis.com/v1/services",
    "serviceusage": f"https://serviceusage.googleapis.com/v1/projects/{P}/services:batchGet"
                    f"?names=projects/{P}/services/compute.googleapis.com",
    "orgpolicy": f"https://orgpolicy.googleapis.com/v2/projects/{P}/policies/compute.requireOsLogin:getEffectivePolicy",
    "oslogin": "https://oslogin.googleapis.com/v1/users/operator@example.com/loginProfile",
    "storage JSON API": "https://storage.googleapis.com/storage/v1/b/some-bucket",
    "storage XML API": "https://storage.googleapis.com/some-bucket/some-object",
}


# One worker runs the module in file order on its module-scoped world (tests/scheduling.py).
pytestmark = pytest.mark.xdist_group("world_identity")


@pytest.fixture(scope="module")
def google(module_world):
    return module_world


def get(google, url: str, token: str) -> requests.Response:
    return requests.get(url, headers={"Authorization": f"Bearer {token}", "x-goog-user-project": P},
                        verify=str(google.ca), timeout=30)


@pytest.mark.parametrize("stand_in", sorted(READS))
def test_an_unknown_token_is_refused_everywhere(google, stand_in):
    answer = get(google, READS[stand_in], "ya29.garbage")
    assert answer.status_code == 401, answer.text
    assert answer.json()["error"]["message"] in (
        "Invalid Credentials", "Request had invalid authentication credentials. Expected OAuth 2 access token, "
        "login cookie or other valid authentication credential. See "
        "https://developers.google.com/identity/sign-in/web/devconsole-project.")
    assert get(google, READS[stand_in], OPERATOR_TOKEN).status_code != 401  # The same read, signed in.


def test_a_vm_token_carries_its_instances_scopes(google):
    """The metadata server hands a VM a token with its instance's scopes: storage-rw alone lets it
    write objects but not call Compute, whatever IAM grants it."""
    state = google.compute.state
    email = f"narrow-vm@{P}.iam.gserviceaccount.com"
    create_account(state, P, "narrow-vm", {})
    state.account_visible_at[email] = 0.0  # Propagated (the delay has its own test).
    state.instances["narrow-0"] = {
        "zone": "us-west1-b", "labels": {}, "status": "RUNNING", "guest": {},
        "iam_bindings": [{"role": "roles/compute.instanceAdmin.v1", "members": [f"serviceAccount:{email}"]}],
        "body": {"serviceAccounts": [{"email": email,
                                      "scopes": ["https://www.googleapis.com/auth/devstorage.read_write"]}]}}
    try:
        answer = get(google, f"{COMPUTE}/zones/us-west1-b/instances/narrow-0", token_for(email))
        assert answer.status_code == 403, answer.text
        error = answer.json()["error"]
        assert error["message"] == "Request had insufficient authentication scopes."
        assert error["details"][0]["reason"] == "ACCESS_TOKEN_SCOPE_INSUFFICIENT"
        assert error["details"][0]["metadata"]["method"] == "compute.v1.InstancesService.Get"
        # Cloud Storage takes the same token: the scope covers it, and IAM decides (no role: 403).
        stored = get(google, "https://storage.googleapis.com/storage/v1/b/no-such-bucket", token_for(email))
        assert stored.status_code == 403 and "does not have storage.buckets.get access" in stored.text, stored.text
        # cloud-platform covers Compute: the same instance with it, and IAM's grant is enough.
        state.instances["narrow-0"]["body"]["serviceAccounts"][0]["scopes"] = [compute_auth.CLOUD_PLATFORM]
        assert get(google, f"{COMPUTE}/zones/us-west1-b/instances/narrow-0", token_for(email)).status_code == 200
    finally:
        state.instances.pop("narrow-0")


def test_tokens_expire_and_the_google_clients_refresh_them(google, monkeypatch):
    from google.auth.transport.requests import AuthorizedSession
    from google.oauth2 import service_account

    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(google.ca))  # google-auth's own refresh requests too.
    state = google.compute.state
    state.token_lifetime = 2.0  # The world's lifetime: google-auth refreshes ahead of expiry.
    try:
        credentials = service_account.Credentials.from_service_account_file(
            str(google.credentials), scopes=[compute_auth.CLOUD_PLATFORM])
        session = AuthorizedSession(credentials)
        session.verify = str(google.ca)
        assert session.get(READS["compute"], timeout=30).status_code == 200
        first = credentials.token
        assert state.issued[first][2] - time.time() <= 2.0
        wait_for(lambda: get(google, READS["compute"], first).status_code == 401, 10, what="the token to expire")
        assert session.get(READS["compute"], timeout=30).status_code == 200  # Refreshed, not refused.
        assert credentials.token != first
    finally:
        state.token_lifetime = 3600.0


def test_a_new_account_and_a_grant_take_effect_after_iams_delay(google):
    state = google.compute.state
    state.iam_delay_seconds = 3.0
    email = f"late-vm@{P}.iam.gserviceaccount.com"
    try:
        created = requests.post(f"https://iam.googleapis.com/v1/projects/{P}/serviceAccounts", json={"accountId": "late-vm"},
                                headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}, verify=str(google.ca), timeout=30)
        assert created.status_code == 200, created.text
        account = f"https://iam.googleapis.com/v1/projects/{P}/serviceAccounts/{email}"
        assert get(google, account, OPERATOR_TOKEN).status_code == 404  # Not yet, as the provider meets it.
        assert get(google, READS["storage JSON API"], token_for(email)).status_code == 401
        wait_for(lambda: get(google, account, OPERATOR_TOKEN).status_code == 200, 10, what="IAM to show the account")
        # A grant on an instance: read back at once, enforced after the delay.
        state.instances["late-0"] = {"zone": "us-west1-b", "labels": {}, "status": "RUNNING", "guest": {}}
        policy = {"policy": {"bindings": [{"role": "roles/compute.viewer", "members": [f"serviceAccount:{email}"]}]}}
        granted = requests.post(f"{COMPUTE}/zones/us-west1-b/instances/late-0/setIamPolicy", json=policy,
                                headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}, verify=str(google.ca), timeout=30)
        assert granted.status_code == 200, granted.text
        instance = f"{COMPUTE}/zones/us-west1-b/instances/late-0"
        assert get(google, instance, token_for(email)).status_code == 403
        wait_for(lambda: get(google, instance, token_for(email)).status_code == 200, 10, what="the grant to apply")
    finally:
        state.iam_delay_seconds = 0.5
        state.instances.pop("late-0", None)
    assert discovery.take_violations() == []
