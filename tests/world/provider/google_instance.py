"""google_compute_instance against the Compute stand-in (its IAM member: google_iam.py).

The insert body as the provider builds it (instance_body.py, from resource_compute_instance.go and
compute_instance_helpers.go); it waits on the zone operation and then reads the instance for
networkIP and natIP. Labels are the provider's effective labels (base.py). In place: metadata by
instances.setMetadata with the current fingerprint, labels by instances.setLabels.
"""

from __future__ import annotations

from tests.world.provider.base import Resource, labels_plan, labels_read
from tests.world.provider.google_api import COMPUTE, GoogleApiError, call, fail, not_found, wait_compute
from tests.world.provider.google_compute import SELF_LINK
from tests.world.provider.instance_body import Unexpanded, insert_body
from tests.world.provider.servicer import ProviderFailure


def _one(items):
    return (items or [{}])[0] or {}


class Instance(Resource):
    type_name = "google_compute_instance"
    forces_new = ("name", "zone", "project", ("boot_disk", "initialize_params"),
                  ("network_interface", "subnetwork"), "scratch_disk")

    def where(self, state: dict) -> tuple[str, str]:
        return state.get("project") or self.provider.config["project"], state.get("zone") or self.provider.config["zone"]

    def url(self, state: dict) -> str:
        project, zone = self.where(state)
        return f"{COMPUTE}/projects/{project}/zones/{zone}/instances/{state['name']}"

    def body(self, planned: dict) -> dict:
        project, zone = self.where(planned)
        try:
            return insert_body(planned, project, zone)
        except Unexpanded as error:
            raise ProviderFailure(f"Error creating instance: {error}") from None

    def plan_create(self, planned: dict) -> dict:
        return {**planned, **labels_plan(planned, None)}

    def plan_update(self, prior: dict, proposed: dict, replacing: bool) -> dict:
        return {**proposed, **labels_plan(proposed, prior)}

    def create_request(self, planned: dict) -> tuple[str, str, dict]:
        project, zone = self.where(planned)
        return "POST", f"{COMPUTE}/projects/{project}/zones/{zone}/instances", self.body(planned)

    def create(self, planned: dict) -> dict:
        project, zone = self.where(planned)
        try:
            operation = call(*self.create_request(planned))
        except GoogleApiError as error:
            raise fail("creating instance", error) from None
        wait_compute(operation, project, "instance to create")
        state = {**planned, "project": project, "zone": zone,
                 "id": f"projects/{project}/zones/{zone}/instances/{planned['name']}",
                 "self_link": f"{SELF_LINK}projects/{project}/zones/{zone}/instances/{planned['name']}"}
        made = self.read(state) or state
        # hashicorp/google is an SDKv2 provider, whose result terraform takes as it comes; the stand-in
        # returns the planned scratch disks here, and a later refresh reads Compute's (read below).
        return {**made, "scratch_disk": planned.get("scratch_disk") or []}

    def read(self, state: dict) -> dict | None:
        try:
            found = call("GET", self.url(state))
        except GoogleApiError as error:
            if not_found(error):
                return None
            raise fail("reading instance", error) from None
        nic = _one(found.get("networkInterfaces"))
        access = _one(nic.get("accessConfigs"))
        interfaces = [dict(item) for item in state.get("network_interface") or [{}]]
        interfaces[0]["network_ip"] = nic.get("networkIP")
        interfaces[0]["name"] = nic.get("name", "nic0")
        interfaces[0]["access_config"] = [dict(item, nat_ip=access.get("natIP"))
                                          for item in interfaces[0].get("access_config") or []]
        # Local SSD Compute attached (a type's bundled ones among them) reads back as scratch_disk, a
        # field that forces a new instance (resource_compute_instance.go flattenScratchDisk; ForceNew).
        scratch = [{"device_name": disk.get("deviceName"), "interface": disk.get("interface", "NVME"),
                    "size": int(disk.get("diskSizeGb") or 375)}
                   for disk in found.get("disks") or [] if disk.get("type") == "SCRATCH"]
        return {**state, "network_interface": interfaces, "current_status": found.get("status"), "scratch_disk": scratch,
                **labels_read(state, found.get("labels") or {}), "metadata_fingerprint": found["metadata"].get("fingerprint"),
                "metadata": {item["key"]: item["value"] for item in found["metadata"].get("items", [])},
                "instance_id": "1000000000000000002", "cpu_platform": "Intel Broadwell",
                "label_fingerprint": "bGFiZWwx", "tags_fingerprint": "dGFnczE="}

    def update(self, prior: dict, planned: dict) -> dict:
        changed = {key for key in planned if planned.get(key) != prior.get(key)}
        if "metadata" in changed:
            current = call("GET", self.url(prior))["metadata"].get("fingerprint")
            items = [{"key": k, "value": v} for k, v in sorted((planned.get("metadata") or {}).items())]
            try:
                operation = call("POST", self.url(prior) + "/setMetadata", {"fingerprint": current, "items": items})
            except GoogleApiError as error:
                raise fail("updating metadata", error) from None
            wait_compute(operation, self.where(prior)[0], "metadata to update")
        if "effective_labels" in changed:  # resourceComputeInstanceUpdate: d.HasChange("effective_labels")
            try:
                operation = call("POST", self.url(prior) + "/setLabels", {
                    "labels": planned.get("effective_labels") or {}, "labelFingerprint": prior.get("label_fingerprint")})
            except GoogleApiError as error:
                raise fail("updating labels", error) from None
            wait_compute(operation, self.where(prior)[0], "labels to update")
        others = changed - {"metadata", "labels", "terraform_labels", "effective_labels", "metadata_fingerprint",
                            "current_status"}
        if others:
            raise ProviderFailure(f"Error updating instance: the stand-in updates only metadata and labels "
                                  f"in place, not {sorted(others)}")
        return self.read(planned) or planned

    def delete(self, state: dict) -> None:
        try:
            operation = call("DELETE", self.url(state))
        except GoogleApiError as error:
            if not_found(error):
                return
            raise fail("deleting instance", error) from None
        wait_compute(operation, self.where(state)[0], "instance to delete")
