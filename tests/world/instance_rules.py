"""Compute's rules across an instance's fields, each refused in Compute's words (400, reason
invalid or badRequest), checked at instances.insert (tests/world/compute_resources.py) and, for
labels, at setLabels. The discovery document describes each field alone
(tests/world/discovery.py); these are the documented rules between them.

- Labels (https://cloud.google.com/compute/docs/labeling-resources#requirements): at most 64; keys
  and values at most 63 characters of lowercase letters, digits, "_" and "-" (international
  characters allowed); a key starts with a lowercase letter (or an international character), a
  value may be empty. Words as Compute refuses them (oap-project/cloudtik#14,
  googleapis/gax-nodejs#1375 for a value; googleapis/google-cloud-node-core#314 for a key).
- GPUs cannot live-migrate: "VMs with attached GPUs ... must be set to stop (TERMINATE) on host
  maintenance" (https://cloud.google.com/compute/docs/gpus/gpu-host-maintenance); onHostMaintenance
  defaults to MIGRATE except for Spot and preemptible VMs
  (https://cloud.google.com/compute/docs/instances/setting-vm-host-options). Refused with
  "Instances with guest accelerators do not support live migration." for attached GPUs and the
  A2/G2 machines that come with theirs (openshift/release#63296 for a2-highgpu-1g, loft-sh/devpod#973
  for g2-standard-4), and for A3 "Invalid value for field 'resource.scheduling.onHostMaintenance':
  'MIGRATE'. Scheduling must have onHostMaintenance be one of the following valid types:
  [TERMINATE]. But was MIGRATE" (aerospike-community/aerolab#503).
- Spot and preemptible VMs cannot restart automatically
  (https://cloud.google.com/compute/docs/instances/spot#limitations; .../preemptible: "cannot ...
  be set to automatically restart"): "Invalid value for field 'resource.scheduling.preemptible':
  'true'. Scheduling must have preemptible be false when AutomaticRestart is true."
  (percona/mongo_terraform_ansible#34, elasticluster/elasticluster#568). A Spot VM that does not
  also say preemptible gets the same words for its provisioningModel.
- Nor live-migrate, GPU or not: an explicit onHostMaintenance MIGRATE on a Spot or preemptible VM is
  refused (tests/world/facts.py, PREEMPTIBLE_MIGRATE: "Scheduling must have preemptible be false when
  OnHostMaintenance isn't TERMINATE.", travis-ci/worker#487 for a VM without GPUs).
- A machine type must fit its GPUs (https://cloud.google.com/compute/docs/gpus#n1-gpus): only N1
  takes attached GPUs, and only the N1 models (T4, V100, P100, P4); each model in the counts the
  page lists, and no more vCPUs than the page allows for that count. Words as Compute refuses them:
  "... acceleratorCount': '8'. Number of accelerator cards attached to an instance must be one of
  [1, 2, 4]." (google/deepvariant#136) and "... acceleratorCount': '1'. At most 8 vCPUs can be used
  along with 1 accelerator cards in an instance." (google/deepvariant#70); a model N1 cannot take,
  as the G2 refusal's form ("[...] features are not compatible for creating instance.").
"""

from __future__ import annotations

import re

from tests.world import facts

# N1's GPU models: the counts it takes, and the most vCPUs for each count (the N1 GPUs table).
N1_GPUS = {"nvidia-tesla-t4": {1: 48, 2: 48, 4: 96}, "nvidia-tesla-v100": {1: 12, 2: 24, 4: 48, 8: 96},
           "nvidia-tesla-p100": {1: 16, 2: 32, 4: 64}, "nvidia-tesla-p4": {1: 24, 2: 48, 4: 96}}
# Families whose machine types come with their GPUs.
GPU_FAMILIES = ("a2-", "a3-", "g2-")


def _invalid(message: str, reason: str = "invalid") -> tuple[int, dict]:
    return 400, {"error": {"code": 400, "message": message,
                           "errors": [{"message": message, "domain": "global", "reason": reason}]}}


def _label_char(c: str, first: bool) -> bool:
    international = c.isalpha() and not c.isascii() and not c.isupper()
    if first:
        return (c.isascii() and c.islower()) or international
    return (c.isascii() and (c.islower() or c.isdigit() or c in "_-")) or international or (c.isdigit() and not c.isascii())


def label_refusal(labels: dict, field: str) -> tuple[int, dict] | None:
    """Compute's refusal of labels that break its syntax (the module docstring), else None."""
    where = f"Invalid value for field 'resource.{field}': ''."
    if len(labels) > 64:
        return _invalid(f"{where} Too many labels: {len(labels)}; at most 64 are allowed.")
    for key, value in labels.items():
        if not key or len(key) > 63 or not all(_label_char(c, i == 0) for i, c in enumerate(key)):
            return _invalid(f"{where} Label key '{key}' violates format constraints. The key must start with a "
                            "lowercase character, can only contain lowercase letters, numeric characters, underscores "
                            "and dashes. The key can be at most 63 characters long. International characters are "
                            "allowed.")
        value = "" if value is None else str(value)
        if len(value) > 63 or not all(_label_char(c, False) for c in value):
            return _invalid(f"{where} Label value '{value}' violates format constraints. The value can only contain "
                            "lowercase letters, numeric characters, underscores and dashes. The value can be at most "
                            "63 characters long. International characters are allowed.")
    return None


def _vcpus(machine: str) -> int | None:
    found = re.fullmatch(r"n1-(?:standard|highmem|highcpu)-(\d+)", machine)
    return int(found[1]) if found else None


def refusal(machine: str, body: dict) -> tuple[int, dict] | None:
    """The first cross-field rule ``body`` (an instances.insert body) breaks, in Compute's words."""
    refused = label_refusal(body.get("labels") or {}, "labels")
    for index, disk in enumerate(body.get("disks") or []):
        refused = refused or label_refusal((disk.get("initializeParams") or {}).get("labels") or {},
                                           f"disks[{index}].initializeParams.labels")
    if refused:
        return refused
    scheduling = body.get("scheduling") or {}
    spot = scheduling.get("provisioningModel") == "SPOT"
    preemptible = bool(scheduling.get("preemptible"))
    if scheduling.get("automaticRestart") is True and (spot or preemptible):
        field, value = ("preemptible", "true") if preemptible else ("provisioningModel", "SPOT")
        return _invalid(f"Invalid value for field 'resource.scheduling.{field}': '{value}'. Scheduling must have "
                        f"{field} be {'false' if preemptible else 'STANDARD'} when AutomaticRestart is true.")
    if scheduling.get("onHostMaintenance") == "MIGRATE" and (spot or preemptible):
        field, value = ("preemptible", "true") if preemptible else ("provisioningModel", "SPOT")
        words = facts.PREEMPTIBLE_MIGRATE.quote.replace("preemptible be false", f"{field} be "
                                                        f"{'false' if preemptible else 'STANDARD'}")
        return _invalid(f"Invalid value for field 'resource.scheduling.{field}': '{value}'. {words}")
    gpus = [g for g in body.get("guestAccelerators") or [] if int(g.get("acceleratorCount") or 0) > 0]
    maintenance = scheduling.get("onHostMaintenance") or ("TERMINATE" if spot or preemptible else "MIGRATE")
    if maintenance == "MIGRATE" and machine.startswith("a3-"):
        return _invalid("Invalid value for field 'resource.scheduling.onHostMaintenance': 'MIGRATE'. Scheduling must "
                        "have onHostMaintenance be one of the following valid types: [TERMINATE]. But was MIGRATE")
    if maintenance == "MIGRATE" and (gpus or machine.startswith(GPU_FAMILIES)):
        return _invalid("Instances with guest accelerators do not support live migration.", "badRequest")
    for index, gpu in enumerate(gpus):
        kind = gpu.get("acceleratorType", "").rsplit("/", 1)[-1]
        count = int(gpu["acceleratorCount"])
        allowed = N1_GPUS.get(kind)
        if machine.startswith("n1-") and allowed is None:
            return _invalid(f"[{machine}, {kind}] features are not compatible for creating instance.")
        if allowed is None:
            continue
        where = f"Invalid value for field 'resource.guestAccelerators[{index}].acceleratorCount': '{count}'."
        if count not in allowed:
            return _invalid(f"{where} Number of accelerator cards attached to an instance must be one of "
                            f"{sorted(allowed)}.")
        vcpus = _vcpus(machine)
        if vcpus is not None and vcpus > allowed[count]:
            return _invalid(f"{where} At most {allowed[count]} vCPUs can be used along with {count} accelerator "
                            "cards in an instance.")
    return None
