"""Compute collections behind the provider stand-in's calls: networks, subnetworks, firewalls,
instances.insert / setLabels / getIamPolicy / setIamPolicy, and instance and disk deletion.

Behaviours, from the Compute API reference (https://cloud.google.com/compute/docs/reference/rest/v1):
- insert of a name that exists answers 409 alreadyExists ("The resource '...' already exists");
  get/delete of a missing one 404 notFound.
- A network still used by a subnetwork or firewall cannot be deleted: 400 resourceInUseByAnotherResource
  ("The network resource '...' is already being used by '...'") (networks/delete).
- instances.insert returns a zone operation; the instance is RUNNING when it is DONE, its boot disk
  (autoDelete) named after it carries the initializeParams labels, and instances.delete deletes it
  with the instance (disks[].autoDelete).
- instances.getIamPolicy / setIamPolicy hold the instance's own policy (bindings of role -> members),
  gone with the instance.
- instances.insert refuses what does not exist, each as Compute words it (field and value named,
  https://cloud.google.com/compute/docs/reference/rest/v1/instances/insert and the
  troubleshooting page https://cloud.google.com/compute/docs/troubleshooting/troubleshooting-vm-creation):
  an unknown zone, machine type, disk type or accelerator type is 400 invalid ("Invalid value for
  field 'resource.machineType': ..."), an image that does not exist 404 notFound ("The resource
  'projects/P/global/images/NAME' was not found"); a subnetwork in an unknown region 400 invalid.
- instances.insert over an allocation quota is refused at the call, 403 quotaExceeded
  (tests/world/quotas.py: the world's quota table and Google's words).
The world decides which machine plays a new VM: ``state.on_insert(name, record)`` (set by the
test world) gives it addresses and boots it; without one it gets 10.128.0.N and 34.0.0.N.
"""

from __future__ import annotations

import re
import time

from tests.fake_operations import _now_iso, busy, capacity_error, new_operation
from tests.world import capacity, compute_lists, iam_api, instance_rules, oslogin
from tests.world.instance_rules import label_refusal
from tests.world import quotas as world_quotas

BASE = "/compute/v1/projects/(?P<project>[^/]+)"
# What exists in this world (a small part of Google's catalogue, enough for terraform/'s choices):
# https://cloud.google.com/compute/docs/regions-zones, .../disks#disk-types,
# .../general-purpose-machines#n1_machines; images are the Compute stand-in's (tests/world/images.py).
ZONES = {"us-west1-a", "us-west1-b", "us-central1-a", "us-central1-b", "europe-west4-a"}
DISK_TYPES = {"pd-standard", "pd-balanced", "pd-ssd", "pd-extreme"}
MACHINE_TYPE = re.compile(r"n1-(standard-(1|2|4|8|16|32|64|96)|highmem-(2|4|8|16|32|64|96)|highcpu-(2|4|8|16|32|64|96))"
                          r"|g2-standard-(4|8|12|16|24|32|48|96)|a2-highgpu-(1|2|4|8)g|a2-megagpu-16g|a2-ultragpu-(1|2|4|8)g"
                          r"|a3-highgpu-(1|2|4|8)g")
# Accelerator-optimized families (https://cloud.google.com/compute/docs/accelerator-optimized-machines):
# their GPUs come with the machine type; G2 and A3 take no pd-standard boot disk; A3 needs gVNIC;
# a3-highgpu-1g/2g/4g are for Spot (or Flex-start) only. Compute's words for each refusal.
NO_PD_STANDARD = ("g2-", "a3-")
SPOT_ONLY = re.compile(r"a3-highgpu-[124]g")
COLLECTIONS = {"networks": "global", "firewalls": "global", "subnetworks": "regions/[^/]+",
               "resourcePolicies": "regions/[^/]+"}
# Each collection's item kind and schema in compute.v1.
KINDS = {"networks": "Network", "firewalls": "Firewall", "subnetworks": "Subnetwork",
         "resourcePolicies": "ResourcePolicy"}


def default_project(project: str) -> tuple[dict, dict]:
    """(resources, others) of a project as Google makes it: the default VPC network with its
    default-allow-internal, -ssh, -rdp and -icmp firewall rules
    (https://cloud.google.com/vpc/docs/firewall-rules-overview#prepopulated-rules-default), and
    something of the user's own whose name merely starts like a cluster's (a reserved address
    "default-web-ip", without the cluster's label)."""
    network = f"https://www.googleapis.com/compute/v1/projects/{project}/global/networks/default"
    rules = {"default-allow-internal": ("10.128.0.0/9", ["tcp", "udp", "icmp"]),
             "default-allow-ssh": ("0.0.0.0/0", ["tcp:22"]), "default-allow-rdp": ("0.0.0.0/0", ["tcp:3389"]),
             "default-allow-icmp": ("0.0.0.0/0", ["icmp"])}
    resources = {"networks": {"default": {"name": "default", "kind": "compute#network", "autoCreateSubnetworks": True,
                                          "selfLink": network}},
                 "firewalls": {name: {"name": name, "kind": "compute#firewall", "network": network,
                                      "direction": "INGRESS", "sourceRanges": [source],
                                      "allowed": [{"IPProtocol": rule.split(":")[0],
                                                   "ports": rule.split(":")[1:]} for rule in allowed],
                                      "selfLink": f"https://www.googleapis.com/compute/v1/projects/{project}/global/"
                                                  f"firewalls/{name}"}
                               for name, (source, allowed) in rules.items()}}
    others = {"disks": set(), "addresses": {"default-web-ip"}, "subnetworks": set(),
              "firewalls": set(resources["firewalls"]), "networks": {"default"}}
    return resources, others


def gpu_quota_exceeded(metric: str, region: str, limit: float = 0.0) -> tuple[int, dict]:
    """instances.insert beyond a regional GPU quota: 403 quotaExceeded
    (https://cloud.google.com/compute/resource-usage#gpu_quota, Compute's error reasons)."""
    return _error(403, "quotaExceeded", f"Quota '{metric}' exceeded.  Limit: {limit} in region {region}.")


def _error(code: int, reason: str, message: str) -> tuple[int, dict]:
    return code, {"error": {"code": code, "message": message,
                            "errors": [{"message": message, "domain": "global", "reason": reason}]}}


def _done(state, project: str, kind: str, target: str) -> dict:
    """A global or regional operation, DONE at once (they take well under a second here)."""
    return {"kind": "compute#operation", "name": f"operation-{kind}-{target}", "operationType": kind,
            "status": "DONE", "progress": 100,
            "targetLink": f"https://www.googleapis.com/compute/v1/projects/{project}/{target}"}


def _sync_others(state) -> None:
    for kind in COLLECTIONS:
        state.others[kind] = set(state.resources.get(kind, {}))


def route(state, method: str, path: str, body: dict | None, query: dict | None = None) -> tuple[int, dict] | None:
    """The answer to a request these collections serve, else None."""
    match = re.fullmatch(BASE + "/regions/(?P<region>[^/]+)/subnetworks", path)
    if match and method == "POST" and match["region"] not in {z.rsplit("-", 1)[0] for z in ZONES}:
        return _error(400, "invalid", f"Invalid value for field 'region': '{match['region']}'. Unknown region.")
    for kind, scope in COLLECTIONS.items():
        match = re.fullmatch(BASE + f"/{scope}/{kind}(?:/(?P<name>[^/]+))?", path)
        if match:
            return _collection(state, kind, method, match["project"], match["name"], body, path, query or {})
    match = re.fullmatch(BASE + "/zones/(?P<zone>[^/]+)/instances", path)
    if match and method == "POST":
        return _insert_instance(state, match["project"], match["zone"], body)
    match = re.fullmatch(BASE + "/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)"
                         "/(?P<verb>getIamPolicy|setIamPolicy|setLabels)", path)
    if match:
        instance = state.instances.get(match["name"])
        if instance is None:
            return _error(404, "notFound", f"The resource 'projects/{match['project']}/zones/{match['zone']}/"
                                           f"instances/{match['name']}' was not found")
        if match["verb"] == "getIamPolicy":
            return 200, {"version": 1, "etag": "BwY=", "bindings": instance.setdefault("iam_bindings", [])}
        if match["verb"] == "setIamPolicy":
            with state.lock:  # Read back at once; enforced after IAM's delay (compute_auth.effective_bindings).
                instance["iam_bindings"] = body["policy"].get("bindings", [])
                instance.setdefault("iam_history", []).append((time.monotonic() + state.iam_delay_seconds,
                                                               instance["iam_bindings"]))
            return 200, {"version": 1, "etag": "BwY=", "bindings": instance["iam_bindings"]}
        with state.lock:
            refused = busy(state, match["project"], match["zone"], match["name"]) or label_refusal(
                body.get("labels") or {}, "labels")
            if refused:
                return refused
            labels = dict(body.get("labels") or {})
            return 200, new_operation(state, match["project"], match["zone"], "setLabels", match["name"], 0.0,
                                      apply=lambda: instance.update(labels=labels))
    return None


def _collection(state, kind, method, project, name, body, path, query):
    items = state.resources.setdefault(kind, {})
    if method == "POST" and name is None:
        if body["name"] in items:
            return _error(409, "alreadyExists", f"The resource '{path.removeprefix('/compute/v1/')}/"
                                                f"{body['name']}' already exists")
        with state.lock:
            items[body["name"]] = {**body, "kind": f"compute#{KINDS[kind][0].lower()}{KINDS[kind][1:]}",
                                   "selfLink": f"https://www.googleapis.com{path}/{body['name']}"}
            _sync_others(state)
        return 200, _done(state, project, "insert", f"{kind}/{body['name']}")
    if method == "GET" and name is None:
        schema = KINDS[kind]
        return compute_lists.listed(state, list(items.values()), query, schema,
                                    {"kind": f"compute#{schema[0].lower()}{schema[1:]}List"})
    if name not in items:
        return _error(404, "notFound", f"The resource '{path.removeprefix('/compute/v1/')}' was not found")
    if method == "GET":
        return 200, items[name]
    if method == "DELETE":
        users = [instance_name for instance_name, instance in state.instances.items()
                 if any(link.rstrip("/").endswith(f"/resourcePolicies/{name}")
                        for link in (instance.get("body") or {}).get("resourcePolicies") or [])]
        if kind == "resourcePolicies" and users:  # Compute refuses to delete a policy an instance uses.
            return _error(400, "resourceInUseByAnotherResource",
                          f"The resource_policy resource '{path.removeprefix('/compute/v1/')}' is already being "
                          f"used by 'projects/{project}/zones/{state.instances[users[0]]['zone']}/instances/{users[0]}'")
        if kind == "networks":
            users = [f"projects/{project}/{'regions/x/' if k == 'subnetworks' else 'global/'}{k}/{n}"
                     for k in ("subnetworks", "firewalls") for n, r in state.resources.get(k, {}).items()
                     if r.get("network", "").rstrip("/").endswith(f"/networks/{name}")]
            if users:
                return _error(400, "resourceInUseByAnotherResource",
                              f"The network resource 'projects/{project}/global/networks/{name}' is already "
                              f"being used by '{users[0]}'")
        with state.lock:
            items.pop(name)
            _sync_others(state)
        return 200, _done(state, project, "delete", f"{kind}/{name}")
    return None


def _refusal(state, zone: str, body: dict) -> tuple[int, dict] | None:
    """Compute's refusal of an instance that names what does not exist (see the module docstring)."""
    if zone not in ZONES:
        return _error(400, "invalid", f"Invalid value for field 'zone': '{zone}'. Unknown zone.")
    machine = body.get("machineType", "").rsplit("/", 1)[-1]
    if not MACHINE_TYPE.fullmatch(machine):
        return _error(400, "invalid", f"Invalid value for field 'resource.machineType': '{body.get('machineType')}'. "
                                      f"Machine type with name '{machine}' does not exist in zone '{zone}'.")
    for index, disk in enumerate(body.get("disks", [])):
        params = disk.get("initializeParams", {})
        kind = params.get("diskType", "").rsplit("/", 1)[-1]
        if kind not in DISK_TYPES:
            return _error(400, "invalid", f"Invalid value for field 'resource.disks[{index}].initializeParams."
                                          f"diskType': '{params.get('diskType')}'. The provided diskType is not valid.")
        image = re.fullmatch(r"projects/([^/]+)/global/images/([^/]+)", params.get("sourceImage") or "")
        if image is None or f"{image[1]}/{image[2]}" not in state.images:
            return _error(404, "notFound", f"The resource '{params.get('sourceImage')}' was not found")
    family = _family_refusal(machine, body)
    if family:
        return family
    for index, accelerator in enumerate(body.get("guestAccelerators", [])):
        kind = accelerator.get("acceleratorType", "").rsplit("/", 1)[-1]
        if kind not in state.accelerators.get(zone, []):
            return _error(400, "invalid", f"Invalid value for field 'resource.guestAccelerators[{index}]."
                                          f"acceleratorType': '{accelerator.get('acceleratorType')}'. Accelerator "
                                          f"type '{kind}' does not exist in zone '{zone}'.")
    return instance_rules.refusal(machine, body)  # Labels, GPUs and maintenance, Spot and restarts.


def _family_refusal(machine: str, body: dict) -> tuple[int, dict] | None:
    if machine.startswith("n1-"):
        return None
    if body.get("guestAccelerators"):
        return _error(400, "invalid", f"Invalid value for field 'resource.guestAccelerators': "
                                      f"Machine type '{machine}' comes with its GPUs; accelerators cannot be attached.")
    disk = (body.get("disks") or [{}])[0].get("initializeParams", {}).get("diskType", "").rsplit("/", 1)[-1]
    if machine.startswith(NO_PD_STANDARD) and disk == "pd-standard":
        return _error(400, "invalid", "[pd-standard] features are not compatible for creating instance.")
    nic = ((body.get("networkInterfaces") or [{}])[0]).get("nicType")
    if machine.startswith("a3-") and nic != "GVNIC":
        return _error(400, "invalid", f"Invalid value for field 'resource.networkInterfaces[0].nicType': "
                                      f"'{nic or 'UNSPECIFIED_NIC_TYPE'}'. Machine type {machine} requires GVNIC.")
    # "When provisioning a3-highgpu-1g, a3-highgpu-2g, or a3-highgpu-4g machine types, you must create
    # instances by using Spot VMs or Flex-start VMs" (https://cloud.google.com/compute/docs/gpus, A3 High).
    if SPOT_ONLY.fullmatch(machine) and (body.get("scheduling") or {}).get("provisioningModel") not in (
            "SPOT", "FLEX_START"):
        return _error(400, "invalid", f"Machine type {machine} is available only with Spot VMs or Flex-start.")
    return None


def _insert_instance(state, project: str, zone: str, body: dict) -> tuple[int, dict]:
    name = body["name"]
    with state.lock:
        if state.insert_errors:
            return state.insert_errors.pop(0)
    refused = _refusal(state, zone, body) or iam_api.unseen_account(state, body) or \
        oslogin.insert_refusal(state, project, body) or capacity.insert_refusal(state, project, zone, body)
    if refused:
        return refused
    if name in state.instances:
        return _error(409, "alreadyExists", f"The resource 'projects/{project}/zones/{zone}/instances/{name}' "
                                            "already exists")
    over, quota_charges = world_quotas.insert_refusal(state, zone, body)  # Quota is checked at the call.
    if over:
        return over
    code = state.no_capacity_zones.get(zone)
    with state.lock:
        if code and state.zone_room.get(zone, 0) > 0:
            state.zone_room[zone] -= 1  # This one still fits.
            code = None
    if code:  # Accepted, then the operation fails and nothing is made (fake_compute's docstring).
        gpus = body.get("guestAccelerators") or []
        attachment = ", ".join(f"{g['acceleratorCount']} {g['acceleratorType'].rsplit('/', 1)[-1]}" for g in gpus)
        return 200, new_operation(state, project, zone, "insert", name, state.other_seconds,
                                  error=capacity_error(project, zone, code, body["machineType"].rsplit("/", 1)[-1],
                                                       attachment or "no accelerators"))
    scheduling = body.get("scheduling") or {}
    record = {"zone": zone, "labels": dict(body.get("labels") or {}), "status": "PROVISIONING", "guest": {},
              "metadata": {item["key"]: item["value"] for item in (body.get("metadata") or {}).get("items", [])},
              "max_run_seconds": int((scheduling.get("maxRunDuration") or {}).get("seconds") or 0) or None,
              "termination_action": scheduling.get("instanceTerminationAction") or None,
              "spot": scheduling.get("provisioningModel") == "SPOT", "body": body, "quota_charges": quota_charges}
    with state.lock:
        index = len(state.instances) + 1
        record.update(internal_ip=f"10.128.0.{index + 1}", external_ip=f"34.0.0.{index + 1}")
        state.instances[name] = record
        state.others["disks"] = set(state.others.get("disks", set())) | {name}

    def boot() -> None:
        if callable(state.on_insert):
            state.on_insert(name, record)
        # creationTimestamp and lastStartTimestamp: the instance runs from its creation
        # (tests/fake_compute.py's docstring).
        record["created"] = record["started"] = _now_iso()
        record["status"] = "RUNNING"

    # Room for its provisioning model, a reservation, or a Flex-start wait (tests/world/capacity.py).
    decided = capacity.admit(state, project, zone, body, record, boot)
    if decided is not None:
        return 200, decided
    return 200, new_operation(state, project, zone, "insert", name, state.other_seconds, apply=boot)


def delete_effect(state, name: str):
    """instances.delete, once its operation is DONE: the instance and its autoDelete boot disk go."""
    def gone() -> None:
        with state.lock:
            capacity.release(state, name)
            state.instances.pop(name, None)
            state.others["disks"] = set(state.others.get("disks", set())) - {name}
        if callable(state.on_delete):
            state.on_delete(name)
    return gone
