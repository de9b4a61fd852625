"""hashicorp/google 7.46.1's Compute resources, against the Compute stand-in (tests/fake_compute.py).

Which arguments force a new resource follows the provider's source
(github.com/hashicorp/terraform-provider-google, google/services/compute/):
resource_compute_network.go (name, auto_create_subnetworks: ForceNew),
resource_compute_subnetwork.go (name, network, region: ForceNew; ip_cidr_range may only expand),
resource_compute_firewall.go (name, network, direction: ForceNew),
resource_compute_instance.go (name, zone, boot_disk.initialize_params, network_interface's
subnetwork: ForceNew; metadata by setMetadata and labels by setLabels in place).
Ids are the provider's import formats ("projects/{{project}}/global/networks/{{name}}", ...).
"""

from __future__ import annotations

from tests.world.provider.base import Resource
from tests.world.provider.google_api import COMPUTE, GoogleApiError, call, delete_at, fail, found_at, wait_compute
from tests.world.provider.servicer import ProviderFailure

SELF_LINK = "https://www.googleapis.com/compute/v1/"


def _last(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


class ComputeResource(Resource):
    # The collection path under projects/P: "global/networks", "regions/{region}/subnetworks", ...
    collection = ""
    label = ""  # as the provider names it in errors: "Network", "Subnetwork", "Firewall"

    def project(self, state: dict) -> str:
        return state.get("project") or self.provider.config["project"]

    def path(self, state: dict) -> str:
        scope = self.collection.format(region=state.get("region") or self.provider.region(),
                                       zone=state.get("zone") or self.provider.config.get("zone"))
        return f"projects/{self.project(state)}/{scope}"

    def body(self, planned: dict) -> dict:
        raise NotImplementedError

    def create_request(self, planned: dict) -> tuple[str, str, dict]:
        return "POST", f"{COMPUTE}/{self.path(planned)}", self.body(planned)

    def create(self, planned: dict) -> dict:
        path = self.path(planned)
        try:
            operation = call(*self.create_request(planned))
        except GoogleApiError as error:
            raise fail(f"creating {self.label}", error) from None
        wait_compute(operation, self.project(planned), f"{self.label} to create")
        return {**planned, "project": self.project(planned), "id": f"{path}/{planned['name']}",
                "self_link": f"{SELF_LINK}{path}/{planned['name']}", **self.computed(planned)}

    def computed(self, planned: dict) -> dict:
        return {}

    def read(self, state: dict) -> dict | None:
        return state if found_at(f"{COMPUTE}/{self.path(state)}/{state['name']}", self.label) else None

    def delete(self, state: dict) -> None:
        operation = delete_at(f"{COMPUTE}/{self.path(state)}/{state['name']}", self.label)
        if operation is not None:
            wait_compute(operation, self.project(state), f"{self.label} to delete")


class Network(ComputeResource):
    type_name = "google_compute_network"
    collection = "global/networks"
    label = "Network"
    forces_new = ("name", "auto_create_subnetworks", "project")

    def body(self, planned):
        return {"name": planned["name"], "autoCreateSubnetworks": bool(planned.get("auto_create_subnetworks")),
                "routingConfig": {"routingMode": planned.get("routing_mode") or "REGIONAL"}}

    def computed(self, planned):
        return {"routing_mode": planned.get("routing_mode") or "REGIONAL", "mtu": planned.get("mtu") or 1460,
                "gateway_ipv4": "", "numeric_id": "1000000000000000001"}


class Subnetwork(ComputeResource):
    type_name = "google_compute_subnetwork"
    collection = "regions/{region}/subnetworks"
    label = "Subnetwork"
    forces_new = ("name", "network", "region", "project")

    def body(self, planned):
        return {"name": planned["name"], "network": SELF_LINK + planned["network"],
                "ipCidrRange": planned["ip_cidr_range"],
                "privateIpGoogleAccess": bool(planned.get("private_ip_google_access"))}

    def computed(self, planned):
        return {"region": planned.get("region") or self.provider.region(), "gateway_address": "10.128.0.1",
                "stack_type": "IPV4_ONLY", "purpose": "PRIVATE", "fingerprint": "ZmluZ2VyMQ==",
                "creation_timestamp": "2026-11-22T05:00:00.000-08:00", "subnetwork_id": 1}


class Firewall(ComputeResource):
    type_name = "google_compute_firewall"
    collection = "global/firewalls"
    label = "Firewall"
    forces_new = ("name", "network", "direction", "project")

    def body(self, planned):
        return {"name": planned["name"], "network": SELF_LINK + planned["network"],
                "direction": planned.get("direction") or "INGRESS",
                "sourceRanges": planned.get("source_ranges") or [], "sourceTags": planned.get("source_tags") or [],
                "targetTags": planned.get("target_tags") or [],
                "allowed": [{"IPProtocol": rule["protocol"], "ports": rule.get("ports") or []}
                            for rule in planned.get("allow") or []]}

    def computed(self, planned):
        return {"direction": planned.get("direction") or "INGRESS", "destination_ranges": [],
                "enable_logging": False, "creation_timestamp": "2026-11-22T05:00:00.000-08:00",
                "deletion_policy": None}


class ResourcePolicy(ComputeResource):
    """resource_compute_resource_policy.go: name, region and every policy block are ForceNew (a
    resource policy has no update call in compute.v1)."""

    type_name = "google_compute_resource_policy"
    collection = "regions/{region}/resourcePolicies"
    label = "ResourcePolicy"
    forces_new = ("name", "region", "project", "group_placement_policy")

    def body(self, planned):
        body = {"name": planned["name"]}
        group = (planned.get("group_placement_policy") or [None])[0]
        if group:
            fields = {"collocation": group.get("collocation"), "vmCount": group.get("vm_count"),
                      "availabilityDomainCount": group.get("availability_domain_count"),
                      "gpuTopology": group.get("gpu_topology")}
            body["groupPlacementPolicy"] = {key: value for key, value in fields.items() if value is not None}
        return body

    def computed(self, planned):
        return {"region": planned.get("region") or self.provider.region(), "deletion_policy": None}
