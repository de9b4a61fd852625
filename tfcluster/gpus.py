"""The GPUs tfcluster offers on Google Cloud and the machine families they come in: the one table
that config.py, the gcp backend (quota, price, driver) and terraform/ (through the generated
terraform/machine_types.json) all read.

Sources, read 2026-11-25 (through excerpts of the pages; what the excerpts did not show is marked):
- "GPU machine types", https://cloud.google.com/compute/docs/gpus: "For the A and G series
  accelerator-optimized machine types, the specified GPU model automatically attaches to the
  instance. For the N1 general-purpose machine types, you can attach the GPU models specified"
  (T4: 1, 2 or 4; V100: 1, 2, 4 or 8, with the N1 vCPU and memory limits below).
- "Accelerator-optimized machine family", https://cloud.google.com/compute/docs/accelerator-optimized-machines,
  and "Create an A3, A2 or G2 VM", .../gpus/create-gpu-vm-accelerator-optimized: A3 High has H100
  80GB GPUs, A2 Ultra A100 80GB, A2 Standard A100 40GB, G2 L4. Not in the excerpts read, from the
  pages' machine-type and storage tables as tfcluster knows them (re-check when Google changes
  them): each type's vCPUs and memory below; A3 and G2 take no Standard Persistent Disk; A3
  requires gVNIC; a3-highgpu-1g, -2g and -4g are for Spot or Flex-start VMs only.
  Bundled Local SSD, from the GPU machine-types page's tables (https://cloud.google.com/compute/docs/gpus):
  a3-highgpu-1g/2g/4g/8g 750/1,500/3,000/6,000 GB, a2-ultragpu-1g/2g/4g/8g 375/750/1,500/3,000 GB
  (G2 and A2 Standard bundle none). The A100 80GB SKU is "Nvidia Tesla A100 80GB GPU running in ..." as
  catalog readers see it (e.g. infracost-style price readers matching "nvidia tesla a100 80gb gpu running in").
- Quota: Compute's Quota.metric enum (compute.v1.json revision 20261106) has CPUS, A2_CPUS,
  NVIDIA_T4/V100/L4/A100/A100_80GB_GPUS and their PREEMPTIBLE_ forms, and PREEMPTIBLE_NVIDIA_H100_GPUS,
  but no NVIDIA_H100_GPUS, G2_CPUS or A3_CPUS: on-demand H100s count on the Cloud Quotas API's
  GPUS-PER-GPU-FAMILY-per-project-region (gpu_family NVIDIA_H100), G2 and A3 vCPUs on
  CPUS-PER-VM-FAMILY-per-project-region (vm_family G2, A3)
  (https://cloud.google.com/docs/quotas/configure-dimensions). N1 vCPUs count on CPUS.
  tfcluster/backends/gcp/quotas/quota.py reads each where Google keeps it.
- Driver branches: NVIDIA's data-center driver notes: R580 is the last branch for Volta (V100);
  Ada (L4) and Hopper (H100) need R525 or newer, Ampere (A100) R450.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

# Boot disk types tfcluster offers (pd-*; Hyperdisk is not offered yet).
DISK_TYPES = ("pd-standard", "pd-balanced", "pd-ssd")
NIC_TYPES = ("VIRTIO_NET", "GVNIC")


@dataclass(frozen=True)
class Shape:
    """One machine type of an accelerator-optimized family."""

    # GPUs that come with it.
    gpus: int
    # vCPUs.
    vcpus: int
    # Memory in GB.
    memory_gb: int
    # Only Spot or Flex-start VMs may have it (A3 High below 8 GPUs: "you must create instances by using
    # Spot VMs or Flex-start VMs", https://cloud.google.com/compute/docs/gpus).
    spot_only: bool = False
    # GB of Local SSD that comes with it (A3 High, A2 Ultra; billed with the VM, discarded at a stop).
    local_ssd_gb: int = 0


@dataclass(frozen=True)
class Family:
    """A machine family, as far as tfcluster's choices go."""

    # Its name as the machine types start ("n1", "g2", "a2", "a3").
    name: str
    # Boot disk types it supports.
    disk_types: tuple[str, ...]
    # Compute's regional vCPU quota metric (CPUS, A2_CPUS); "" when the family's is in Cloud Quotas.
    cpu_quota: str
    # Its vm_family in Cloud Quotas' CPUS-PER-VM-FAMILY-per-project-region ("" when cpu_quota names it).
    vm_family: str = ""
    # The NIC type it requires ("" when any).
    required_nic: str = ""
    # Catalog SKU words for its cores and RAM ("N1 Predefined Instance", "A2 Instance").
    sku: str = ""
    # Catalog resourceGroup of those SKUs.
    sku_group: str = ""


@dataclass(frozen=True)
class Gpu:
    """A GPU model tfcluster offers."""

    # Short name users type (--gpu l4).
    name: str
    # Compute Engine accelerator type.
    accelerator: str
    # The family it runs in.
    family: str
    # Its Quota.metric name ("NVIDIA_T4_GPUS"); Spot VMs use PREEMPTIBLE_ + this where granted.
    metric_name: str
    # Catalog SKU model words ("Nvidia L4 GPU"), on-demand; Spot SKUs add "attached to Spot Preemptible VMs".
    sku: str
    # NVIDIA architecture, as driver notes name it.
    arch: str = ""
    # Cloud Quotas' gpu_family when on-demand VMs count on GPUS-PER-GPU-FAMILY-per-project-region
    # (metric_name is then not in Compute's enum; only its PREEMPTIBLE_ form is).
    gpu_family: str = ""
    # Driver branches that support it (inclusive; None = no bound).
    driver_min: int | None = None
    driver_max: int | None = None
    # Accelerator-optimized: machine type -> shape. Empty for N1, where GPUs are attached.
    machine_types: dict[str, Shape] = field(default_factory=dict)
    # N1 only: GPU count -> (most vCPUs, most GB of memory) the VM may have with them.
    n1_limits: dict[int, tuple[int, int]] = field(default_factory=dict)

    @property
    def quota(self) -> str:
        """The regional Quota.metric on-demand VMs draw on ("" when it is gpu_family's, in Cloud Quotas)."""
        return "" if self.gpu_family else self.metric_name

    @property
    def attached(self) -> bool:
        """Given as guest_accelerator on an N1 VM, rather than coming with the machine type."""
        return not self.machine_types

    def counts(self) -> list[int]:
        return sorted(self.n1_limits) if self.attached else sorted({s.gpus for s in self.machine_types.values()})

    def machine_type_for(self, count: int) -> str | None:
        """The machine type `--gpu-count count` picks (the first listed with that many GPUs)."""
        return next((name for name, shape in self.machine_types.items() if shape.gpus == count), None)


FAMILIES = {
    "n1": Family("n1", DISK_TYPES, "CPUS", sku="N1 Predefined Instance", sku_group="N1Standard"),
    "g2": Family("g2", ("pd-balanced", "pd-ssd"), "", "G2", sku="G2 Instance", sku_group="G2Standard"),
    "a2": Family("a2", DISK_TYPES, "A2_CPUS", sku="A2 Instance", sku_group="A2Standard"),
    "a3": Family("a3", ("pd-balanced", "pd-ssd"), "", "A3", required_nic="GVNIC", sku="A3 Instance",
                 sku_group="A3Standard"),
}

GPUS = {
    "t4": Gpu("t4", "nvidia-tesla-t4", "n1", "NVIDIA_T4_GPUS", "Nvidia Tesla T4 GPU", arch="Turing", driver_min=410,
              n1_limits={1: (48, 312), 2: (48, 312), 4: (96, 624)}),
    "v100": Gpu("v100", "nvidia-tesla-v100", "n1", "NVIDIA_V100_GPUS", "Nvidia Tesla V100 GPU", arch="Volta", driver_min=410,
                driver_max=580, n1_limits={1: (12, 78), 2: (24, 156), 4: (48, 312), 8: (96, 624)}),
    # G2: the 1-GPU types differ in vCPUs and memory; g2-standard-8 (first) is what --gpu-count 1 picks.
    "l4": Gpu("l4", "nvidia-l4", "g2", "NVIDIA_L4_GPUS", "Nvidia L4 GPU", arch="Ada", driver_min=525, machine_types={
        "g2-standard-8": Shape(1, 8, 32), "g2-standard-4": Shape(1, 4, 16), "g2-standard-12": Shape(1, 12, 48),
        "g2-standard-16": Shape(1, 16, 64), "g2-standard-32": Shape(1, 32, 128), "g2-standard-24": Shape(2, 24, 96),
        "g2-standard-48": Shape(4, 48, 192), "g2-standard-96": Shape(8, 96, 384)}),
    "a100": Gpu("a100", "nvidia-tesla-a100", "a2", "NVIDIA_A100_GPUS", "Nvidia Tesla A100 GPU", arch="Ampere", driver_min=450,
                machine_types={"a2-highgpu-1g": Shape(1, 12, 85), "a2-highgpu-2g": Shape(2, 24, 170),
                               "a2-highgpu-4g": Shape(4, 48, 340), "a2-highgpu-8g": Shape(8, 96, 680),
                               "a2-megagpu-16g": Shape(16, 96, 1360)}),
    "a100-80gb": Gpu("a100-80gb", "nvidia-a100-80gb", "a2", "NVIDIA_A100_80GB_GPUS", "Nvidia Tesla A100 80GB GPU",
                     arch="Ampere", driver_min=450, machine_types={
                         "a2-ultragpu-1g": Shape(1, 12, 170, local_ssd_gb=375), "a2-ultragpu-2g": Shape(2, 24, 340, local_ssd_gb=750),
                         "a2-ultragpu-4g": Shape(4, 48, 680, local_ssd_gb=1500),
                         "a2-ultragpu-8g": Shape(8, 96, 1360, local_ssd_gb=3000)}),
    "h100": Gpu("h100", "nvidia-h100-80gb", "a3", "NVIDIA_H100_GPUS", "Nvidia H100 80GB GPU", arch="Hopper", driver_min=525,
                gpu_family="NVIDIA_H100",
                machine_types={"a3-highgpu-1g": Shape(1, 26, 234, True, 750), "a3-highgpu-2g": Shape(2, 52, 468, True, 1500),
                               "a3-highgpu-4g": Shape(4, 104, 936, True, 3000), "a3-highgpu-8g": Shape(8, 208, 1872, False, 6000)}),
}
BY_ACCELERATOR = {gpu.accelerator: gpu for gpu in GPUS.values()}
N1_MACHINE_TYPE = re.compile(r"n1-(standard|highmem|highcpu)-(\d+)")
# GB of memory per vCPU of the predefined N1 types (https://cloud.google.com/compute/docs/general-purpose-machines#n1_machines).
N1_MEMORY_PER_VCPU = {"standard": 3.75, "highmem": 6.5, "highcpu": 0.9}


def gpu(name: str) -> Gpu | None:
    """The GPU by short name or accelerator type (t4 or nvidia-tesla-t4), or None."""
    name = name.strip().lower()
    return GPUS.get(name) or BY_ACCELERATOR.get(name)


def family_of(machine_type: str) -> Family | None:
    return FAMILIES.get(machine_type.split("-", 1)[0])


def shape_of(machine_type: str) -> tuple[int, float]:
    """(vCPUs, GB of memory) of an N1 predefined or a tabled accelerator-optimized machine type."""
    n1 = N1_MACHINE_TYPE.fullmatch(machine_type)
    if n1:
        return int(n1[2]), N1_MEMORY_PER_VCPU[n1[1]] * int(n1[2])
    for model in GPUS.values():
        if machine_type in model.machine_types:
            shape = model.machine_types[machine_type]
            return shape.vcpus, float(shape.memory_gb)
    raise KeyError(machine_type)


def local_ssd_gb(machine_type: str) -> int:
    """GB of Local SSD bundled with ``machine_type`` (0 for none or an unknown type)."""
    return next((g.machine_types[machine_type].local_ssd_gb for g in GPUS.values() if machine_type in g.machine_types), 0)


def terraform_table() -> dict:
    """What terraform/machine_types.json holds: the rules variables.tf validates with."""
    return {
        "_comment": "Generated from tfcluster/gpus.py by `python -m tfcluster.gpus`; do not edit.",
        "accelerators": sorted(g.accelerator for g in GPUS.values()),
        "attached": {g.accelerator: g.counts() for g in GPUS.values() if g.attached},
        "machine_types": {name: {"accelerator": g.accelerator, "gpus": s.gpus, "spot_only": s.spot_only,
                                 "local_ssd_gb": s.local_ssd_gb}
                          for g in GPUS.values() for name, s in g.machine_types.items()},
        "disk_types": {f.name: list(f.disk_types) for f in FAMILIES.values()},
        "required_nic": {f.name: f.required_nic for f in FAMILIES.values() if f.required_nic},
    }


if __name__ == "__main__":
    print(json.dumps(terraform_table(), indent=2, sort_keys=True))
