"""An ``nvidia-smi`` stand-in for hosts of the world that have GPUs, answering as NVIDIA documents.

Sources:
- NVIDIA's nvidia-smi manual, https://docs.nvidia.com/deploy/nvidia-smi: ``--query-gpu=FIELDS`` prints
  one line per GPU, the fields comma-separated in the order asked, and needs ``--format=csv`` (with
  ``noheader`` and ``nounits`` as modifiers); "Some devices and/or environments don't support all
  possible information. Any unsupported data is indicated by a "N/A" in the output", which the CSV
  form writes as ``[N/A]``, and a field the device cannot report as ``[Not Supported]``.
  ``--query-remapped-rows=FIELDS`` is the same for the row remapper's fields.
- NVIDIA's "A100 GPU memory error management", User Visible Statistics
  (https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/user-visible-statistics.html): from A100
  on, memory errors are handled by row remapping, with a "Row remapping pending Boolean" and a
  "Row remapping failure Boolean"; page retirement (``retired_pages.*``, "Dynamic Page Retirement",
  https://docs.nvidia.com/deploy/dynamic-page-retirement/) is the older GPUs' mechanism, so a
  GPU with a remapper answers ``[N/A]`` there, and one without answers ``[N/A]`` for remapped rows.
- An unknown field: "Field "x" is not a valid field to query." and exit 2, as nvidia-smi does.

Each host's GPUs are a JSON list beside the script (``gpus.json``), so a test plants a bad value by
rewriting one field of one GPU on one host (``plant``), and the product reads it through its own
command over SSH.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

# Healthy GPUs as Compute attaches them (names as nvidia-smi prints them on those VMs).
MODELS = {
    "nvidia-l4": ("NVIDIA L4", True),
    "nvidia-tesla-a100": ("NVIDIA A100-SXM4-40GB", True),
    "nvidia-a100-80gb": ("NVIDIA A100-SXM4-80GB", True),
    "nvidia-h100-80gb": ("NVIDIA H100 80GB HBM3", True),
    "nvidia-tesla-t4": ("Tesla T4", False),
    "nvidia-tesla-v100": ("Tesla V100-SXM2-16GB", False),
}

SCRIPT = r'''#!/usr/bin/env python3
# nvidia-smi stand-in (tests/world/nvidia_smi.py, which cites NVIDIA's manual for every answer).
import json, os, sys

gpus = json.load(open(os.path.join(os.path.dirname(os.path.realpath(__file__)), "gpus.json")))
query = fmt = None
kind = "gpu"
for arg in sys.argv[1:]:
    if arg.startswith("--query-gpu="):
        query = arg.split("=", 1)[1]
    elif arg.startswith("--query-remapped-rows="):
        query, kind = arg.split("=", 1)[1], "remapped"
    elif arg.startswith("--format="):
        fmt = arg.split("=", 1)[1].split(",")
    elif arg in ("-L", "--list-gpus"):
        for gpu in gpus:
            print("GPU %s: %s (UUID: %s)" % (gpu["index"], gpu["name"], gpu["uuid"]))
        sys.exit(0)
if query is None or fmt is None or fmt[0] != "csv":
    print("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.", file=sys.stderr)
    sys.exit(2)
fields = query.split(",")
for field in fields:
    if gpus and field not in gpus[0]:
        print('Field "%s" is not a valid field to query.' % field, file=sys.stderr)
        sys.exit(2)
if "noheader" not in fmt:
    print(", ".join(fields))
for gpu in gpus:
    values = []
    for field in fields:
        value = str(gpu[field])
        if "nounits" in fmt:
            value = value.replace(" %", "").replace(" MiB", "")
        values.append(value)
    print(", ".join(values))
'''


def gpu_table(accelerator: str, count: int) -> list[dict]:
    """Healthy GPUs of one model, as the stand-in reports them (every field the product or a test asks)."""
    name, remapper = MODELS[accelerator]
    table = []
    for index in range(count):
        bus = f"00000000:00:{4 + index:02X}.0"
        table.append({
            "index": str(index), "name": name, "uuid": f"GPU-{index:08x}-stand-in", "pci.bus_id": bus,
            "gpu_bus_id": bus, "count": str(count),
            "ecc.errors.uncorrected.volatile.total": "0",
            "retired_pages.pending": "[N/A]" if remapper else "No",
            "remapped_rows.pending": "No" if remapper else "[N/A]",
            "remapped_rows.failure": "No" if remapper else "[N/A]",
            "utilization.gpu": "0 %", "memory.used": "0 MiB",
        })
    return table


def install(folder: Path, accelerator: str = "nvidia-l4", count: int = 1) -> Path:
    """Write the stand-in and its GPUs into ``folder`` (put it on the host's PATH); returns the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gpus.json").write_text(json.dumps(gpu_table(accelerator, count), indent=1))
    script = folder / "nvidia-smi"
    script.write_text(SCRIPT)
    script.chmod(0o755)
    return folder


def plant(folder: Path, index: int, field: str, value: str) -> None:
    """Set one field of GPU ``index`` (a bad value, or a GPU removed with field "" and value "gone")."""
    table = json.loads((folder / "gpus.json").read_text())
    if value == "gone":
        table = [gpu for gpu in table if gpu["index"] != str(index)]
    else:
        table[index][field] = value
    (folder / "gpus.json").write_text(json.dumps(table, indent=1))
    os.utime(folder / "gpus.json")
