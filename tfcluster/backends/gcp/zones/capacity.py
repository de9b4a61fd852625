"""Where a new cluster's VMs get their capacity: one provisioning model in each zone of `zones`
(--provisioning), or the `--capacity auto` ladder, and a bounded wait for Flex-start capacity.

The ladder, per zone of `zones` / `--zone auto`, in order: a matching reservation with room for
every VM (reservations.py), Spot (only with --spot: the run may be preempted), on-demand, then
Flex-start (accelerator-optimized types only). Each step that cannot take the cluster prints one
line saying why, and what it made there is removed first: a cluster is made whole or not at all.
The bucket and the registry never move (failover.py pins them).

The Flex-start wait, and how it is bounded (the decision issue 40 asked for):
- Google holds a Flex-start request only when it carries params.requestValidForDuration (90 s to
  2 h: the VM is PENDING meanwhile); without one, "Compute Engine only allocates resources if they
  are immediately available" (https://cloud.google.com/ai-hypercomputer/docs/create/create-vm;
  https://cloud.google.com/compute/docs/instances/instance-lifecycle).
- hashicorp/google 7.46.1, which terraform/ pins, cannot send it: its `params` has only
  resource_manager_tags (tests/provider_schema/google-7.46.1.json), and it sends "params": {}. So a
  terraform create timeout bounds nothing: Compute answers such a request at once.
- Creating Flex-start VMs with the compute client instead would take them out of terraform/: either
  a second description of the instance in Python (two sources of truth for every VM setting, the
  module's users losing Flex-start), or an import whose read-back the real provider must match
  exactly. Not done.
- So terraform makes Flex-start VMs as Google's zone-flexible mode describes ("specify 0 s ... If
  the VM creation request fails because resources are unavailable, then retry the request in a
  different zone"), and tfcluster bounds the wait itself: it asks again in every zone the ladder
  allows Flex-start in, with backoff (capacity_wait_seconds, doubling, at most 5 minutes), until
  --capacity-wait (capacity_wait_minutes) has passed, saying what it waits for and how long is left.
  Ctrl-C, or `invoke down` (which signals the waiting `up`, holds.end_waiting_up), ends the wait between
  tries; what was made is removed and nothing bills but the bucket and network, which `down` removes.
  When the pinned provider can send request_valid_for_duration, each try can carry the time left
  (at most 2 h) and Compute's own queue takes over from these tries.
- A refusal on quota is not a lack of capacity: waiting does not bring quota. It drops the zones
  failover.after_refusal says share the quota (the region's, or every zone for a project-wide one), and
  when no Flex-start zone is left the wait ends at once, naming the quota.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable

from tfcluster import gpus, ledger
from tfcluster.backends.gcp.zones import failover, reservations
from tfcluster.backends.gcp.cloud.errors import zone_refusal
from tfcluster.backends.gcp.cloud.terraform import Terraform, TerraformError
from tfcluster.errors import ClusterError
from tfcluster.provisioning import (ANY, AUTO, FLEX_START, NONE, SPOT, STANDARD, Choice, flex_run_seconds,
                                    flex_start_machine)

# Compute's words when a reservation will not take a VM (tests/world/capacity.py cites each).
RESERVATION_WORDS = ("Could not find the given reservation", "specificReservationRequired is not set",
                     "must use provisioningModel RESERVATION_BOUND",
                     "must use ReservationAffinity of", "requires reservation to be in READY state",
                     "does not match the instance's properties", "has no available resources")
BACKOFF_LIMIT_SECONDS = 300.0
# How often a wait looks for Ctrl-C or `invoke down`'s signal between tries.
SLICE_SECONDS = 0.5


def model_variables(choice: Choice) -> dict:
    """terraform/'s variables for a provisioning choice (`spot` kept for the module's older callers)."""
    kind, name = choice.affinity()
    return {"spot": choice.model == SPOT, "provisioning_model": choice.compute_model,
            "reservation_affinity": kind, "reservation_name": name}


@dataclass(frozen=True)
class Step:
    """One rung of the ladder: a zone and how to get capacity there."""

    zone: str
    choice: Choice
    # What the ladder found for it, for its line ("reservation r1 (2 of 4 free)"), or "".
    note: str = ""

    def name(self) -> str:
        return f"zone {self.zone}, {self.note or self.choice.describe()}"


def steps(settings, api, announce: Callable[[str], None]) -> list[Step]:
    """The steps `up` tries, in order: the one model in each zone, or the ladder (module docstring)."""
    zones = list(settings.zones) or [settings.zone]
    if settings.capacity != AUTO:
        return [Step(zone, Choice(settings.provisioning, settings.reservation,
                                  _dense(api, zone, settings.reservation))) for zone in zones]
    model = gpus.gpu(settings.gpu)
    shape = (model.machine_types or {}).get(settings.machine_type)
    standard_ok = not (shape and shape.spot_only)
    accelerators = reservations.vm_accelerators(settings.machine_type, model.accelerator, settings.gpu_count)
    found: list[Step] = []
    for zone in zones:
        if standard_ok and settings.reservation != NONE:
            wanted = None if settings.reservation == ANY else settings.reservation
            try:
                held = reservations.read(api, zone, wanted)
            except Exception as error:  # noqa: BLE001 - a reservation that cannot be read is a step skipped, said.
                announce(f"zone {zone}, reservation: cannot read the zone's reservations ({str(error)[:120]}); "
                         "skipped")
                held = None
            if held is not None:
                name, why, dense = reservations.usable(held, settings.reservation, settings.machine_type,
                                                       accelerators, settings.workers)
                if name:
                    found.append(Step(zone, Choice(STANDARD, name, dense), why))
                else:
                    announce(f"zone {zone}, reservation: {why}; skipped")
        if settings.spot:
            found.append(Step(zone, Choice(SPOT)))
        if standard_ok:
            found.append(Step(zone, Choice(STANDARD, NONE)))
        else:
            announce(f"zone {zone}, on-demand: {settings.machine_type} is offered only as Spot or Flex-start; skipped")
        if flex_start_machine(settings.machine_type):
            found.append(Step(zone, Choice(FLEX_START)))
    return found


def _dense(api, zone: str, reservation: str) -> bool:
    """Whether --reservation NAME is a DENSE reservation in ``zone`` (its VMs are then RESERVATION_BOUND);
    False when there is none, or it cannot be read (Compute's refusal then says why)."""
    if reservation in (ANY, NONE):
        return False
    try:
        return any(held.dense for held in reservations.read(api, zone, reservation))
    except Exception:  # noqa: BLE001 - unreadable: the insert's own refusal names the reservation.
        return False


def refusal(stderr: str) -> str | None:
    """Why a step could not take the cluster, from terraform's error text: the zone's capacity or
    quota (errors.zone_refusal), or a reservation's refusal; None for any other error."""
    why = zone_refusal(stderr)
    if why:
        return why
    for words in RESERVATION_WORDS:
        if words in stderr:
            line = next(part for part in stderr.replace("│", "\n").splitlines() if words in part).strip()
            return f"the reservation refused the VMs ({line.split(': ', 1)[-1][:200]})"
    return None


class Cancelled(Exception):
    """Ctrl-C (SIGINT), or `invoke down` (SIGTERM), asked the waiting `up` to stop."""


class Maker:
    """Runs the steps for one `up`: each step's apply, the removal of what a refused step made, and the
    Flex-start wait. ``record(zone)`` saves the cluster's record before anything is made in a zone;
    ``sync(zone, own)`` brings the cost ledger up to date (the VMs' minutes); ``waiting(text, until, since)``
    saves what `up` waits for in the record (`status` shows it; "" clears it)."""

    def __init__(self, terraform: Terraform, api, variables: dict, settings, announce: Callable[[str], None],
                 record: Callable[[str], None], sync: Callable[[str, str], None],
                 waiting: Callable[[str, float], None], sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.time):
        self.terraform, self.api, self.variables, self.settings = terraform, api, variables, settings
        self.announce, self.record, self.sync, self.waiting = announce, record, sync, waiting
        self.sleep, self.clock = sleep, clock
        self.cancelled = ""  # Who asked the wait to end ("Ctrl-C", "`invoke down`"), between two tries.
        self.zone = ""
        self.pending: tuple = ()  # (what, until, since) while waiting: kept in the record across tries.
        self.quota_refused: list = []  # (Flex-start step, "no quota (METRIC)") for each refused on quota.

    def make(self, ladder: list[Step]) -> Step:
        """Apply the steps in turn; the first that takes the cluster is returned (ClusterError when none
        does, after the Flex-start wait)."""
        refused = []
        for index, step in enumerate(ladder):
            covered = self._covered(step)
            if covered:
                self.announce(f"{step.name()}: skipped ({covered})")
                continue
            why = self._try(step)
            if why is None:
                if len(ladder) > 1:
                    self.announce(f"{step.name()}: the cluster's VMs are created here")
                return step
            refused.append(f"{step.name()}: {why[0]}")
            after = f"; trying {ladder[index + 1].name()}" if index + 1 < len(ladder) else ""
            self.announce(f"{step.name()}: {why[0]}; removed the {why[1]} VM(s) made there{after}")
        flex = [step for step in ladder if step.choice.model == FLEX_START and not self._covered(step)]
        if self.quota_refused and not flex:
            raise ClusterError(self._quota_error())
        if flex:
            return self._wait(flex)
        raise ClusterError(f"no step could take the cluster ({'; '.join(refused)}); no VM is left. Add zones to "
                           "tfcluster.zones (`invoke offers` lists where the GPU is), allow Spot (--spot) or "
                           "Flex-start, or run `invoke up` again later; `invoke down` removes what was created")

    def _try(self, step: Step) -> tuple[str, int] | None:
        """Apply one step; None when it took the cluster, else (why not, VMs removed)."""
        self.zone = step.zone
        changes = {"zone": step.zone, **model_variables(step.choice)}
        self.variables.update(changes)
        self.terraform.set_variables(changes)
        self.record(step.zone)
        self.sync(step.zone, "")  # The step's prices line before its VMs start: each spell at its own model's price.
        if self.pending:  # The record just saved is the cluster's; what `up` waits for stays in it.
            self.waiting(*self.pending)
        line = failover.egress_line(step.zone, self.variables)
        if line:
            self.announce(line)
        try:
            self.terraform.apply()
        except TerraformError as error:
            why = refusal(error.stderr) or ("interrupted" if self.cancelled else None)  # Ctrl-C reached it too.
            if why is None:
                raise
            if step.choice.model == FLEX_START and why.startswith("no quota ("):
                self.quota_refused.append((step, why))
            return why, self._remove()
        return None

    def _covered(self, step: Step) -> str:
        """Why a Flex-start step is not worth a try: it shares a quota a try was refused on
        (failover.after_refusal: the region's, or a project-wide one); "" when it is."""
        for refused, why in self.quota_refused if step.choice.model == FLEX_START else ():
            if refused.zone == step.zone:
                return f"{why} here already"
            rest, said = failover.after_refusal([refused.zone, step.zone], 0, why)
            if step.zone not in rest:
                return said
        return ""

    def _quota_error(self) -> str:
        refused = "; ".join(f"{step.name()}: {why}" for step, why in self.quota_refused)
        return (f"Flex-start was refused on quota, not capacity ({refused}), and waiting does not bring quota: no VM "
                "is left. Flex-start VMs draw on the PREEMPTIBLE_ quotas: `invoke check` names each with what is "
                "free; request more in the console (IAM & Admin > Quotas & System Limits), or add zones of another "
                "region; `invoke down` removes the bucket and network")

    def _remove(self) -> int:
        """Remove the VMs made in the current zone, their minutes kept in the cost ledger."""
        self.sync(self.zone, "")  # Their starts, before they go.
        removed = failover.remove_vms(self.terraform, self.api, self.zone, self.settings.cluster)
        self.sync(self.zone, ledger.DELETE)
        return removed

    def _wait(self, flex: list[Step]) -> Step:
        """Ask again for Flex-start capacity in ``flex``'s zones, with backoff, until --capacity-wait ends."""
        settings = self.settings
        minutes = settings.capacity_wait_minutes
        until = self.clock() + minutes * 60
        what = (f"Flex-start capacity for {settings.workers} x {settings.machine_type} in "
                f"{', '.join(step.zone for step in flex)}")
        if minutes <= 0:  # --capacity-wait 0: each zone was asked once.
            raise ClusterError(f"no {what} (--capacity-wait 0: asked once); no VM is left. Run `invoke up` again "
                               "later, give --capacity-wait minutes to wait, add zones, or allow other provisioning "
                               "(--capacity auto, --spot); `invoke down` removes the bucket and network")
        self.announce(f"waiting for {what}, up to {minutes:g} min (--capacity-wait); Ctrl-C or `invoke down` "
                      "cancels it, and no VM is left")
        delay = float(settings.capacity_wait_seconds)
        previous = self._on_term()
        self.pending = (what, until, self.clock())
        self.waiting(*self.pending)
        try:
            while True:
                left = until - self.clock()
                if left <= 0:
                    break
                pause = min(delay, left)
                self.announce(f"waiting: no {what} yet; next try in {pause:.0f} s ({_minutes(left)} left of "
                              f"--capacity-wait {minutes:g} min)")
                self._pause(pause)
                for step in list(flex):
                    why = self._try(step)
                    if why is None:
                        self.announce(f"{step.name()}: the cluster's VMs are created here, after "
                                      f"{_minutes(minutes * 60 - (until - self.clock()))} of waiting")
                        return step
                    if why[0].startswith("no quota ("):
                        flex = [each for each in flex if not self._covered(each)]
                        if not flex:
                            raise ClusterError(self._quota_error())
                    self._check()
                delay = min(delay * 2, BACKOFF_LIMIT_SECONDS)
        except (KeyboardInterrupt, Cancelled):
            by = self.cancelled or "Ctrl-C"
            removed = self._remove()
            raise ClusterError(f"{by} cancelled the wait for {what}: removed the {removed} VM(s) made there, so none "
                               "is left billing; the bucket and network stay until `invoke down`") from None
        finally:
            self.pending = ()
            self.waiting("", 0.0, 0.0)
            self._restore(previous)
        raise ClusterError(f"no {what} within --capacity-wait {minutes:g} min; no VM is left (the minutes of those "
                           "made and removed are in `invoke costs`). Run `invoke up` again later, raise "
                           "--capacity-wait, add zones, or allow other provisioning (--capacity auto, --spot); "
                           "`invoke down` removes the bucket and network")

    def _pause(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while True:
            self._check()
            left = end - time.monotonic()
            if left <= 0:
                return
            self.sleep(min(SLICE_SECONDS, left))

    def _check(self) -> None:
        if self.cancelled:
            raise Cancelled()

    def _on_term(self):
        """Ctrl-C (SIGINT), or `invoke down` (SIGTERM to a waiting `up`): stop between two tries, never inside
        an apply (a terraform cut short can leave a VM it made out of its state)."""
        if threading.current_thread() is not threading.main_thread():
            return None

        def cancel(signum, frame):
            self.cancelled = "Ctrl-C" if signum == signal.SIGINT else "`invoke down`"

        return {number: signal.signal(number, cancel) for number in (signal.SIGINT, signal.SIGTERM)}

    def _restore(self, previous) -> None:
        for number, handler in (previous or {}).items():
            signal.signal(number, handler)


def run_seconds(settings, seconds: int) -> int:
    """The VMs' run duration: ``seconds``, within Flex-start's 10 minutes to 7 days for Flex-start VMs."""
    return flex_run_seconds(seconds) if settings.provisioning == FLEX_START else seconds


def plan_words(settings) -> str:
    """How `up`'s plan line names the VMs' provisioning: " (SPOT)", " (Flex-start, waiting up to 30 min)"..."""
    if settings.capacity == AUTO:
        rungs = ["a matching reservation"] * (settings.reservation != NONE) + ["Spot"] * settings.spot + [
            "on-demand", f"Flex-start (waiting up to {settings.capacity_wait_minutes:g} min)"]
        return f" (capacity auto, per zone: {', then '.join(rungs)})"
    if settings.provisioning == FLEX_START:
        return f" (Flex-start, waiting up to {settings.capacity_wait_minutes:g} min)"
    named = f" on reservation {settings.reservation}" if settings.reservation not in (ANY, NONE) else ""
    return " (SPOT)" if settings.spot else named


def _minutes(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s"


def waiting_record(what: str, until: float, since: float) -> dict:
    """What a waiting `up` writes in the cluster's record (ClusterState.waiting)."""
    if not what:
        return {}
    return {"what": what, "since": since, "until": until, "pid": os.getpid(), "host": socket.gethostname()}
