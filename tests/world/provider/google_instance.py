"""google_compute_instance and google_compute_instance_iam_member against the Compute stand-in.

Request bodies as the provider builds them (resource_compute_instance.go expandComputeInstance:
machineType and diskType and acceleratorType as zone-relative URLs, metadata as items, the access
config ONE_TO_ONE_NAT "external-nat"); it waits on the zone operation and then reads the instance
for networkIP and natIP. In place: metadata by instances.setMetadata with the current fingerprint,
labels by instances.setLabels. IAM members as the provider's iam_compute_instance.go: read the
instance's policy (getIamPolicy), add the member to the role's binding, setIamPolicy; delete
removes it the same way.
"""

from __future__ import annotations

from tests.world.provider.base import Resource
from tests.world.provider.google_api import COMPUTE, GoogleApiError, call, fail, not_found, wait_compute
from tests.world.provider.google_compute import SELF_LINK
from tests.world.provider.servicer import ProviderFailure


def _one(items):
    return (items or [{}])[0] or {}


class Instance(Resource):
    type_name = "google_compute_instance"
    forces_new = ("name", "zone", "project", ("boot_disk", "initialize_params"),
                  ("network_interface", "subnetwork"))

    def where(self, state: dict) -> tuple[str, str]:
        return state.get("project") or self.provider.config["project"], state.get("zone") or self.provider.config["zone"]

    def url(self, state: dict) -> str:
        project, zone = self.where(state)
        return f"{COMPUTE}/projects/{project}/zones/{zone}/instances/{state['name']}"

    def body(self, planned: dict) -> dict:
        project, zone = self.where(planned)
        params = _one(_one(planned.get("boot_disk")).get("initialize_params"))
        scheduling = _one(planned.get("scheduling"))
        deadline = _one(scheduling.get("max_run_duration"))
        interface = _one(planned.get("network_interface"))
        account = _one(planned.get("service_account"))
        body = {
            "name": planned["name"], "machineType": f"zones/{zone}/machineTypes/{planned['machine_type']}",
            "labels": planned.get("labels") or {}, "tags": {"items": planned.get("tags") or []},
            "disks": [{"boot": True, "autoDelete": True, "initializeParams": {
                "sourceImage": params.get("image"), "diskSizeGb": str(int(params.get("size") or 10)),
                "diskType": f"projects/{project}/zones/{zone}/diskTypes/{params.get('type') or 'pd-standard'}",
                "labels": params.get("labels") or {}}}],
            "guestAccelerators": [{"acceleratorType": f"projects/{project}/zones/{zone}/acceleratorTypes/{g['type']}",
                                   "acceleratorCount": int(g["count"])} for g in planned.get("guest_accelerator") or []],
            "scheduling": {"onHostMaintenance": scheduling.get("on_host_maintenance"),
                           "automaticRestart": scheduling.get("automatic_restart"),
                           "provisioningModel": scheduling.get("provisioning_model"),
                           "preemptible": bool(scheduling.get("preemptible")),
                           "instanceTerminationAction": scheduling.get("instance_termination_action")},
            "networkInterfaces": [{"subnetwork": SELF_LINK + interface["subnetwork"], "accessConfigs": [
                {"type": "ONE_TO_ONE_NAT", "name": "external-nat"} for _ in interface.get("access_config") or []],
                **({"nicType": interface["nic_type"]} if interface.get("nic_type") else {})}],
            "serviceAccounts": [{"email": account.get("email"), "scopes": account.get("scopes") or []}],
            "metadata": {"items": [{"key": k, "value": v} for k, v in sorted((planned.get("metadata") or {}).items())]},
        }
        if deadline.get("seconds"):
            body["scheduling"]["maxRunDuration"] = {"seconds": str(int(deadline["seconds"]))}
        return body

    def create(self, planned: dict) -> dict:
        project, zone = self.where(planned)
        try:
            operation = call("POST", f"{COMPUTE}/projects/{project}/zones/{zone}/instances", self.body(planned))
        except GoogleApiError as error:
            raise fail("creating instance", error) from None
        wait_compute(operation, project, "instance to create")
        state = {**planned, "project": project, "zone": zone,
                 "id": f"projects/{project}/zones/{zone}/instances/{planned['name']}",
                 "self_link": f"{SELF_LINK}projects/{project}/zones/{zone}/instances/{planned['name']}"}
        return self.read(state) or state

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
        return {**state, "network_interface": interfaces, "current_status": found.get("status"),
                "labels": found.get("labels") or {}, "metadata_fingerprint": found["metadata"].get("fingerprint"),
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
        if "labels" in changed:
            try:
                operation = call("POST", self.url(prior) + "/setLabels", {"labels": planned.get("labels") or {},
                                                                           "labelFingerprint": "bGFiZWwx"})
            except GoogleApiError as error:
                raise fail("updating labels", error) from None
            wait_compute(operation, self.where(prior)[0], "labels to update")
        others = changed - {"metadata", "labels", "metadata_fingerprint", "current_status"}
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


class InstanceIamMember(Resource):
    type_name = "google_compute_instance_iam_member"
    forces_new = ("instance_name", "zone", "role", "member", "project")

    def url(self, state: dict) -> str:
        project = state.get("project") or self.provider.config["project"]
        zone = state.get("zone") or self.provider.config["zone"]
        return f"{COMPUTE}/projects/{project}/zones/{zone}/instances/{state['instance_name']}"

    def _policy(self, state: dict) -> dict:
        return call("GET", self.url(state) + "/getIamPolicy")

    def _change(self, state: dict, add: bool) -> None:
        policy = self._policy(state)
        bindings = [dict(b) for b in policy.get("bindings", [])]
        binding = next((b for b in bindings if b["role"] == state["role"]), None)
        if binding is None:
            binding = {"role": state["role"], "members": []}
            bindings.append(binding)
        members = set(binding["members"])
        members = members | {state["member"]} if add else members - {state["member"]}
        binding["members"] = sorted(members)
        bindings = [b for b in bindings if b["members"]]
        call("POST", self.url(state) + "/setIamPolicy", {"policy": {"bindings": bindings, "etag": policy.get("etag")}})

    def create(self, planned: dict) -> dict:
        try:
            self._change(planned, add=True)
        except GoogleApiError as error:
            raise fail(f"applying IAM policy for compute instance {planned['instance_name']}", error) from None
        project = planned.get("project") or self.provider.config["project"]
        zone = planned.get("zone") or self.provider.config["zone"]
        return {**planned, "project": project, "zone": zone, "etag": "BwY=",
                "id": f"projects/{project}/zones/{zone}/instances/{planned['instance_name']}/{planned['role']}/"
                      f"{planned['member']}"}

    def read(self, state: dict) -> dict | None:
        try:
            policy = self._policy(state)
        except GoogleApiError as error:
            if not_found(error):
                return None
            raise fail("reading IAM policy", error) from None
        held = any(state["member"] in b["members"] for b in policy.get("bindings", []) if b["role"] == state["role"])
        return state if held else None

    def delete(self, state: dict) -> None:
        try:
            self._change(state, add=False)
        except GoogleApiError as error:
            if not_found(error):
                return
            raise fail("removing IAM policy member", error) from None
