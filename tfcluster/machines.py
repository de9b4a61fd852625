"""Settings Google would refuse on gcp, checked before anything is created: the cluster's name (it
makes service account ids and network tags), the machine type for a GPU and its count, and the boot
disk and NIC types the machine's family supports (tables in tfcluster/gpus.py)."""

from __future__ import annotations

import re

import tfcluster.gpus as gpu_table
from tfcluster.errors import ConfigError

# On Google Cloud the name also makes each VM's service account id "<name>-vm-<index>" (index < 64,
# so at most 27 characters), which must be 6 to 30 characters matching [a-z][-a-z0-9]*[a-z0-9] (IAM:
# projects.serviceAccounts.create, accountId), and the network tag "tfcluster-<name>", which must end with a letter or digit (RFC 1035 labels:
# https://cloud.google.com/vpc/docs/add-remove-network-tags). terraform/variables.tf validates
# cluster_name with this same pattern; tests/test_config.py checks that the two agree.
GCP_CLUSTER_NAME = r"^[a-z][a-z0-9-]{1,19}[a-z0-9]$"


def check_gcp_name(cluster: str) -> None:
    """Refuse a name Google would refuse, before anything is created."""
    if not re.match(GCP_CLUSTER_NAME, cluster):
        raise ConfigError(f"cluster must be 3 to 21 characters on gcp: lowercase letters, digits and dashes, "
                          f"starting with a letter and not ending with a dash (got {cluster!r}); Google builds "
                          "the service account id and network tag from it")


def pick_machine_type(model: gpu_table.Gpu, gpu_count: int, machine_type: str, spot: bool) -> str:
    """The machine type for ``gpu_count`` x ``model``: the one asked for, checked against the GPU's
    family (tfcluster/gpus.py), or the one the table picks."""
    if model.attached:
        machine_type = machine_type or "n1-standard-8"
        if not gpu_table.N1_MACHINE_TYPE.fullmatch(machine_type):
            raise ConfigError(f"machine_type must be an N1 type such as n1-standard-8 (got {machine_type!r}): "
                              "T4 and V100 GPUs attach only to N1")
        if gpu_count == 0:
            return machine_type
        limits = model.n1_limits.get(gpu_count)
        if limits is None:
            raise ConfigError(f"gpu_count must be one of {', '.join(map(str, model.counts()))} for "
                              f"{model.accelerator} on N1 (got {gpu_count})")
        vcpus, memory = gpu_table.shape_of(machine_type)
        max_vcpus, max_memory = limits
        if vcpus > max_vcpus or memory > max_memory:
            raise ConfigError(f"machine_type {machine_type} ({vcpus} vCPUs, {memory:g} GB) is too large for "
                              f"{gpu_count} x {model.accelerator}: Google allows at most {max_vcpus} vCPUs and "
                              f"{max_memory} GB with that many; pick a smaller N1 type or attach more GPUs "
                              "(https://cloud.google.com/compute/docs/gpus)")
        return machine_type
    family = model.family.upper()
    picked = model.machine_type_for(gpu_count)
    if machine_type and machine_type not in model.machine_types:
        raise ConfigError(f"machine_type {machine_type} does not come with {model.name} GPUs: {model.name} runs "
                          f"on {family} ({', '.join(model.machine_types)}); leave machine_type empty to pick "
                          "one from gpu_count")
    if machine_type and model.machine_types[machine_type].gpus != gpu_count:
        raise ConfigError(f"machine_type {machine_type} has {model.machine_types[machine_type].gpus} x {model.name}, "
                          f"not gpu_count {gpu_count}; leave machine_type empty to pick "
                          f"{picked or 'one'} from gpu_count")
    if picked is None:
        raise ConfigError(f"gpu_count must be one of {', '.join(map(str, model.counts()))} for {model.name} on "
                          f"{family} (got {gpu_count})")
    machine_type = machine_type or picked
    if model.machine_types[machine_type].spot_only and not spot:
        full = [name for name, shape in model.machine_types.items() if not shape.spot_only]
        raise ConfigError(f"machine_type {machine_type} is offered only as Spot: add --spot, or use "
                          f"{', '.join(full)} (https://cloud.google.com/compute/docs/accelerator-optimized-machines)")
    return machine_type


def check_family(machine_type: str, boot_disk_type: str, nic_type: str) -> None:
    """The boot disk and NIC types the machine's family supports (tfcluster/gpus.py FAMILIES)."""
    family = gpu_table.family_of(machine_type)
    if boot_disk_type not in family.disk_types:
        raise ConfigError(f"boot_disk_type must be one of {', '.join(family.disk_types)} on "
                          f"{family.name.upper()} (got {boot_disk_type!r}) (https://cloud.google.com/compute/docs/"
                          "accelerator-optimized-machines)")
    if nic_type and nic_type not in gpu_table.NIC_TYPES:
        raise ConfigError(f"nic_type must be one of {', '.join(gpu_table.NIC_TYPES)} or empty (got {nic_type!r})")
    if family.required_nic and nic_type and nic_type != family.required_nic:
        raise ConfigError(f"nic_type must be {family.required_nic} on {family.name.upper()} (got {nic_type}); "
                          "leave nic_type empty to have it")
