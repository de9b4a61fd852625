"""What Vertex AI training costs: its own prices (prices.json beside this file, dated, with its
sources), and the cost ledger's events from the jobs themselves.

A job bills each replica's machine and accelerators from the job's startTime (when it "for the
first time entered the JOB_STATE_RUNNING state") to its endTime (when it entered SUCCEEDED,
FAILED or CANCELLED), in 30-second increments (https://cloud.google.com/vertex-ai/pricing). So
the ledger (tfcluster/ledger.py) gets, for each replica of each job of the cluster, a start at
startTime and a stop at startTime plus the duration rounded up to the next 30 seconds; a job
still running counts to now. A replica's machine is instance "<job id>/<task>" in the ledger.
Spot time preempted is not billed (https://cloud.google.com/vertex-ai/docs/predictions/use-spot-vms:
"You don't pay for the time that the job is in a queue or preempted"); the ledger cannot tell it
from the job's times, so it counts it, which errs high. Each replica's boot disk bills too, at the
price card's own disk rate (prices.json boot_disk_gib_hour). A --budget holds Spot jobs to the on-demand
rate: Vertex AI's Spot discount is its own per accelerator, not the table's flat one (prices.json spot_source).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from tfcluster import gpus, ledger
from tfcluster.backends.vertex.jobspec import ACCELERATORS, job_id, task_of
from tfcluster.backends.vertex.logs import seconds

PRICES = Path(__file__).resolve().parent / "prices.json"


def table() -> dict:
    return json.loads(PRICES.read_text())


def machine_hour(machine_type: str, prices: dict | None = None) -> float:
    """One replica's machine (its vCPUs and memory), per hour, on demand."""
    prices = prices or table()
    vcpus, memory = gpus.shape_of(machine_type)
    family = machine_type.split("-", 1)[0]
    return vcpus * prices["vcpu_hour"][family] + memory * prices["memory_gib_hour"][family]


def replica_rates(machine_type: str, gpu: str, gpu_count: int, spot: bool = False, boot_disk_gb: int = 0,
                  boot_disk_type: str = "pd-ssd") -> dict:
    """One replica's hourly rates in the ledger's shape: {"vm": machine, "gpu": accelerators, "disk": its boot
    disk} (the disk at its own rate, the same on Spot)."""
    prices = table()
    factor = (1 - prices["spot_discount"]) if spot else 1.0
    accelerator = prices["accelerator_hour"][ACCELERATORS[gpu]] * gpu_count if gpu_count else 0.0
    return {"vm": round(machine_hour(machine_type, prices) * factor, 6), "gpu": round(accelerator * factor, 6),
            "disk": round(boot_disk_gb * prices["boot_disk_gib_hour"][boot_disk_type], 6)}


def _rates(config: dict, spot: bool) -> dict:
    return replica_rates(config["machine_type"], config["gpu"], config["gpu_count"], spot,
                         int(config.get("boot_disk_gb") or 0))


def hourly(config: dict, replicas: int) -> float:
    """A job of ``replicas`` replicas, per hour, at the rates in use (Spot when the cluster is)."""
    rates = _rates(config, bool(config["spot"]))
    return replicas * (rates["vm"] + rates["gpu"] + rates["disk"])


def budget_hourly(config: dict, replicas: int) -> float:
    """The rate a --budget is held to: on-demand, Spot or not (module docstring)."""
    return hourly({**config, "spot": False}, replicas)


def billed_seconds(start: float, end: float) -> float:
    """A replica's running time as Vertex AI bills it: rounded up to the next 30-second increment."""
    step = table()["billing_increment_seconds"]
    return math.ceil(max(0.0, end - start) / step) * step


def prices_record(config: dict, replicas: int) -> ledger.Prices:
    prices = table()
    return ledger.Prices(at=time.time(), on_demand=_rates(config, False), spot=_rates(config, True),
                         spot_in_use=bool(config["spot"]), gpu_count=config["gpu_count"], workers=replicas,
                         date=prices["date"], source=f"Vertex AI training prices ({PRICES.name}): "
                                                     f"{prices['source'][:160]}...")


def replicas_of(job: dict) -> list[str]:
    """The task names of a job's replicas, from its worker pools."""
    pools = job.get("jobSpec", {}).get("workerPoolSpecs", [])
    count = sum(int((pool or {}).get("replicaCount") or 0) for pool in pools)
    return [task_of(index) for index in range(count)]


def job_events(job: dict, known: set[tuple[str, str]]) -> list[ledger.Event]:
    """The ledger events a job's times give that the ledger lacks (``known``: (instance, kind) pairs)."""
    if not job.get("startTime"):
        return []  # Never RUNNING: nothing billed (a queued job, or one refused before it started).
    start = seconds(job["startTime"])
    run = job.get("labels", {}).get("tfcluster-run", "")
    found = []
    for task in replicas_of(job):
        instance = f"{job_id(job['name'])}/{task}"
        if (instance, ledger.START) not in known:
            found.append(ledger.Event(start, instance, ledger.START, ledger.OBSERVED, run, "CustomJob.startTime"))
        if job.get("endTime") and (instance, ledger.STOP) not in known:
            stop = start + billed_seconds(start, seconds(job["endTime"]))
            found.append(ledger.Event(stop, instance, ledger.STOP, ledger.OBSERVED, run,
                                      f"CustomJob.endTime {job['endTime']} ({job.get('state')}), billed to the next 30 s"))
    return found
