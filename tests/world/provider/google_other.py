"""The google provider's IAM, Storage and Artifact Registry resources of terraform/.

- google_storage_bucket against Cloud Storage's JSON API (the world's storage door): buckets.insert
  with project; delete lists the objects first and refuses a bucket that holds any unless
  force_destroy (provider source resource_storage_bucket.go: "Error trying to delete bucket ...
  containing objects without `force_destroy` set to true"), else deletes them, then the bucket.
- google_artifact_registry_repository against the Artifact Registry REST API
  (projects.locations.repositories create / get / delete, long-running operations); import by
  "projects/{{project}}/locations/{{location}}/repositories/{{repository_id}}".
- google_storage_bucket_iam_member through buckets.getIamPolicy / setIamPolicy (the world's storage
  door holds the policy and grants by it).
- google_service_account and google_project_iam_custom_role through IAM's REST API
  (tests/world/iam_api.py).
- google_artifact_registry_repository_iam_member through repositories.getIamPolicy / setIamPolicy, a
  read-modify-write of the repository's policy as for the bucket (provider source
  iam_artifact_registry_repository.go: GetResourceIamPolicy / SetResourceIamPolicy).
"""

from __future__ import annotations

import threading
import time
import urllib.parse
from collections import defaultdict

from tests.world.provider.base import Resource
from tests.world.provider.google_api import ARTIFACTS, IAM, STORAGE, GoogleApiError, call, fail, not_found
from tests.world.provider.servicer import ProviderFailure


class ServiceAccount(Resource):
    """projects.serviceAccounts create / get / delete (resource_google_service_account.go)."""
    type_name = "google_service_account"
    forces_new = ("account_id", "project")

    def url(self, state, email: str = "") -> str:
        project = state.get("project") or self.provider.config["project"]
        return f"{IAM}/projects/{project}/serviceAccounts" + (f"/{email}" if email else "")

    def create(self, planned):
        project = planned.get("project") or self.provider.config["project"]
        try:
            made = call("POST", self.url(planned), {"accountId": planned["account_id"], "serviceAccount": {
                "displayName": planned.get("display_name"), "description": planned.get("description")}})
        except GoogleApiError as error:
            raise fail("creating service account", error) from None
        email = made["email"]
        return {**planned, "project": project, "email": email, "member": f"serviceAccount:{email}",
                "name": made["name"], "id": made["name"], "unique_id": made["uniqueId"]}

    def read(self, state):
        try:
            call("GET", self.url(state, state["email"]))
        except GoogleApiError as error:
            if not_found(error):
                return None
            raise fail("reading service account", error) from None
        return state

    def delete(self, state):
        try:
            call("DELETE", self.url(state, state["email"]))
        except GoogleApiError as error:
            if not not_found(error):
                raise fail("deleting service account", error) from None


class CustomRole(Resource):
    """projects.roles create / get / delete (resource_google_project_iam_custom_role.go)."""
    type_name = "google_project_iam_custom_role"
    forces_new = ("role_id", "project")

    def create(self, planned):
        project = planned.get("project") or self.provider.config["project"]
        try:
            made = call("POST", f"{IAM}/projects/{project}/roles", {"roleId": planned["role_id"], "role": {
                "title": planned["title"], "description": planned.get("description"),
                "includedPermissions": planned["permissions"], "stage": planned.get("stage") or "GA"}})
        except GoogleApiError as error:
            raise fail(f"creating the custom project role {planned['title']}", error) from None
        return {**planned, "project": project, "name": made["name"], "id": made["name"], "deleted": False}

    def read(self, state):
        try:
            call("GET", f"{IAM}/{state['name']}")
        except GoogleApiError as error:
            if not_found(error):
                return None
            raise fail("reading custom role", error) from None
        return state

    def delete(self, state):
        try:
            call("DELETE", f"{IAM}/{state['name']}")
        except GoogleApiError as error:
            if not not_found(error):
                raise fail("deleting custom role", error) from None


class IamMember(Resource):
    def create(self, planned):
        return {**planned, "etag": "BwY=", "id": "/".join(str(planned.get(k)) for k in self.keys)}

    def delete(self, state):
        pass


# Terraform applies independent resources at once (one provider process, one gRPC thread each),
# and two members of one bucket are a read-modify-write of one policy: the provider serialises
# them with a mutex per policy (tpgiamresource/iam.go, iamPolicyReadModifyWrite:
# mutexKV.Lock(updater.GetMutexKey())), or the second setIamPolicy drops the first's member.
_POLICY_LOCKS: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)


class BucketIamMember(IamMember):
    """As the provider's iam_storage_bucket.go: read the bucket's policy, add or remove the member
    in the role's binding, write it back (buckets.getIamPolicy / setIamPolicy), one writer per
    bucket at a time."""
    type_name = "google_storage_bucket_iam_member"
    keys = ("bucket", "role", "member")
    forces_new = keys
    what = "storage bucket"

    def _url(self, state) -> str:
        return f"{STORAGE}/b/{state['bucket']}/iam"

    def _bindings(self, state) -> list[dict]:
        return call("GET", self._url(state)).get("bindings", [])

    def _write(self, state, bindings: list[dict]) -> None:
        call("PUT", self._url(state), {"bindings": bindings})

    def _change(self, state, add: bool) -> None:
        with _POLICY_LOCKS[self._url(state)]:
            bindings = [dict(b) for b in self._bindings(state)]
            binding = next((b for b in bindings if b["role"] == state["role"]), None)
            if binding is None:
                bindings.append(binding := {"role": state["role"], "members": []})
            members = set(binding["members"])
            binding["members"] = sorted(members | {state["member"]} if add else members - {state["member"]})
            self._write(state, [b for b in bindings if b["members"]])

    def create(self, planned):
        try:
            self._change(planned, add=True)
        except GoogleApiError as error:
            raise fail(f"applying IAM policy for {self.what} {planned[self.keys[-3]]}", error) from None
        return super().create(planned)

    def read(self, state):
        try:
            bindings = self._bindings(state)
        except GoogleApiError as error:
            if not_found(error):
                return None
            raise fail("reading IAM policy", error) from None
        held = any(state["member"] in b["members"] for b in bindings if b["role"] == state["role"])
        return state if held else None

    def delete(self, state):
        try:
            self._change(state, add=False)
        except GoogleApiError as error:
            if not not_found(error):
                raise fail("removing IAM policy member", error) from None


class RepositoryIamMember(BucketIamMember):
    """As iam_artifact_registry_repository.go: the same read-modify-write, on the repository's
    policy (GET :getIamPolicy, POST :setIamPolicy {"policy"})."""
    type_name = "google_artifact_registry_repository_iam_member"
    keys = ("project", "location", "repository", "role", "member")
    forces_new = keys
    what = "repository"

    def _url(self, state) -> str:
        project = state.get("project") or self.provider.config["project"]
        return f"{ARTIFACTS}/projects/{project}/locations/{state['location']}/repositories/{state['repository']}"

    def _bindings(self, state) -> list[dict]:
        return call("GET", self._url(state) + ":getIamPolicy").get("bindings", [])

    def _write(self, state, bindings: list[dict]) -> None:
        call("POST", self._url(state) + ":setIamPolicy", {"policy": {"bindings": bindings}})


class Bucket(Resource):
    type_name = "google_storage_bucket"
    forces_new = ("name", "location", "project")

    def create(self, planned):
        project = planned.get("project") or self.provider.config["project"]
        body = {"name": planned["name"], "location": planned["location"], "labels": planned.get("labels") or {},
                "versioning": {"enabled": bool((planned.get("versioning") or [{}])[0].get("enabled"))},
                "iamConfiguration": {"uniformBucketLevelAccess": {"enabled": True},
                                     "publicAccessPrevention": planned.get("public_access_prevention")}}
        try:
            call("POST", f"{STORAGE}/b?project={project}", body)
        except GoogleApiError as error:
            raise fail(f"creating bucket {planned['name']}", error) from None
        return {**planned, "project": project, "id": planned["name"], "url": f"gs://{planned['name']}",
                "self_link": f"https://www.googleapis.com/storage/v1/b/{planned['name']}",
                "storage_class": planned.get("storage_class") or "STANDARD", "project_number": 1}

    def read(self, state):
        try:
            call("GET", f"{STORAGE}/b/{state['name']}")
        except GoogleApiError as error:
            if not_found(error):
                return None
            raise fail(f"reading bucket {state['name']}", error) from None
        return state

    def update(self, prior, planned):
        return planned  # force_destroy lives in the state only, as in the provider.

    def delete(self, state):
        name = state["name"]
        listing = call("GET", f"{STORAGE}/b/{name}/o?versions=true").get("items", [])
        if listing and not state.get("force_destroy"):
            raise ProviderFailure(f"Error trying to delete bucket {name} containing objects without "
                                  "`force_destroy` set to true")
        for item in listing:
            call("DELETE", f"{STORAGE}/b/{name}/o/{urllib.parse.quote(item['name'], safe='')}")
        try:
            call("DELETE", f"{STORAGE}/b/{name}")
        except GoogleApiError as error:
            if not not_found(error):
                raise fail(f"deleting bucket {name}", error) from None


class Repository(Resource):
    type_name = "google_artifact_registry_repository"
    forces_new = ("repository_id", "location", "format", "project")

    def name(self, state):
        project = state.get("project") or self.provider.config["project"]
        return f"projects/{project}/locations/{state['location']}/repositories/{state['repository_id']}"

    def create(self, planned):
        name = self.name(planned)
        parent, _, repository_id = name.rpartition("/repositories/")
        try:
            operation = call("POST", f"{ARTIFACTS}/{parent}/repositories?repositoryId={repository_id}", {
                "format": planned["format"], "description": planned.get("description"),
                "labels": planned.get("labels") or {}})
        except GoogleApiError as error:
            raise fail("creating Repository", error) from None
        deadline = time.monotonic() + 60
        while not operation.get("done") and time.monotonic() < deadline:
            time.sleep(0.2)
            operation = call("GET", f"{ARTIFACTS}/{operation['name']}")
        return self._state(planned, name)

    def _state(self, planned, name):
        return {**planned, "project": name.split("/")[1], "name": name.rsplit("/", 1)[1], "id": name,
                "mode": planned.get("mode") or "STANDARD_REPOSITORY", "create_time": "2026-11-22T20:00:00Z",
                "update_time": "2026-11-22T20:00:00Z", "effective_labels": planned.get("labels") or {},
                "terraform_labels": planned.get("labels") or {}}

    def read(self, state):
        try:
            call("GET", f"{ARTIFACTS}/{self.name(state)}")
        except GoogleApiError as error:
            if not_found(error):
                return None
            raise fail("reading Repository", error) from None
        return state

    def delete(self, state):
        try:
            call("DELETE", f"{ARTIFACTS}/{self.name(state)}")
        except GoogleApiError as error:
            if not not_found(error):
                raise fail("deleting Repository", error) from None

    def import_(self, import_id):
        try:
            found = call("GET", f"{ARTIFACTS}/{import_id}")
        except GoogleApiError as error:
            raise fail("importing Repository", error) from None
        parts = import_id.split("/")
        return self._state({"repository_id": parts[5], "location": parts[3], "format": found.get("format"),
                            "labels": found.get("labels"), "description": found.get("description")}, import_id)
