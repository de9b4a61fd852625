"""Compact placement for multi-VM GPU clusters: whether a cluster gets a ``google_compute_resource_policy``
with ``group_placement_policy { collocation = "COLLOCATED" }``, and the one line `up`'s plan says about it.

Google's rules, each with its source (pages read 2026-11-28 through excerpts):
- Series: "Supported machine types" of a compact placement policy are "A4X Max, A4X, A4, A3 Ultra,
  A3 Mega, A3 High, A3 Edge, A2, G4, G2" (AI Hypercomputer, "Compact placement policy and workload
  policy overview", https://docs.cloud.google.com/ai-hypercomputer/docs/placement-policy-and-workload-policy);
  Compute's placement page lists "A2, C2, G2, C2D, N2, N2D" for compact policies
  (https://cloud.google.com/compute/docs/instances/define-instance-placement, "Limitations"). N1, where
  tfcluster's T4 and V100 run, is in neither list: those clusters get no policy, and the plan says so.
- VM count: a compact policy "supports up to 150 VMs" (define-instance-placement, "Limitations"); a
  single VM has nothing to be placed near. ``vmCount`` is left unset: "Google does not recommend that you
  use this field unless ... you want your policy to work only if it contains this exact number of VMs"
  (compute.v1 ResourcePolicyGroupPlacementPolicy.vmCount).
- Host maintenance: compact policies are "only available for VMs configured to TERMINATE" on host
  maintenance (define-instance-placement); GPU VMs always are (terraform/instances.tf's locals).
- Reservations: a compact policy can be used "only with single-project reservations" (not shared ones,
  not ones with committed-use discounts; define-instance-placement), and a reservation of dense
  capacity brings its own placement (GoogleCloudPlatform/cluster-toolkit#3362): a cluster that consumes
  a reservation gets no policy of tfcluster's.
- Flex-start: VMs created together with it "might be densely colocated based on best-effort
  availability" (the AI Hypercomputer overview); whether a compact policy may be added to Flex-start
  VMs of every series is not in the excerpts read, so tfcluster adds none and says why.
- Spot: no restriction on Spot VMs was found in the pages read; Spot clusters of a supported series get
  the policy. A policy can make capacity harder to get (GoogleCloudPlatform/cluster-toolkit#2420): the
  plan says so. Compute's refusal to place them is a capacity answer (errors.PLACEMENT): `--capacity auto`
  moves on from it as from a stock-out.
"""

from __future__ import annotations

from dataclasses import dataclass

# tfcluster's families (tfcluster/gpus.py) whose series support compact placement.
COMPACT_FAMILIES = ("g2", "a2", "a3")
MAX_VMS = 150


@dataclass(frozen=True)
class Placement:
    """The decision for one cluster."""

    # True: the cluster gets a COLLOCATED group placement policy.
    compact: bool
    # The plan's one line about it.
    line: str


def decide(family: str, vms: int, provisioning: str = "STANDARD", reservation: str = "",
           enabled: bool = True, gpus: int = 1) -> Placement:
    """``family``: "n1", "g2", "a2", "a3"; ``provisioning``: STANDARD, SPOT or FLEX_START;
    ``reservation``: the reservation the VMs consume ("" for none); ``enabled``: the setting
    (compact_placement, on by default); ``gpus``: per VM (a CPU cluster gets no policy of tfcluster's)."""
    series = family.upper()
    if gpus < 1:
        return Placement(False, "placement: none (compact placement is for GPU clusters)")
    if vms < 2:
        return Placement(False, "placement: one VM, nothing to place close")
    if not enabled:
        return Placement(False, "placement: compact placement turned off (compact_placement = false); the VMs "
                                "land anywhere in the zone")
    if family not in COMPACT_FAMILIES:
        return Placement(False, f"placement: none: {series} (T4, V100) does not support compact placement "
                                "policies, so the VMs land anywhere in the zone")
    if reservation:
        return Placement(False, f"placement: the reservation {reservation}'s own (a compact policy is not added to "
                                "VMs that consume a reservation)")
    if provisioning == "FLEX_START":
        return Placement(False, "placement: Flex-start's own (VMs created together are placed close on a "
                                "best-effort basis); no compact policy is added")
    if vms > MAX_VMS:
        return Placement(False, f"placement: none: a compact policy holds at most {MAX_VMS} VMs ({vms} asked)")
    return Placement(True, f"placement: compact (COLLOCATED), {vms} {series} VMs placed close together; a placement "
                           "policy can make them harder to get (compact_placement = false turns it off)")


def for_settings(settings, dense: str = "") -> Placement:
    """The decision for a cluster's settings (tfcluster/config.py); ``dense``: the DENSE reservation
    `--reservation any` may consume (dense_under_any), whose VMs get no policy (terraform's locals: they are
    RESERVATION_BOUND) because its blocks place them (GoogleCloudPlatform/cluster-toolkit#3362)."""
    named = settings.reservation if settings.reservation not in ("any", "none") else ""
    model = {"flex-start": "FLEX_START", "spot": "SPOT"}.get(settings.provisioning,
                                                             "SPOT" if settings.spot else "STANDARD")
    decision = decide(settings.machine_type.split("-")[0], settings.workers, model, named, settings.compact_placement,
                      settings.gpu_count)
    if dense and decision.compact:
        return Placement(True, f"placement: the DENSE reservation {dense}'s own where --reservation any takes it (its "
                               "blocks place the VMs; no compact policy is added there); else " + decision.line[11:])
    return decision


def dense_under_any(settings, api) -> str:
    """The DENSE reservation (Reservation.deploymentType) that `--capacity auto --reservation any` would take on
    its reservation rung (capacity.steps: reservations.usable, matching with room for every VM), as
    "NAME in ZONE"; "" when none, or when the reservations cannot be read (the ladder says so then)."""
    from tfcluster import gpus
    from tfcluster.backends.gcp.zones import reservations

    if settings.reservation != "any" or settings.capacity != "auto":
        return ""
    accelerators = reservations.vm_accelerators(settings.machine_type, gpus.gpu(settings.gpu).accelerator,
                                                settings.gpu_count)
    for zone in list(settings.zones) or [settings.zone]:
        try:
            held = reservations.read(api, zone)
        except Exception:  # noqa: BLE001 - unreadable: the ladder's own line says so.
            continue
        for found in held:
            if found.dense and found.free >= settings.workers \
                    and found.mismatch(settings.machine_type, accelerators) is None:
                return f"{found.name} in {zone}"
    return ""


def topology(api, zone: str, name: str) -> dict | None:
    """The VM's resourceStatus.physicalHostTopology, read from Compute (see topology_of)."""
    return topology_of(api.get_instance(zone, name))


def topology_of(instance) -> dict | None:
    """An Instance's resourceStatus.physicalHostTopology (cluster, block, subblock, host), or None where
    Compute reports none (the fields are output only, filled for VMs it placed by a policy)."""
    found = instance.resource_status.physical_host_topology
    values = {level: getattr(found, level, "") for level in ("cluster", "block", "subblock", "host")}
    return values if all(values.values()) else None
