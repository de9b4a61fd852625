"""Hourly cost estimates from the dated price table shipped with tfcluster (prices.json)."""

from __future__ import annotations

import json
from pathlib import Path

PRICES = Path(__file__).resolve().parents[2] / "prices.json"


def hourly_cost(machine_type: str, gpu: str, gpu_count: int, disk_gb: int, workers: int, spot: bool) -> dict:
    """Estimated USD per hour for the cluster, from the price table in the repo."""
    prices = json.loads(PRICES.read_text())
    _, family, size = machine_type.split("-")
    vcpus = int(size)
    memory_gib = {"standard": 3.75, "highmem": 6.5, "highcpu": 0.9}[family] * vcpus
    vm = vcpus * prices["n1_vcpu_hour"] + memory_gib * prices["n1_memory_gib_hour"]
    gpus = gpu_count * prices["gpu_hour"][gpu]
    disk = disk_gb * prices["pd_balanced_gib_month"] / 730
    factor = (1 - prices["spot_discount"]) if spot else 1.0
    per_vm = (vm + gpus) * factor + disk
    return {"vm": vm * factor, "gpu": gpus * factor, "disk": disk, "per_vm": per_vm,
            "total": per_vm * workers, "source": prices["source"], "date": prices["date"]}
