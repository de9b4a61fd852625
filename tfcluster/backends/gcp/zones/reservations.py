"""Compute Engine reservations a cluster may consume: read them (reservations.get / list), judge one
against the cluster's VMs, and say which one each VM consumes.

Google's rules (https://cloud.google.com/compute/docs/instances/reservations-overview,
.../reservations-consume):
- a VM consumes a reservation in its own zone whose properties it matches exactly: the machine type
  and the GPUs (an N1's attached accelerators, type and count; an A2/A3/G2 type's come with it); the
  reservation holds `specificReservation.count` VMs, `inUseCount` of them in use (int64 fields,
  left out of an answer when 0);
- a VM with ANY_RESERVATION (Compute's default) takes a matching reservation that does not set
  `specificReservationRequired`; one that sets it is consumed only by VMs that name it
  (SPECIFIC_RESERVATION), and one that does not cannot be named ("Specified reservations [...] can not
  be targeted as specificReservationRequired is not set", skypilot-org/skypilot#3327);
- a DENSE one (deploymentType) only by RESERVATION_BOUND VMs ("Instances consuming DENSE reservations
  must use provisioningModel RESERVATION_BOUND", skypilot-org/skypilot#9771): tfcluster makes them so;
- only a READY reservation is consumed ("it requires reservation to be in READY state",
  kubernetes/autoscaler#6006);
- Spot VMs cannot consume reservations (reservations-consume, Limitations);
- a running VM on a reservation names it in resourceStatus.reservationConsumptionInfo.consumedReservation
  (compute.v1.json);
- "You're charged for the reserved resources at the same on-demand rate as running VMs ... A VM
  consuming a reservation doesn't incur separate charges" (reservations-overview): a reserved VM
  costs nothing more while the reservation exists.
"""

from __future__ import annotations

from dataclasses import dataclass

from tfcluster.backends.base import Finding
from tfcluster.provisioning import ANY, NONE


@dataclass(frozen=True)
class Held:
    """One reservation as Compute describes it."""

    name: str
    zone: str
    machine_type: str
    # instanceProperties.guestAccelerators: ((type, count), ...), sorted.
    accelerators: tuple
    count: int
    in_use: int
    # Only VMs that name it consume it.
    specific_required: bool
    status: str
    # deploymentType DENSE: consumed only by RESERVATION_BOUND VMs.
    dense: bool = False

    @property
    def free(self) -> int:
        return max(0, self.count - self.in_use) if self.status == "READY" else 0

    def mismatch(self, machine_type: str, accelerators: tuple) -> str | None:
        """Why the cluster's VMs cannot consume it (None when they can)."""
        if self.machine_type != machine_type:
            return f"it holds {self.machine_type}, the cluster's VMs are {machine_type}"
        if tuple(sorted(self.accelerators)) != tuple(sorted(accelerators)):
            theirs = ", ".join(f"{n} x {t}" for t, n in self.accelerators) or "no attached GPUs"
            ours = ", ".join(f"{n} x {t}" for t, n in accelerators) or "no attached GPUs"
            return f"it holds {self.machine_type} with {theirs}, the cluster's VMs have {ours}"
        return None


def held_of(reservation, zone: str) -> Held:
    """A google-cloud-compute Reservation as a Held."""
    specific = reservation.specific_reservation
    properties = specific.instance_properties
    return Held(name=reservation.name, zone=zone, machine_type=properties.machine_type,
                accelerators=tuple(sorted((a.accelerator_type.rsplit("/", 1)[-1], a.accelerator_count)
                                          for a in properties.guest_accelerators)),
                count=int(specific.count or 0), in_use=int(specific.in_use_count or 0),
                specific_required=bool(reservation.specific_reservation_required),
                status=reservation.status or "READY", dense=reservation.deployment_type == "DENSE")


def vm_accelerators(machine_type: str, accelerator: str, gpu_count: int) -> tuple:
    """The attached GPUs a reservation must list for the cluster's VMs (none for A2, A3, G2 types)."""
    return ((accelerator, gpu_count),) if machine_type.startswith("n1-") and gpu_count else ()


def read(api, zone: str, name: str | None = None) -> list[Held]:
    """The zone's reservations (one, by name: [] when it does not exist)."""
    from google.api_core import exceptions
    from google.cloud import compute_v1

    client = compute_v1.ReservationsClient(**api.client_kwargs)
    if name:
        try:
            return [held_of(client.get(project=api.project, zone=zone, reservation=name), zone)]
        except exceptions.NotFound:
            return []
    return [held_of(item, zone) for item in client.list(project=api.project, zone=zone)]


def usable(found: list[Held], wanted: str, machine_type: str, accelerators: tuple,
           workers: int) -> tuple[str, str, bool]:
    """(the reservation to ask for: a name, ANY or NONE; the line saying why; whether it is DENSE) among a
    zone's ``found``: the named one (``wanted``) or, for ANY, the first matching one with room for every VM.
    Under --capacity auto, ANY also takes one that requires targeting, by naming it: whoever reserved
    capacity and asks tfcluster to find some expects it used (docs/google-cloud.md, Reservations)."""
    if wanted == NONE:
        return NONE, "--reservation none", False
    fits = [r for r in found if (wanted == ANY or r.name == wanted) and r.mismatch(machine_type, accelerators) is None]
    roomy = [r for r in fits if r.free >= workers]
    if not roomy:
        near = (f"{fits[0].name} has {fits[0].free} of {fits[0].count} free, the cluster needs {workers}" if fits else
                "; ".join(f"{r.name}: {r.mismatch(machine_type, accelerators)}" for r in found) or "the zone has none")
        return "", f"no matching reservation with room ({near})", False
    best = roomy[0]
    name = best.name if best.specific_required else ANY
    return name, f"reservation {best.name} ({best.free} of {best.count} free)", best.dense


def finding(api, zone: str, name: str, machine_type: str, accelerators: tuple, workers: int) -> Finding:
    """`check`'s line for a named reservation: it exists in the zone, matches, may be named, has room."""
    found = read(api, zone, name)
    subject = f"reservation {name}"
    if not found:
        others = [r.name for r in read(api, zone)]
        return Finding(subject, False, f"not in zone {zone} (it has {', '.join(others) or 'no reservation'}); "
                                       "a reservation is zonal: use its zone, or `--reservation any`")
    held = found[0]
    why = held.mismatch(machine_type, accelerators)
    if why:
        return Finding(subject, False, f"{why}: a VM consumes only a reservation it matches exactly; pick its "
                                       "machine type and GPUs, or another reservation")
    if not held.specific_required:
        return Finding(subject, False, "it is consumed automatically (specificReservationRequired is not set), and "
                                       "Compute refuses to target it by name: use `--reservation any`")
    if held.status != "READY":
        return Finding(subject, False, f"it is {held.status}, not READY: wait for it, or use another")
    if held.free < workers:
        return Finding(subject, False, f"{held.free} of its {held.count} VMs are free, the cluster needs {workers}: "
                                       "free some (delete VMs that consume it) or use fewer --workers")
    return Finding(subject, True, f"in {zone}, {held.machine_type}, {held.free} of {held.count} free"
                   + ("; DENSE: its VMs are made RESERVATION_BOUND, as Compute requires" if held.dense else ""))


def consumed(vm) -> str:
    """The reservation a VM consumes ("" when none): resourceStatus.reservationConsumptionInfo."""
    link = vm.resource_status.reservation_consumption_info.consumed_reservation if vm.resource_status else ""
    return link.rsplit("/", 1)[-1] if link else ""


def check_finding(settings, accelerator: str, zones: list[str]) -> Finding:
    """`check`'s line for --reservation NAME: the first of ``zones`` where it can take the cluster, else why not
    (in the first zone that has it, or: in none of them)."""
    from google.api_core import exceptions

    from tfcluster.backends.gcp.cloud.compute import ComputeApi

    name = settings.reservation
    accelerators = vm_accelerators(settings.machine_type, accelerator, settings.gpu_count)
    try:
        api = ComputeApi(settings.project)
        found = [finding(api, zone, name, settings.machine_type, accelerators, settings.workers) for zone in zones]
    except exceptions.GoogleAPICallError as error:
        return Finding(f"reservation {name}", None, f"cannot read it ({getattr(error, 'reason', None) or error.code}: "
                                                    f"{(error.message or '')[:160]}); ask for roles/compute.viewer")
    except (OSError, ValueError) as error:
        return Finding(f"reservation {name}", None, f"cannot read it ({type(error).__name__}: {str(error)[:160]})")
    for result in found:
        if result.holds:
            return result
    there = [result for result in found if not result.detail.startswith("not in zone")]
    if there or len(found) == 1:
        return (there or found)[0]
    return Finding(f"reservation {name}", False, f"not in zones {', '.join(zones)}: a reservation is zonal; list its "
                                                 "zone first in tfcluster.zones, or use `--reservation any`")


def free_by_zone(api, machine_type: str, accelerators: tuple) -> dict[str, int] | None:
    """Zone -> VMs of this machine type free in the project's matching READY reservations (one
    reservations.aggregatedList); None when they cannot be read (a permission, the API)."""
    from google.api_core import exceptions
    from google.cloud import compute_v1

    client = compute_v1.ReservationsClient(**api.client_kwargs)
    try:
        scoped = client.aggregated_list(request=compute_v1.AggregatedListReservationsRequest(project=api.project))
        found: dict[str, int] = {}
        for key, items in scoped:
            zone = key.rsplit("/", 1)[-1]
            for item in items.reservations:
                held = held_of(item, zone)
                if held.mismatch(machine_type, accelerators) is None:
                    found[zone] = found.get(zone, 0) + held.free
        return found
    except exceptions.GoogleAPICallError:
        return None
