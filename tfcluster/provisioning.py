"""How a gcp cluster's VMs get their capacity: the provisioning model (standard, Spot, Flex-start),
the reservation they may consume, and the `--capacity auto` ladder; the settings' own rules, checked
before anything is created.

Google's rules these follow (read 2026-11-26):
- Compute's Scheduling.provisioningModel is STANDARD, SPOT, FLEX_START or RESERVATION_BOUND
  (compute.v1.json). Flex-start VMs (Dynamic Workload Scheduler) run "for up to seven days", at a
  discount, "consume preemptible quota", and at the end of their run duration are stopped or
  deleted per the termination action (https://cloud.google.com/compute/docs/instances/about-flex-start-vms;
  https://cloud.google.com/ai-hypercomputer/docs/consumption-models). They exist for "all
  accelerator-optimized machine types (except A4X and G4)": not for an N1 with attached T4 or V100.
- a3-highgpu-1g, -2g and -4g: "you must create instances by using Spot VMs or Flex-start VMs"
  (https://cloud.google.com/compute/docs/gpus, A3 High).
- Reservations: a VM consumes one whose properties it matches; ANY_RESERVATION (Compute's default)
  takes one that does not require targeting, SPECIFIC_RESERVATION names one, NO_RESERVATION none;
  "You can't consume a reservation to create ... Spot VMs or preemptible instances"
  (https://cloud.google.com/compute/docs/instances/reservations-consume), and Google's Flex-start
  requests set NO_RESERVATION (https://cloud.google.com/ai-hypercomputer/docs/create/create-vm).
- A DENSE reservation (Reservation.deploymentType, the blocks A3 capacity comes in) is consumed only
  by RESERVATION_BOUND VMs: Compute refuses others with "Instances consuming DENSE reservations must
  use provisioningModel RESERVATION_BOUND" (skypilot-org/skypilot#9771, fixed by #9779 reading
  deploymentType). On-demand VMs on one are made RESERVATION_BOUND.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tfcluster.errors import ConfigError

STANDARD, SPOT, FLEX_START = "standard", "spot", "flex-start"
MODELS = (STANDARD, SPOT, FLEX_START)
# Compute's name of each (Scheduling.provisioningModel).
COMPUTE_MODEL = {STANDARD: "STANDARD", SPOT: "SPOT", FLEX_START: "FLEX_START"}
# Words for a line: "on-demand", "Spot", "Flex-start".
WORDS = {STANDARD: "on-demand", SPOT: "Spot", FLEX_START: "Flex-start"}
# --reservation: any (Compute's default, an open matching reservation if there is one), none, or a name.
ANY, NONE = "any", "none"
# A reservation's name (Reservation.name's pattern in compute.v1.json).
RESERVATION_NAME = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")
AUTO = "auto"
# Flex-start's run duration, in seconds: "between 10 minutes and seven days" (the create-vm page's API tabs).
FLEX_RUN_SECONDS = (600, 7 * 24 * 3600)
FLEX_PAGE = "https://cloud.google.com/compute/docs/instances/about-flex-start-vms"

# The flags' help (tfcluster/cli.py: `up` and `check`).
UP_HELP = {
    "spot": "gcp: SPOT VMs (cheaper; may be stopped by Google); --provisioning spot",
    "provisioning": "gcp, vertex: standard (default), spot, or flex-start (waits for capacity, runs at most 7 days, "
                    "discounted; A2, A3 and G2 types)",
    "reservation": "gcp: the reservation on-demand VMs consume: any (default), none, or its name",
    "capacity": "gcp: auto tries, per zone, a matching reservation, Spot (with --spot), on-demand, then Flex-start",
    "capacity_wait": "gcp, vertex: minutes to wait for Flex-start capacity (default 30; 0 asks once per zone, "
                     "a minute on vertex)"}
CHECK_HELP = {"provisioning": "gcp: check for standard, spot or flex-start VMs",
              "reservation": "gcp: check this reservation (exists in the zone, matches, has room)"}


@dataclass(frozen=True)
class Choice:
    """What capacity a cluster's VMs are made with."""

    # standard, spot or flex-start.
    model: str
    # any, none, or a reservation's name (consumed by standard VMs only).
    reservation: str = ANY
    # The reservation is DENSE: its on-demand VMs are RESERVATION_BOUND (module docstring).
    bound: bool = False

    @property
    def compute_model(self) -> str:
        return "RESERVATION_BOUND" if self.bound and self.model == STANDARD else COMPUTE_MODEL[self.model]

    @property
    def preemptible_quota(self) -> bool:
        """Whether the VMs draw on the PREEMPTIBLE_ quotas where granted (Spot and Flex-start)."""
        return self.model in (SPOT, FLEX_START)

    def affinity(self) -> tuple[str, str]:
        """(consumeReservationType, reservation name or "") for the VMs (the module's variables)."""
        if self.model != STANDARD or self.reservation == NONE:
            return "NO_RESERVATION", ""
        if self.reservation == ANY:
            return "ANY_RESERVATION", ""
        return "SPECIFIC_RESERVATION", self.reservation

    def describe(self) -> str:
        """For a line: "Flex-start", "on-demand on reservation r1", "Spot"."""
        kind, name = self.affinity()
        return WORDS[self.model] + (f" on reservation {name}" if name else "") + (
            " (DENSE: RESERVATION_BOUND)" if self.bound else "")


def flex_start_machine(machine_type: str) -> bool:
    """Whether Flex-start VMs exist for the machine type (accelerator-optimized: A2, A3, G2 here)."""
    return not machine_type.startswith("n1-")


def parse(values: dict[str, Any], machine_type: str, gpu: str, spot: bool) -> dict[str, Any]:
    """The provisioning settings from ``values`` (provisioning, reservation, capacity,
    capacity_wait_minutes), checked against the machine type; ``spot`` is --spot (a synonym of
    --provisioning spot, and with --capacity auto what allows Spot in the ladder)."""
    model = str(values.get("provisioning") or STANDARD).strip().lower()
    if model not in MODELS:
        raise ConfigError(f"provisioning must be one of {', '.join(MODELS)} (got {values.get('provisioning')!r}); "
                          "set --provisioning or tfcluster.provisioning")
    if spot and model == FLEX_START:
        raise ConfigError("--spot and --provisioning flex-start ask for two provisioning models; keep one "
                          "(--spot is --provisioning spot)")
    model = SPOT if spot else model
    capacity = str(values.get("capacity") or "").strip().lower()
    if capacity not in ("", AUTO):
        raise ConfigError(f"capacity must be auto or empty (got {values.get('capacity')!r}); --capacity auto tries, in "
                          "each zone, a matching reservation, Spot (with --spot), on-demand, then Flex-start")
    if capacity == AUTO and model == FLEX_START:
        raise ConfigError("--capacity auto picks the provisioning model per zone (a reservation, Spot with --spot, "
                          "on-demand, then Flex-start); drop --provisioning flex-start, or drop --capacity auto to "
                          "ask for Flex-start only")
    if model == FLEX_START and not flex_start_machine(machine_type):
        raise ConfigError(f"Flex-start VMs exist only for accelerator-optimized machine types (A2, A3, G2: --gpu a100, "
                          f"a100-80gb, h100 or l4), not {machine_type} with {gpu}; use --provisioning standard or spot "
                          f"({FLEX_PAGE})")
    reservation = str(values.get("reservation") or ANY).strip()
    if reservation.lower() in (ANY, NONE):
        reservation = reservation.lower()
    elif not RESERVATION_NAME.fullmatch(reservation):
        raise ConfigError(f"reservation must be any, none or a reservation's name such as my-h100s (got "
                          f"{values.get('reservation')!r})")
    if reservation not in (ANY, NONE) and model != STANDARD:
        raise ConfigError(f"reservation {reservation}: only on-demand VMs consume reservations (Spot VMs cannot, and "
                          f"Flex-start VMs use none; https://cloud.google.com/compute/docs/instances/reservations-consume); "
                          "drop --reservation, or use --provisioning standard")
    try:
        wait = float(str(values.get("capacity_wait_minutes", 30)).strip())
    except ValueError:
        wait = -1.0
    if not 0 <= wait <= 1440:
        raise ConfigError(f"capacity_wait_minutes must be minutes from 0 (ask once in each zone) to 1440 (got "
                          f"{values.get('capacity_wait_minutes')!r}); set --capacity-wait or tfcluster.capacity_wait_minutes")
    return {"provisioning": model, "spot": model == SPOT, "reservation": reservation, "capacity": capacity,
            "capacity_wait_minutes": wait}


def preemptible_quota(settings) -> bool:
    """Whether the cluster's quota is judged as Spot's (the PREEMPTIBLE_ forms where granted): Spot and
    Flex-start VMs draw on them, and so may a --capacity auto ladder that reaches Spot or Flex-start."""
    flex = settings.provisioning == FLEX_START or (settings.capacity == AUTO and flex_start_machine(settings.machine_type))
    return settings.spot or flex


def spot_only_allowed(model: str, capacity: str, spot: bool) -> bool:
    """Whether a machine type offered only as Spot or Flex-start (a3-highgpu-1g/2g/4g) may be asked for."""
    return model in (SPOT, FLEX_START) or capacity == AUTO


def flex_run_seconds(seconds: int) -> int:
    """A Flex-start VM's run duration: at most Google's seven days. ConfigError under its 10 minutes."""
    low, high = FLEX_RUN_SECONDS
    if seconds < low:
        raise ConfigError(f"a Flex-start VM must run at least 10 minutes (the cluster's budget or max_run_hours gives "
                          f"{seconds} s); raise --budget, or use --provisioning standard or spot ({FLEX_PAGE})")
    return min(seconds, high)
