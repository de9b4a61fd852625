"""The google provider's Storage and Artifact Registry resources of terraform/ (IAM: google_iam.py).

- google_storage_bucket against Cloud Storage's JSON API (the world's storage door): buckets.insert
  with project; delete lists the objects first and refuses a bucket that holds any unless
  force_destroy (provider source resource_storage_bucket.go: "Error trying to delete bucket ...
  containing objects without `force_destroy` set to true"), else deletes them, then the bucket.
- google_artifact_registry_repository against the Artifact Registry REST API
  (projects.locations.repositories create / get / delete, long-running operations); import by
  "projects/{{project}}/locations/{{location}}/repositories/{{repository_id}}".
- Labels are the provider's effective labels (base.py labels_plan).
"""

from __future__ import annotations

import time
import urllib.parse

from tests.world.provider.base import Resource, labels_plan
from tests.world.provider.instance_body import ATTRIBUTION
from tests.world.provider.google_api import ARTIFACTS, STORAGE, GoogleApiError, call, delete_at, fail, found_at
from tests.world.provider.servicer import ProviderFailure


def lifecycle_rule(rule: dict) -> dict:
    """expandStorageBucketLifecycleRule with its action and condition (resource_storage_bucket.go),
    through storage.BucketLifecycleRuleCondition: zero values are left out, except where a
    send_*_if_zero flag says otherwise; with_state LIVE/ARCHIVED is isLive true/false."""
    action = ((rule.get("action") or [{}])[0]) or {}
    condition = ((rule.get("condition") or [{}])[0]) or {}
    out = {"action": {k: v for k, v in (("type", action.get("type")), ("storageClass", action.get("storage_class")))
                      if v}}
    sent = {}
    age = int(condition.get("age") or 0)
    if age > 0 or condition.get("send_age_if_zero"):
        sent["age"] = age
    state = condition.get("with_state") or ""
    if state in ("LIVE", "ARCHIVED"):
        sent["isLive"] = state == "LIVE"
    elif state not in ("ANY", ""):
        raise ProviderFailure(f"unexpected value {state!r} for condition.with_state")
    for name, key in (("created_before", "createdBefore"), ("custom_time_before", "customTimeBefore"),
                      ("noncurrent_time_before", "noncurrentTimeBefore")):
        if condition.get(name):
            sent[key] = condition[name]
    for name, key in (("num_newer_versions", "numNewerVersions"), ("days_since_custom_time", "daysSinceCustomTime"),
                      ("days_since_noncurrent_time", "daysSinceNoncurrentTime")):
        if condition.get(name) or condition.get(f"send_{name}_if_zero"):
            sent[key] = int(condition.get(name) or 0)
    for name, key in (("matches_storage_class", "matchesStorageClass"), ("matches_prefix", "matchesPrefix"),
                      ("matches_suffix", "matchesSuffix")):
        if condition.get(name):
            sent[key] = list(condition[name])
    for name, key in (("size_above_bytes", "sizeAboveBytes"), ("size_below_bytes", "sizeBelowBytes")):
        if condition.get(name):
            sent[key] = int(condition[name])
    out["condition"] = sent
    return out


class Bucket(Resource):
    type_name = "google_storage_bucket"
    forces_new = ("name", "location", "project")

    def plan_create(self, planned):
        return {**planned, **labels_plan(planned, None)}

    def plan_update(self, prior, proposed, replacing):
        return {**proposed, **labels_plan(proposed, prior)}

    def create_request(self, planned):
        """resourceStorageBucketCreate (resource_storage_bucket.go): name, effective labels,
        location, expandIamConfiguration (uniformBucketLevelAccess always sent), the lifecycle
        (expandStorageBucketLifecycle: "rule": [] when there is none), versioning when set, and
        storage_class when set; through storage.Bucket, so zero values are left out."""
        project = planned.get("project") or self.provider.config["project"]
        body = {"name": planned["name"], "location": planned["location"],
                "iamConfiguration": {"uniformBucketLevelAccess": {
                    "enabled": bool(planned.get("uniform_bucket_level_access"))}},
                "lifecycle": {"rule": [lifecycle_rule(rule) for rule in planned.get("lifecycle_rule") or []]}}
        if planned.get("effective_labels"):
            body["labels"] = dict(planned["effective_labels"])
        if planned.get("public_access_prevention"):
            body["iamConfiguration"]["publicAccessPrevention"] = planned["public_access_prevention"]
        if planned.get("storage_class"):
            body["storageClass"] = planned["storage_class"]
        if planned.get("versioning"):
            body["versioning"] = {"enabled": bool((planned["versioning"][0] or {}).get("enabled"))}
        for name in ("autoclass", "website", "retention_policy", "cors", "logging", "encryption", "requester_pays",
                     "custom_placement_config", "rpo", "soft_delete_policy", "hierarchical_namespace", "ip_filter"):
            if planned.get(name):
                raise ProviderFailure(f"Error creating bucket: google_storage_bucket.{name} is set, and the "
                                      "provider stand-in does not expand it (tests/world/provider/google_other.py)")
        return "POST", f"{STORAGE}/b?project={project}", body

    def create(self, planned):
        project = planned.get("project") or self.provider.config["project"]
        try:
            call(*self.create_request(planned))
        except GoogleApiError as error:
            raise fail(f"creating bucket {planned['name']}", error) from None
        return {**planned, "project": project, "id": planned["name"], "url": f"gs://{planned['name']}",
                "self_link": f"https://www.googleapis.com/storage/v1/b/{planned['name']}",
                "storage_class": planned.get("storage_class") or "STANDARD", "project_number": 1}

    def read(self, state):
        return state if found_at(f"{STORAGE}/b/{state['name']}", f"bucket {state['name']}") else None

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
        delete_at(f"{STORAGE}/b/{name}", f"bucket {name}")


class Repository(Resource):
    type_name = "google_artifact_registry_repository"
    forces_new = ("repository_id", "location", "format", "project")

    def name(self, state):
        project = state.get("project") or self.provider.config["project"]
        return f"projects/{project}/locations/{state['location']}/repositories/{state['repository_id']}"

    def plan_create(self, planned):
        return {**planned, **labels_plan(planned, None)}

    def plan_update(self, prior, proposed, replacing):
        return {**proposed, **labels_plan(proposed, prior)}

    def create_request(self, planned):
        parent, _, repository_id = self.name(planned).rpartition("/repositories/")
        body = {"format": planned["format"], "description": planned.get("description")}
        if planned.get("effective_labels"):
            body["labels"] = dict(planned["effective_labels"])
        return "POST", f"{ARTIFACTS}/{parent}/repositories?repositoryId={repository_id}", body

    def create(self, planned):
        name = self.name(planned)
        try:
            operation = call(*self.create_request(planned))
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
                "update_time": "2026-11-22T20:00:00Z",
                **({} if "effective_labels" in planned else labels_plan(planned, None))}

    def read(self, state):
        return state if found_at(f"{ARTIFACTS}/{self.name(state)}", "Repository") else None

    def delete(self, state):
        delete_at(f"{ARTIFACTS}/{self.name(state)}", "Repository")

    def import_(self, import_id):
        try:
            found = call("GET", f"{ARTIFACTS}/{import_id}")
        except GoogleApiError as error:
            raise fail("importing Repository", error) from None
        parts = import_id.split("/")
        # The API's labels are the effective ones (the attribution label included); labels and
        # terraform_labels hold what the configuration will set, so the next plan has no change.
        found_labels = dict(found.get("labels") or {})
        given = {k: v for k, v in found_labels.items() if k != ATTRIBUTION[0]}
        return self._state({"repository_id": parts[5], "location": parts[3], "format": found.get("format"),
                            "labels": given, "terraform_labels": found_labels, "effective_labels": found_labels,
                            "description": found.get("description")}, import_id)
