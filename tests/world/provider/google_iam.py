"""The google provider's IAM resources of terraform/, and how it lives with IAM's eventual consistency.

IAM is eventually consistent: a new service account or a policy change may not be seen at once
(https://cloud.google.com/iam/docs/overview#consistency). hashicorp/google (v7.45.0 source)
handles it in two places, and so does the stand-in:
- google_service_account (services/resourcemanager/resource_google_service_account.go,
  resourceGoogleServiceAccountCreate): after projects.serviceAccounts.create it reads the account
  until three reads in a row find it (transport PollingWaitTime with PollCheckForExistence: a
  404 reads again, any other error ends the wait, whose result the provider ignores; the SDK's
  StateChangeConf waits 0.5 s between reads, doubling after a miss, at most 10 s), magic-modules
  #14447 (github.com/GoogleCloudPlatform/magic-modules/pull/14447, "wait until we get 3
  consecutive successful responses from GetServiceAccount"); then it sleeps 10 s, magic-modules
  #10813 ("Add a sleep google_service_account to reduce the likelihood of eventual consistency
  errors"). The stand-in does not sleep: the world makes a new account visible to every service
  at one moment (tests/world/iam_api.py, the world's IAM delay), so the three reads are the wait,
  and 10 s more per `up` would buy nothing here.
- the *_iam_member resources (tpgiamresource/iam.go, iamPolicyReadModifyWrite): one writer per
  policy (a mutex keyed by the resource), read the policy, add or remove the member, write it;
  a 409 conflict starts over after a backoff (1 s, doubling, giving up past 30 s); after the write
  it reads the policy until three reads in a row hold the change, pausing before each read (1 s,
  doubling after a read that does not). The world's policy reads are consistent at once, so the
  stand-in pauses only after a read that missed the change.
Member bindings are read-modify-writes of one policy: the provider serialises them, or the
second setIamPolicy drops the first's member (iam.go: mutexKV.Lock(updater.GetMutexKey())).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict

from tests.world.provider.base import Resource
from tests.world.provider.google_api import (ARTIFACTS, COMPUTE, IAM, STORAGE, GoogleApiError, call, delete_at,
                                             fail, found_at, not_found)
from tests.world.provider.servicer import ProviderFailure

_POLICY_LOCKS: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)


def poll_until_consecutive(read, target: int = 3, timeout: float = 300) -> None:
    """The SDK's StateChangeConf with ContinuousTargetOccurence (terraform-plugin-sdk
    helper/retry/state.go, as RetryWithTargetOccurrences sets it: MinTimeout 0.5 s): ``read()``
    returns True (found), False (not yet: read again) or raises (the wait ends)."""
    deadline, wait, found = time.monotonic() + timeout, 0.0, 0
    while time.monotonic() < deadline:
        time.sleep(wait)
        found = found + 1 if read() else 0
        if found == target:
            return
        wait = min(max(wait * 2 if found == 0 else wait, 0.5), 10.0)


class ServiceAccount(Resource):
    """projects.serviceAccounts create / get / delete, and the wait for the new account."""
    type_name = "google_service_account"
    forces_new = ("account_id", "project")

    def url(self, state, email: str = "") -> str:
        project = state.get("project") or self.provider.config["project"]
        return f"{IAM}/projects/{project}/serviceAccounts" + (f"/{email}" if email else "")

    def create_request(self, planned):
        return "POST", self.url(planned), {"accountId": planned["account_id"], "serviceAccount": {
            "displayName": planned.get("display_name"), "description": planned.get("description")}}

    def create(self, planned):
        project = planned.get("project") or self.provider.config["project"]
        try:
            made = call(*self.create_request(planned))
        except GoogleApiError as error:
            raise fail("creating service account", error) from None

        def found() -> bool:
            try:
                call("GET", f"{IAM}/{made['name']}")
            except GoogleApiError as error:
                if not_found(error):
                    return False
                raise
            return True
        try:
            poll_until_consecutive(found)
        except GoogleApiError:
            pass  # The provider ignores how its wait ended (PollingWaitTime's result is dropped).
        email = made["email"]
        return {**planned, "project": project, "email": email, "member": f"serviceAccount:{email}",
                "name": made["name"], "id": made["name"], "unique_id": made["uniqueId"]}

    def read(self, state):
        return state if found_at(self.url(state, state["email"]), "service account") else None

    def delete(self, state):
        delete_at(self.url(state, state["email"]), "service account")


class CustomRole(Resource):
    """projects.roles get / create / undelete / patch / delete, as resource_google_project_iam_custom_role.go
    (hashicorp/terraform-provider-google, services/resourcemanager) does them. Its create first reads
    the role: a soft-deleted one (a role's id stays reserved after its delete, tests/world/iam_api.py) is
    undeleted and patched to the configuration ("This role was soft-deleted; update to match new
    state"), a live one fails ("Custom project role %s already exists and must be imported"), and only
    a 404 creates it."""
    type_name = "google_project_iam_custom_role"
    forces_new = ("role_id", "project")

    def _role(self, planned) -> dict:
        return {"title": planned["title"], "description": planned.get("description"),
                "includedPermissions": planned["permissions"], "stage": planned.get("stage") or "GA"}

    def create_request(self, planned):
        project = planned.get("project") or self.provider.config["project"]
        return "POST", f"{IAM}/projects/{project}/roles", {"roleId": planned["role_id"], "role": self._role(planned)}

    def create(self, planned):
        project = planned.get("project") or self.provider.config["project"]
        name = f"projects/{project}/roles/{planned['role_id']}"
        try:
            found = call("GET", f"{IAM}/{name}")
        except GoogleApiError as error:
            if not not_found(error):
                raise ProviderFailure(f"Unable to verify whether custom project role {name} already exists and "
                                      f"must be undeleted: {error}") from None
            found = None
        if found is not None and not found.get("deleted"):
            raise ProviderFailure(f"Custom project role {name} already exists and must be imported")
        try:
            if found is not None:  # resourceGoogleProjectIamCustomRoleUpdate: undelete, then patch.
                call("POST", f"{IAM}/{name}:undelete", {})
                call("PATCH", f"{IAM}/{name}", self._role(planned))
            else:
                name = call(*self.create_request(planned))["name"]
        except GoogleApiError as error:
            verb = "undeleting" if found is not None else "creating"
            raise fail(f"{verb} the custom project role {planned['title']}", error) from None
        return {**planned, "project": project, "name": name, "id": name, "deleted": False}

    def read(self, state):
        return state if found_at(f"{IAM}/{state['name']}", "custom role") else None

    def delete(self, state):
        delete_at(f"{IAM}/{state['name']}", "custom role")


class PolicyMember(Resource):
    """One member of one role in a resource's IAM policy, by read-modify-write (module docstring).
    Subclasses name the policy: _url, _policy (read), _write."""
    keys: tuple = ()
    what = ""  # as the provider's error names the resource: "storage bucket", "repository", ...

    def _url(self, state) -> str:
        raise NotImplementedError

    def _policy(self, state) -> dict:
        raise NotImplementedError

    def _write(self, state, policy: dict) -> None:
        raise NotImplementedError

    @staticmethod
    def _holds(policy: dict, state: dict) -> bool:
        return any(state["member"] in b.get("members", []) for b in policy.get("bindings", [])
                   if b["role"] == state["role"])

    def _change(self, state, add: bool) -> None:
        backoff = 1.0
        with _POLICY_LOCKS[self._url(state)]:
            while True:
                policy = self._policy(state)
                bindings = [dict(b) for b in policy.get("bindings", [])]
                binding = next((b for b in bindings if b["role"] == state["role"]), None)
                if binding is None:
                    bindings.append(binding := {"role": state["role"], "members": []})
                members = set(binding["members"])
                binding["members"] = sorted(members | {state["member"]} if add else members - {state["member"]})
                try:
                    self._write(state, {**policy, "bindings": [b for b in bindings if b["members"]]})
                    break
                except GoogleApiError as error:
                    if error.status != 409 or backoff > 30:
                        raise
                    time.sleep(backoff)
                    backoff *= 2
            pause, held = 0.0, 0
            while held < 3:
                time.sleep(pause)
                if self._holds(self._policy(state), state) == add:
                    held += 1
                else:
                    pause = max(1.0, pause * 2)
                    if pause > 30:  # iam.go: maxBackoffSeconds
                        raise ProviderFailure(f"Error applying IAM policy to {self.what} {self.resource_name(state)}: "
                                              "Waited too long for propagation.")

    def create_request(self, planned):
        return "POST", self._url(planned), {"role": planned["role"], "member": planned["member"]}

    def create(self, planned):
        try:
            self._change(planned, add=True)
        except GoogleApiError as error:
            raise fail(f"applying IAM policy for {self.what} {self.resource_name(planned)}", error) from None
        return {**planned, **self.computed(planned), "etag": "BwY="}

    def resource_name(self, state) -> str:
        return state[self.keys[-3]]

    def computed(self, planned) -> dict:
        return {"id": "/".join(str(planned.get(k)) for k in self.keys)}

    def read(self, state):
        try:
            policy = self._policy(state)
        except GoogleApiError as error:
            if not_found(error):
                return None
            raise fail("reading IAM policy", error) from None
        return state if self._holds(policy, state) else None

    def delete(self, state):
        try:
            self._change(state, add=False)
        except GoogleApiError as error:
            if not not_found(error):
                raise fail("removing IAM policy member", error) from None


class BucketIamMember(PolicyMember):
    """iam_storage_bucket.go: buckets.getIamPolicy / setIamPolicy (GET and PUT /b/B/iam)."""
    type_name = "google_storage_bucket_iam_member"
    keys = ("bucket", "role", "member")
    forces_new = keys
    what = "storage bucket"

    def _url(self, state) -> str:
        return f"{STORAGE}/b/{state['bucket']}/iam"

    def _policy(self, state) -> dict:
        return call("GET", self._url(state))

    def _write(self, state, policy: dict) -> None:
        call("PUT", self._url(state), {"bindings": policy["bindings"]})


class RepositoryIamMember(PolicyMember):
    """iam_artifact_registry_repository.go: GET :getIamPolicy, POST :setIamPolicy {"policy"}."""
    type_name = "google_artifact_registry_repository_iam_member"
    keys = ("project", "location", "repository", "role", "member")
    forces_new = keys
    what = "repository"

    def _url(self, state) -> str:
        project = state.get("project") or self.provider.config["project"]
        return f"{ARTIFACTS}/projects/{project}/locations/{state['location']}/repositories/{state['repository']}"

    def _policy(self, state) -> dict:
        return call("GET", self._url(state) + ":getIamPolicy")

    def _write(self, state, policy: dict) -> None:
        call("POST", self._url(state) + ":setIamPolicy", {"policy": {"bindings": policy["bindings"]}})


class InstanceIamMember(PolicyMember):
    """iam_compute_instance.go: instances.getIamPolicy / setIamPolicy {"policy"} with its etag."""
    type_name = "google_compute_instance_iam_member"
    keys = ("instance_name", "role", "member")
    forces_new = ("instance_name", "zone", "role", "member", "project")
    what = "compute instance"

    def _url(self, state) -> str:
        project = state.get("project") or self.provider.config["project"]
        zone = state.get("zone") or self.provider.config["zone"]
        return f"{COMPUTE}/projects/{project}/zones/{zone}/instances/{state['instance_name']}"

    def _policy(self, state) -> dict:
        return call("GET", self._url(state) + "/getIamPolicy")

    def _write(self, state, policy: dict) -> None:
        call("POST", self._url(state) + "/setIamPolicy", {"policy": {"bindings": policy["bindings"],
                                                                    "etag": policy.get("etag")}})

    def resource_name(self, state) -> str:
        return state["instance_name"]

    def computed(self, planned) -> dict:
        project = planned.get("project") or self.provider.config["project"]
        zone = planned.get("zone") or self.provider.config["zone"]
        return {"project": project, "zone": zone,
                "id": f"projects/{project}/zones/{zone}/instances/{planned['instance_name']}/{planned['role']}/"
                      f"{planned['member']}"}
