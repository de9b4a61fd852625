"""The google provider's IAM, Storage and Artifact Registry resources of terraform/.

- google_storage_bucket against Cloud Storage's JSON API (the world's storage door): buckets.insert
  with project; delete lists the objects first and refuses a bucket that holds any unless
  force_destroy (provider source resource_storage_bucket.go: "Error trying to delete bucket ...
  containing objects without `force_destroy` set to true"), else deletes them, then the bucket.
- google_artifact_registry_repository against the Artifact Registry REST API
  (projects.locations.repositories create / get / delete, long-running operations); import by
  "projects/{{project}}/locations/{{location}}/repositories/{{repository_id}}".
- google_service_account, google_project_iam_custom_role and the bucket and repository IAM
  members compute what the provider returns (email, role id) without an IAM stand-in: the world
  has none yet, so their calls are not made (see the issue's "left undone").
"""

from __future__ import annotations

import time
import urllib.parse

from tests.world.provider.base import Resource
from tests.world.provider.google_api import ARTIFACTS, STORAGE, GoogleApiError, call, fail, not_found
from tests.world.provider.servicer import ProviderFailure


class ServiceAccount(Resource):
    type_name = "google_service_account"
    forces_new = ("account_id", "project")

    def create(self, planned):
        project = planned.get("project") or self.provider.config["project"]
        email = f"{planned['account_id']}@{project}.iam.gserviceaccount.com"
        return {**planned, "project": project, "email": email, "member": f"serviceAccount:{email}",
                "name": f"projects/{project}/serviceAccounts/{email}", "id": f"projects/{project}/serviceAccounts/{email}",
                "unique_id": "100000000000000000001", "disabled": bool(planned.get("disabled"))}

    def delete(self, state):
        pass


class CustomRole(Resource):
    type_name = "google_project_iam_custom_role"
    forces_new = ("role_id", "project")

    def create(self, planned):
        project = planned.get("project") or self.provider.config["project"]
        name = f"projects/{project}/roles/{planned['role_id']}"
        return {**planned, "project": project, "name": name, "id": name, "deleted": False,
                "stage": planned.get("stage") or "GA"}

    def delete(self, state):
        pass


class IamMember(Resource):
    def create(self, planned):
        return {**planned, "etag": "BwY=", "id": "/".join(str(planned.get(k)) for k in self.keys)}

    def delete(self, state):
        pass


class BucketIamMember(IamMember):
    type_name = "google_storage_bucket_iam_member"
    keys = ("bucket", "role", "member")
    forces_new = keys


class RepositoryIamMember(IamMember):
    type_name = "google_artifact_registry_repository_iam_member"
    keys = ("project", "location", "repository", "role", "member")
    forces_new = keys


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
