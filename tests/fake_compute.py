"""A fake Compute Engine API: a local HTTP server speaking the REST shapes that
google-cloud-compute sends and receives, for the few calls tfcluster makes.

State lives in ``FakeCompute``; tests change it directly (as the real control plane would change
by itself), the provider stand-ins (tests/world/provider) through the API.

Behaviours modelled, with their sources:
- Errors use Google's JSON error shape (https://cloud.google.com/apis/design/errors): code,
  message, errors[].reason and, for a disabled API, details[] with a google.rpc.ErrorInfo whose
  reason is SERVICE_DISABLED and metadata.service the API (google-api-core parses these in
  google/api_core/exceptions.py, format_http_response_error).
- A stopped VM (TERMINATED) keeps scheduling.maxRunDuration and instanceTerminationAction: "The
  termination timestamp is automatically cleared whenever a VM is stopped or suspended", and is
  "automatically defined by Compute Engine whenever a VM has a time limit and enters the RUNNING
  state" (https://cloud.google.com/compute/docs/instances/limit-vm-runtime), so the duration
  counts again from each start (lastStartTimestamp).
- A start gives a new ephemeral external IP; the internal IP stays
  (https://cloud.google.com/compute/docs/ip-addresses#ephemeraladdress).
- A deleted instance answers 404 notFound (instances.get reference).
- Rate limits answer 403 with reason rateLimitExceeded, or 429 RESOURCE_EXHAUSTED
  (https://cloud.google.com/compute/docs/api-rate-limits; tests/world/compute_auth.py).
- Zonal operations go PENDING -> RUNNING -> DONE over time, whether anyone polls or not; an
  instance's start takes effect only when its operation is DONE. google-cloud-compute's
  InstancesClient.start/set_metadata/... return an ExtendedOperation whose result() polls
  zoneOperations.get (google/cloud/compute_v1/services/instances/client.py: GetZoneOperationRequest;
  google/api_core/extended_operation.py) until status is DONE, then raises from
  httpErrorStatusCode/httpErrorMessage and error.errors. References:
  https://cloud.google.com/compute/docs/reference/rest/v1/zoneOperations/get, .../zoneOperations/wait
  (blocks until DONE or about 2 minutes), .../zoneOperations/list (filter).
- An insert in a zone without capacity (no_capacity_zones) returns its operation, which ends DONE
  with the zone's code and message in error.errors[] and no instance made (the same page).
- A start in a zone without capacity ends DONE with error.errors[].code ZONE_RESOURCE_POOL_EXHAUSTED,
  httpErrorStatusCode 503 (https://cloud.google.com/compute/docs/troubleshooting/troubleshooting-resource-availability);
  the instance stays TERMINATED.
- An instance's creationTimestamp, lastStartTimestamp and lastStopTimestamp are RFC 3339 "[Output
  Only]" fields of the instance (https://cloud.google.com/compute/docs/reference/rest/v1/instances):
  set when it is made, at each start and at each stop (ours, a halt inside the guest, a preemption);
  only the last start and the last stop are kept, and an instance never stopped has no lastStopTimestamp.
- A Spot VM's preemption (https://cloud.google.com/compute/docs/instances/spot): the instance is
  stopped (TERMINATED, STOP semantics as stop_instance) and a DONE operation with operationType
  compute.instances.preempted is listed by zoneOperations.list with
  filter operationType="compute.instances.preempted"
  (https://cloud.google.com/compute/docs/instances/create-use-preemptible#detecting_if_an_instance_was_preempted,
  and the compute-preemptible-history sample).
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlparse

BASE = "/compute/v1/projects/(?P<project>[^/]+)"

from tests.world import capacity, compute_auth, compute_lists, compute_resources, discovery, iam_api  # noqa: E402
from tests.world import images as world_images  # noqa: E402
from tests.world import quotas as world_quotas  # noqa: E402
from tests.world import placement  # noqa: E402
from tests.world.http import WorldServer, send_json  # noqa: E402
from tests import fake_operations  # noqa: E402
from tests.fake_operations import (_now_iso, advance, capacity_error, new_operation, preempt_instance,  # noqa: E402
                                   start_effect)

__all__ = ["FakeCompute", "FakeComputeServer", "preempt_instance", "stop_instance"]


@dataclass
class FakeCompute:
    project: str = "demo-project"
    accelerators: dict = field(default_factory=lambda: {"us-west1-b": ["nvidia-tesla-t4", "nvidia-tesla-v100"]})
    region_quotas: dict = field(default_factory=lambda: {"us-west1": {"NVIDIA_T4_GPUS": (8.0, 0.0),
                                                                      "NVIDIA_V100_GPUS": (4.0, 0.0)}})
    project_quotas: dict = field(default_factory=lambda: {"GPUS_ALL_REGIONS": (16.0, 0.0)})
    # Cloud Quotas' family grants: quota ID -> [(dimensions, value)] (tests/world/quotas.py holds the
    # whole table: what is not set here is a new project's default, and instances add their usage).
    family_quotas: dict = field(default_factory=dict)
    # name -> {"zone", "labels", "status", "guest": {path: value}, "metadata": {...}, "internal_ip",
    #          "external_ip", "max_run_seconds", "termination_action", "spot"}
    instances: dict = field(default_factory=dict)
    # Other resources `invoke down` must find gone: kind -> names (disks, addresses, firewalls,
    # subnetworks, networks), kept in step by the collections in tests/world/compute_resources.py.
    others: dict = field(default_factory=dict)
    # The project has not enabled the Compute Engine API: every call answers 403 SERVICE_DISABLED.
    service_disabled: bool = False
    # The next N API calls are over a rate limit, answered with this status (403 or 429).
    rate_limited_calls: int = 0
    rate_limit_status: int = 403
    # Permissions the caller's account lacks (e.g. "compute.regions.get"): a call that needs one
    # answers 403 forbidden, "Required '<permission>' permission for '<resource>'".
    missing_permissions: set = field(default_factory=set)
    # The project's effective organisation policies, constraint -> rules (the world shares Org
    # Policy's own dict, tests/world/project_apis.py): Compute enforces them at insert (tests/world/oslogin.py).
    org_policies: dict = field(default_factory=dict)
    # The project's own metadata (projects.get commonInstanceMetadata.items), key -> value, which
    # every instance inherits where its own metadata does not set the key.
    project_metadata: dict = field(default_factory=dict)
    # Refresh tokens Google has expired or revoked (an old `gcloud auth application-default login`).
    revoked_refresh_tokens: set = field(default_factory=set)
    # The new ephemeral external IP each instance gets at its next start (name -> address).
    next_external_ip: dict = field(default_factory=dict)
    # The most items a list page holds (Compute's own cap is 500; a server may return fewer:
    # tests/world/compute_lists.py). Lowered by a test that must see every page read.
    page_limit: int = 500
    # Seconds a start's operation stays PENDING/RUNNING before DONE; other operations take less.
    start_seconds: float = 2.0
    other_seconds: float = 0.3
    # The next N starts find no capacity in the zone (ZONE_RESOURCE_POOL_EXHAUSTED).
    no_capacity_starts: int = 0
    # Zones without capacity for new VMs: zone -> the code their instances.insert operations end
    # with (ZONE_RESOURCE_POOL_EXHAUSTED, its _WITH_DETAILS form or REGION_RESOURCE_POOL_EXHAUSTED).
    no_capacity_zones: dict = field(default_factory=dict)
    # How many more VMs such a zone takes before it has no capacity (zone -> count; default 0).
    zone_room: dict = field(default_factory=dict)
    # Called as on_start(name, external_ip) when a start's operation completes: the test world
    # boots the machine that plays the VM (its processes were lost with the stop).
    on_start: object = None
    # Called as on_stop(name) when an instances.stop's operation completes: the machine halts.
    on_stop: object = None
    # Called as on_insert(name, record) when an instances.insert's operation completes: the test
    # world gives the new VM its machine (addresses) and boots it.
    on_insert: object = None
    # Called as on_delete(name) when an instances.delete's operation completes: the machine goes.
    on_delete: object = None
    # The machines behind the instances run startup/startup.sh, which reports readiness itself
    # (tests/world/booted.py); otherwise a start's completion reports "<nonce>:ok" for it.
    guests_report_ready: bool = False
    # Instances whose deletion Compute accepts and then fails: name -> the operation's closing fields
    # ({"httpErrorStatusCode", "error": {"errors": [{"code", "message"}]}}): an operation can end
    # DONE with `error` (zoneOperations reference), and the instance stays.
    failing_deletes: dict = field(default_factory=dict)
    # The next instances.insert calls answer these (status, error body) in turn, e.g. a quota refusal.
    insert_errors: list = field(default_factory=list)
    # Access token -> principal (tests/world/compute_auth.py): the operator's, a VM's service account.
    tokens: dict = field(default_factory=lambda: {compute_auth.OPERATOR_TOKEN: compute_auth.OPERATOR})
    # Key id -> (principal, public key) of service-account keys whose self-signed JWTs are accepted.
    jwt_keys: dict = field(default_factory=dict)
    # Access tokens oauth2.googleapis.com/token issued: token -> (principal, scopes, expiry time).
    issued: dict = field(default_factory=dict)
    # Those of them a user's refresh token got (`gcloud auth application-default login`): a user's
    # credentials, which carry no quota project of their own (tests/world/facts.py, QUOTA_PROJECT).
    user_tokens: set = field(default_factory=set)
    # Seconds an issued token lives (expires_in); Google's is an hour.
    token_lifetime: float = 3600.0
    # IAM (tests/world/iam_api.py): email -> service account; custom role name -> permissions;
    # ids of deleted custom roles, reserved.
    service_accounts: dict = field(default_factory=dict)
    # IAM's eventual consistency: seconds after projects.serviceAccounts.create before IAM's reads
    # and Compute see the new account (tests/world/iam_api.py), and after a setIamPolicy before IAM
    # enforces it (https://cloud.google.com/iam/docs/access-change-propagation: typically under 2
    # minutes). Small so CI stays fast; a test raises it to see the product wait. Email -> the
    # moment IAM shows the account (monotonic).
    iam_delay_seconds: float = 0.5
    account_visible_at: dict = field(default_factory=dict)
    custom_roles: dict = field(default_factory=dict)
    deleted_roles: set = field(default_factory=set)
    # A deleted role's permissions, which projects.roles.undelete gives back (tests/world/iam_api.py).
    deleted_role_permissions: dict = field(default_factory=dict)
    # Images, "project/name" -> image (tests/world/images.py): the Deep Learning VM families.
    images: dict = field(default_factory=world_images.default_images)
    # networks, subnetworks, firewalls: name -> the resource as inserted (compute_resources.py).
    resources: dict = field(default_factory=dict)
    # Operation name -> {"json": the operation's fields, "done_at": monotonic time, "apply": effect
    # run once when DONE (or None), "error": the error block it ends with (or None)}.
    operations: dict = field(default_factory=dict)
    requests: list = field(default_factory=list)
    # Room per zone and provisioning model, Flex-start requests, reservations (tests/world/capacity.py).
    capacity: capacity.Capacity = field(default_factory=capacity.Capacity)
    lock: threading.RLock = field(default_factory=threading.RLock)

    def __post_init__(self):
        # A real project: the default VPC and its rules, and a resource of the user's named "default-...".
        resources, others = compute_resources.default_project(self.project)
        self.resources = {**resources, **self.resources}
        self.others = {**others, **self.others}


def _error(code: int, message: str, reason: str = "notFound") -> tuple[int, dict]:
    """Google's error shape with the reason Compute gives for it (notFound for a 404)."""
    return code, {"error": {"code": code, "message": message,
                            "errors": [{"message": message, "domain": "global", "reason": reason}]}}


def _instance_json(state: FakeCompute, name: str, zone: str) -> dict:
    instance = state.instances[name]
    metadata = instance.setdefault("metadata", {})
    access = [{"kind": "compute#accessConfig", "type": "ONE_TO_ONE_NAT", "name": "external-nat",
               "natIP": instance["external_ip"]}] if instance.get("external_ip") and instance["status"] == "RUNNING" else []
    scheduling = {"provisioningModel": capacity.model_of(instance.get("body") or
                                                         {"scheduling": {"preemptible": bool(instance.get("spot"))}})}
    if instance.get("max_run_seconds"):
        scheduling["maxRunDuration"] = {"seconds": str(instance["max_run_seconds"])}
    if instance.get("termination_action"):
        scheduling["instanceTerminationAction"] = instance["termination_action"]
    machine = {"machineType": instance["body"]["machineType"]} if (instance.get("body") or {}).get("machineType") else {}
    if machine:  # The boot disk, and the Local SSD Compute attaches to a type that bundles it (375 GB each).
        machine["disks"] = [{"kind": "compute#attachedDisk", "type": "PERSISTENT", "boot": True, "autoDelete": True,
                             "deviceName": "persistent-disk-0", "interface": "SCSI", "mode": "READ_WRITE"}] + [
            {"kind": "compute#attachedDisk", "type": "SCRATCH", "autoDelete": True, "deviceName": f"local-ssd-{i}",
             "interface": "NVME", "mode": "READ_WRITE", "diskSizeGb": "375"}
            for i in range(world_quotas.LOCAL_SSD.get(machine["machineType"].rsplit("/", 1)[-1], 0) // 375)]
    return {"kind": "compute#instance", "name": name, "status": instance["status"], **machine,
            "labels": instance.get("labels", {}), "zone": f"projects/{state.project}/zones/{zone}",
            "creationTimestamp": instance.get("created", "2026-11-22T05:00:00.000-08:00"),
            "lastStartTimestamp": instance.get("started", "2026-11-22T05:00:00.000-08:00"),
            **({"lastStopTimestamp": instance["stopped"]} if instance.get("stopped") else {}),
            "networkInterfaces": [{"kind": "compute#networkInterface", "name": "nic0",
                                   "networkIP": instance.get("internal_ip", ""), "accessConfigs": access}],
            "scheduling": scheduling, **placement.resource_status(state, name, instance,
                                                                  capacity.resource_status(state, instance)),
            **({"resourcePolicies": list(instance["body"]["resourcePolicies"])}
               if (instance.get("body") or {}).get("resourcePolicies") else {}),
            "metadata": {"kind": "compute#metadata", "fingerprint": instance.get("fingerprint", "ZmluZ2VyMQ=="),
                         "items": [{"key": k, "value": v} for k, v in sorted(metadata.items())]}}


# acceleratorTypes.maximumCardsPerInstance as Compute reports it: T4 4, V100 8, L4 8 (g2-standard-96),
# A100 40GB 16 (a2-megagpu-16g), A100 80GB and H100 8 (https://cloud.google.com/compute/docs/gpus).
MAX_CARDS = {"nvidia-tesla-t4": 4, "nvidia-tesla-v100": 8, "nvidia-l4": 8, "nvidia-tesla-a100": 16,
             "nvidia-a100-80gb": 8, "nvidia-h100-80gb": 8}


def _accelerator(state: FakeCompute, zone: str, name: str) -> dict:
    return {"kind": "compute#acceleratorType", "name": name, "zone": f"projects/{state.project}/zones/{zone}",
            "maximumCardsPerInstance": MAX_CARDS.get(name, 4), "description": name}


def stop_instance(state: FakeCompute, name: str) -> None:
    """What a stop (the watchdog's halt, a deadline, a preemption) does to the instance record."""
    with state.lock:
        instance = state.instances[name]
        instance["status"] = "TERMINATED"  # Its time limit stays; only the termination timestamp goes.
        instance["external_ip"] = None  # An ephemeral address is released.
        instance["stopped"] = _now_iso()  # lastStopTimestamp (the module docstring).
        capacity.release(state, name)  # Its reservation's place, if it had one (tests/world/capacity.py).


def stop_effect(state: FakeCompute, name: str):
    """A stop's operation completing: the record as stop_instance leaves it, then the machine halts."""
    def halt() -> None:
        if name not in state.instances:
            return
        stop_instance(state, name)
        if callable(state.on_stop):
            state.on_stop(name)

    return halt


# The permission each call tfcluster makes needs, from the API reference's "IAM Permissions" section
# of each method (e.g. https://cloud.google.com/compute/docs/reference/rest/v1/regions/get:
# compute.regions.get). Compute refuses with 403, reason "forbidden" and the message
# "Required '<permission>' permission for '<resource>'" (the text gcloud and Terraform relay).
PERMISSIONS = [
    ("GET", BASE + "/zones/[^/]+/acceleratorTypes", "compute.acceleratorTypes.list"),
    ("GET", BASE + "/aggregated/acceleratorTypes", "compute.acceleratorTypes.list"),
    ("GET", BASE + "/regions", "compute.regions.list"),
    ("GET", BASE + "/regions/[^/]+", "compute.regions.get"),
    ("GET", BASE, "compute.projects.get"),
    ("GET", BASE + "/zones/[^/]+/instances", "compute.instances.list"),
    ("GET", BASE + "/zones/[^/]+/instances/[^/]+", "compute.instances.get"),
    ("POST", BASE + "/zones/[^/]+/instances/[^/]+/start", "compute.instances.start"),
    ("POST", BASE + "/zones/[^/]+/instances/[^/]+/stop", "compute.instances.stop"),
    ("POST", BASE + "/zones/[^/]+/instances/[^/]+/setScheduling", "compute.instances.setScheduling"),
]


def _forbidden(state: FakeCompute, method: str, path: str) -> tuple[int, dict] | None:
    for verb, pattern, permission in PERMISSIONS:
        if verb == method and permission in state.missing_permissions and re.fullmatch(pattern, path):
            message = f"Required '{permission}' permission for '{path.removeprefix('/compute/v1/')}'"
            return 403, {"error": {"code": 403, "message": message,
                                   "errors": [{"message": message, "domain": "global", "reason": "forbidden"}]}}
    return None


def route(state: FakeCompute, method: str, path: str, query: dict, body: dict | None,
          headers: dict) -> tuple[int, dict]:
    state.requests.append({"method": method, "path": path, "query": query, "authorization":
                           headers.get("Authorization", ""), "body": body, "at": time.time()})
    capacity.tick(state)
    advance(state)
    caller, refused = compute_auth.principal(state, headers)
    if refused:
        return refused
    # Each request under its API's discovery document (tests/world/discovery.py): this server
    # also plays iam.googleapis.com (/v1/projects/...). Then the token's scopes, then IAM.
    document = "iam.v1" if path.startswith("/v1/") else "compute.v1"
    return discovery.serve(document, method, path, query, body, lambda call: (
        compute_auth.scope_refusal(state, headers, call) or compute_auth.check(state, method, path, headers)
        or _answer(state, method, path, query, body)))


def _answer(state: FakeCompute, method: str, path: str, query: dict, body: dict | None) -> tuple[int, dict]:
    served = iam_api.route(state, method, path, body, query)
    if served is not None:
        return served
    if state.service_disabled:
        return compute_auth.service_disabled(state.project)
    if state.rate_limited_calls > 0:
        state.rate_limited_calls -= 1
        return compute_auth.rate_limited(state.rate_limit_status)
    refused = _forbidden(state, method, path)
    if refused:
        return refused
    served = compute_resources.route(state, method, path, body, query) or world_images.route(state, method, path) or \
        capacity.route(state, method, path, query)
    if served is not None:
        return served
    match = re.fullmatch(BASE + r"(?:/zones/[^/]+|/regions/[^/]+|/global)/(?P<kind>disks|addresses|firewalls|"
                         r"subnetworks|networks)", path)
    if match and method == "GET":
        items = [{"kind": f"compute#{match['kind'][:-1]}", "name": name, "labels": {}}
                 for name in sorted(state.others.get(match["kind"], ()))]
        if match["kind"] == "disks":  # Boot disks carry the cluster label (instances.tf).
            items = [dict(item, labels={"tfcluster-cluster": item["name"].rsplit("-", 1)[0]}) for item in items]
        items = [dict(item, **{k: v for k, v in state.resources.get(match["kind"], {}).get(item["name"], {}).items()
                               if k in ("network", "selfLink")}) for item in items]
        schema = {"disks": "Disk", "addresses": "Address", "firewalls": "Firewall", "subnetworks": "Subnetwork",
                  "networks": "Network"}[match["kind"]]
        return compute_lists.listed(state, items, query, schema, {"kind": f"compute#{match['kind'][:-1]}List"})
    match = re.fullmatch(BASE + "/zones/(?P<zone>[^/]+)/acceleratorTypes", path)
    if match and method == "GET":
        zone = match["zone"]
        items = [_accelerator(state, zone, name) for name in state.accelerators.get(zone, [])]
        return compute_lists.listed(state, items, query, "AcceleratorType", {
            "kind": "compute#acceleratorTypeList", "id": f"projects/{state.project}/zones/{zone}/acceleratorTypes"})
    if re.fullmatch(BASE + "/aggregated/acceleratorTypes", path) and method == "GET":
        # acceleratorTypes.aggregatedList: items keyed "zones/ZONE", each {"acceleratorTypes": [...]},
        # or {"warning": {"code": "NO_RESULTS_ON_PAGE"}} where the filter leaves none
        # (https://cloud.google.com/compute/docs/reference/rest/v1/acceleratorTypes/aggregatedList).
        items = {}
        for zone, names in sorted(state.accelerators.items()):
            try:  # The filter applies to each scope's acceleratorTypes (compute_lists.py).
                found = compute_lists.select([_accelerator(state, zone, n) for n in names], query, "AcceleratorType")
            except compute_lists.FilterError:
                return compute_lists.refusal(query["filter"][0])
            items[f"zones/{zone}"] = {"acceleratorTypes": found} if found else {"warning": {
                "code": "NO_RESULTS_ON_PAGE", "message": "There are no results for scope 'zones/" + zone + "' on this page."}}
        return 200, {"kind": "compute#acceleratorTypeAggregatedList", "items": items}
    if re.fullmatch(BASE + "/regions", path) and method == "GET":  # regions.list: every region with its quotas.
        return compute_lists.listed(state, [
            {"kind": "compute#region", "name": region, "status": "UP",
             "quotas": [{"metric": m, "limit": limit, "usage": usage}
                        for m, (limit, usage) in world_quotas.region_quotas(state, region).items()]}
            for region in world_quotas.regions(state)], query, "Region", {"kind": "compute#regionList"})
    match = re.fullmatch(BASE + "/regions/(?P<region>[^/]+)", path)
    if match and method == "GET":
        quotas = [{"metric": metric, "limit": limit, "usage": usage}
                  for metric, (limit, usage) in world_quotas.region_quotas(state, match["region"]).items()]
        return 200, {"kind": "compute#region", "name": match["region"], "status": "UP", "quotas": quotas}
    match = re.fullmatch(BASE, path)
    if match and method == "GET":
        quotas = [{"metric": metric, "limit": limit, "usage": usage}
                  for metric, (limit, usage) in world_quotas.project_quotas(state).items()]
        answer = {"kind": "compute#project", "name": match["project"], "quotas": quotas}
        if state.project_metadata:
            answer["commonInstanceMetadata"] = {"kind": "compute#metadata", "items": [
                {"key": key, "value": value} for key, value in state.project_metadata.items()]}
        return 200, answer
    match = re.fullmatch(BASE + "/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)/getGuestAttributes", path)
    if match and method == "GET":
        instance = state.instances.get(match["name"])
        if instance is None:
            return _error(404, f"The resource 'projects/{state.project}/zones/{match['zone']}/instances/"
                               f"{match['name']}' was not found")
        prefix = query.get("queryPath", [""])[0]
        items = [{"namespace": p.split("/")[0], "key": p.split("/", 1)[1], "value": v}
                 for p, v in instance["guest"].items() if p.startswith(prefix)]
        if not items:
            return _error(404, f"The resource 'guestAttributes/{prefix}' was not found")
        return 200, {"kind": "compute#guestAttributes", "queryPath": prefix, "queryValue": {"items": items}}
    match = re.fullmatch(BASE + "/zones/(?P<zone>[^/]+)/instances", path)
    if match and method == "GET":
        items = []
        for name, instance in sorted(state.instances.items()):
            if instance.get("zone") != match["zone"]:
                continue
            items.append(_instance_json(state, name, match["zone"]))  # instances.list: whole instances.
        return compute_lists.listed(state, items, query, "Instance", {"kind": "compute#instanceList"})
    match = re.fullmatch(BASE + "/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)"
                         "(?P<verb>/setMetadata|/start|/stop|/setScheduling|/resume)?", path)
    if match and match["name"] not in state.instances and method in ("GET", "POST"):
        return _error(404, f"The resource 'projects/{match['project']}/zones/{match['zone']}/instances/"
                           f"{match['name']}' was not found")
    if match and method == "GET" and not match["verb"]:
        return 200, _instance_json(state, match["name"], match["zone"])
    if match and method == "POST" and match["verb"]:
        project, zone, name = match["project"], match["zone"], match["name"]
        instance = state.instances[name]
        with state.lock:
            # A change takes effect when its operation is DONE; one asked while another runs on the
            # instance is refused (fake_operations.busy).
            busy = fake_operations.busy(state, project, zone, name)
            if busy:
                return busy
            if match["verb"] == "/setMetadata":
                if body.get("fingerprint") != instance.get("fingerprint", "ZmluZ2VyMQ=="):
                    return _error(412, "Supplied fingerprint does not match current metadata fingerprint.",
                                  "conditionNotMet")
                items = {item["key"]: item.get("value", "") for item in body.get("items", [])}

                def set_metadata():
                    instance["metadata"] = items
                    instance["fingerprint"] = f"ZmluZ2Vy{len(state.requests)}"  # A new one with the change.
                return 200, new_operation(state, project, zone, "setMetadata", name, state.other_seconds,
                                          apply=set_metadata)
            if match["verb"] == "/setScheduling":
                # "You can only call this method on a stopped instance, that is, a VM instance that is in
                # a TERMINATED state." (instances/setScheduling reference)
                if instance["status"] != "TERMINATED":
                    return _error(400, f"The instance '{name}' must be stopped (TERMINATED) to change its "
                                       f"scheduling; it is {instance['status']}.", "badRequest")
                seconds = int((body.get("maxRunDuration") or {}).get("seconds") or 0) or None
                action = body.get("instanceTerminationAction") or None

                def set_scheduling():
                    instance["max_run_seconds"], instance["termination_action"] = seconds, action
                return 200, new_operation(state, project, zone, "setScheduling", name, state.other_seconds,
                                          apply=set_scheduling)
            if match["verb"] == "/stop":
                # instances/stop: "Stops a running instance, shutting it down cleanly"; STOPPING until the
                # operation is DONE, then TERMINATED (https://cloud.google.com/compute/docs/instances/
                # instance-life-cycle). Stopping a VM that is not running is a no-op operation.
                machine = ((instance.get("body") or {}).get("machineType") or "").rsplit("/", 1)[-1]
                if machine in world_quotas.LOCAL_SSD and "discardLocalSsd" not in query:
                    # "This property is required if the instance has any attached Local SSD disks"
                    # (compute.v1.json instances.stop); Google's words, skypilot-org/skypilot#2586.
                    return _error(400, "VM has a Local SSD attached but an undefined value for `discard-local-ssd`. "
                                       "If using gcloud, please add `--discard-local-ssd=false` or "
                                       "`--discard-local-ssd=true` to your command.", "badRequest")
                if instance["status"] == "RUNNING":
                    instance["status"] = "STOPPING"
                    return 200, new_operation(state, project, zone, "stop", name, state.other_seconds,
                                              apply=stop_effect(state, name))
            elif match["verb"] == "/resume":
                if instance["status"] != "SUSPENDED":
                    return _error(400, "Instance is not suspended.", "badRequest")
                instance["status"] = "RUNNING"
            else:  # start: a new ephemeral external IP once DONE; the boot script then reports readiness.
                if instance["status"] in ("TERMINATED", "STOPPED") and (
                        state.no_capacity_starts > 0 or capacity.start_refused(state, name)):
                    state.no_capacity_starts = max(0, state.no_capacity_starts - 1)
                    return 200, new_operation(state, project, zone, "start", name, state.start_seconds,
                                              error=capacity_error(project, zone))
                if instance["status"] in ("TERMINATED", "STOPPED"):
                    instance["status"] = "STAGING"  # Until the operation is DONE.
                    return 200, new_operation(state, project, zone, "start", name, state.start_seconds,
                                              apply=start_effect(state, name))
        return 200, new_operation(state, project, zone, match["verb"][1:], name, state.other_seconds)
    match = re.fullmatch(BASE + "/zones/(?P<zone>[^/]+)/operations", path)
    if match and method == "GET":
        advance(state)
        with state.lock:
            items = [dict(entry["json"]) for entry in state.operations.values()
                     if entry["json"]["zone"].endswith(f"/zones/{match['zone']}")]
        return compute_lists.listed(state, items, query, "Operation", {"kind": "compute#operationList"})
    match = re.fullmatch(BASE + "/zones/(?P<zone>[^/]+)/operations/(?P<op>[^/]+?)(?P<wait>/wait)?", path)
    if match and method in ("GET", "POST"):
        entry = state.operations.get(match["op"])
        if entry is None:
            return _error(404, f"The resource 'projects/{match['project']}/zones/{match['zone']}/operations/"
                               f"{match['op']}' was not found")
        if match["wait"]:  # zoneOperations.wait returns when DONE or after about 2 minutes.
            time.sleep(max(0.0, min(entry["done_at"] - time.monotonic(), 120.0)))
        advance(state)
        return 200, dict(entry["json"])
    match = re.fullmatch(BASE + "/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)", path)
    if match and method == "DELETE":
        if match["name"] not in state.instances:
            return _error(404, f"The resource 'projects/{match['project']}/zones/{match['zone']}/instances/"
                               f"{match['name']}' was not found")
        with state.lock:
            instance = state.instances[match["name"]]
            failure = state.failing_deletes.get(match["name"])
            if failure is not None:  # Accepted, then the operation ends DONE with the error; it stays.
                return 200, new_operation(state, match["project"], match["zone"], "delete", match["name"],
                                          state.other_seconds, error=failure)
            instance["status"] = "STOPPING"
        return 200, new_operation(state, match["project"], match["zone"], "delete", match["name"],
                                   state.other_seconds, apply=compute_resources.delete_effect(state, match["name"]))
    return _error(404, f"fake compute: no route for {method} {path}")


class FakeComputeServer:
    """Plain HTTP on an ephemeral loopback port (the test's control door), and, given ``tls``
    (address, certfile, keyfile), the same API over HTTPS on that address's port 443, where the
    names compute.googleapis.com and oauth2.googleapis.com point in the test world."""

    def __init__(self, state: FakeCompute | None = None, tls: tuple[str, str, str] | None = None):
        self.state = state or FakeCompute()
        state_ref = self.state

        class Handler(BaseHTTPRequestHandler):
            def _serve(self):
                parsed = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                if parsed.path.endswith("/allowedLocations"):
                    # iamcredentials.googleapis.com: google-auth looks up a service account's
                    # regional access boundary before it uses the key
                    # (google/auth/_regional_access_boundary_utils.py); "0x0" means none.
                    code, payload = 200, {"encodedLocations": "0x0", "locations": []}
                elif parsed.path == "/token":
                    # oauth2.googleapis.com/token: the grant google-auth sends for a service-account
                    # key (https://developers.google.com/identity/protocols/oauth2/service-account).
                    state_ref.requests.append({"method": "POST", "path": "/token", "query": {}, "body": None,
                                               "authorization": ""})
                    # A new token with the scopes asked (the assertion's `scope` claim, or the
                    # refresh grant's `scope`), expiring after the world's token lifetime.
                    grant = parse_qs(raw.decode(errors="replace"))
                    scopes = set(grant.get("scope", [""])[0].split()) or compute_auth.asserted_scopes(
                        grant.get("assertion", [""])[0]) or {compute_auth.CLOUD_PLATFORM}
                    code, payload = 200, compute_auth.issue_token(state_ref, compute_auth.OPERATOR, scopes)
                    if grant.get("refresh_token"):
                        state_ref.user_tokens.add(payload["access_token"])
                    # A user's refresh token (`gcloud auth application-default login`) that expired or
                    # was revoked: 400 invalid_grant, "Token has been expired or revoked."
                    # (https://developers.google.com/identity/protocols/oauth2#expiration; google-auth
                    # raises RefreshError from it: google/oauth2/_client.py, _handle_error_response).
                    if grant.get("refresh_token", [""])[0] in state_ref.revoked_refresh_tokens:
                        code, payload = 400, {"error": "invalid_grant",
                                              "error_description": "Token has been expired or revoked."}
                elif parsed.path == "/tokeninfo":
                    # oauth2.googleapis.com/tokeninfo?access_token=T: whose token it is. The e-mail
                    # is there when the token has the email scope, as `gcloud auth
                    # application-default login` grants; an unknown token is 400 invalid_token
                    # (https://developers.google.com/identity/protocols/oauth2/web-server, "tokeninfo").
                    token = parse_qs(parsed.query).get("access_token", [""])[0]
                    who = (compute_auth.identify(state_ref, token) or ("",))[0]
                    if who:
                        code, payload = 200, {"email": who.split(":", 1)[1], "email_verified": "true",
                                              "scope": "openid https://www.googleapis.com/auth/userinfo.email "
                                                       "https://www.googleapis.com/auth/cloud-platform",
                                              "expires_in": "3599"}
                    else:
                        code, payload = 400, {"error": "invalid_token", "error_description": "Invalid Value"}
                else:
                    body = json.loads(raw or b"null") if raw else None
                    code, payload = route(state_ref, self.command, parsed.path, parse_qs(parsed.query), body,
                                          dict(self.headers))
                send_json(self, code, payload)

            do_GET = do_POST = do_DELETE = do_PATCH = _serve

            def log_message(self, *args):
                pass

        self.server = WorldServer(("127.0.0.1", 0), Handler)
        self.servers = [self.server]
        if tls is not None:
            import ssl

            address, certfile, keyfile = tls
            secure = WorldServer((address, 443), Handler)
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(certfile, keyfile)
            secure.socket = context.wrap_socket(secure.socket, server_side=True)
            self.servers.append(secure)
        self.threads = [threading.Thread(target=server.serve_forever, daemon=True) for server in self.servers]
        for thread in self.threads:
            thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()
