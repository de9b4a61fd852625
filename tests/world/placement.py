"""Where Compute puts the VMs of a compact placement policy: Instance.resourceStatus.physicalHostTopology.

compute.v1 (the discovery document's ResourceStatusPhysicalHostTopology): cluster ("the global name of
the Compute Engine cluster where the running instance is located"), block ("Instances within the same
block experience low network latency"), subblock, host ("Instances on the same host experience the
lowest possible network latency"), all output only. The world fills them for running instances of a
COLLOCATED group placement policy, and for no other (most VMs without a compact policy report none);
a test plants the slots (``state.placement_slots``: instance name -> (block, sub-block, host)),
else each VM gets its own host in one sub-block, in the order Compute made them.
"""

from __future__ import annotations


def _policies(state, instance: dict) -> list[dict]:
    policies = state.resources.get("resourcePolicies", {})
    links = (instance.get("body") or {}).get("resourcePolicies") or []
    return [policies[link.rstrip("/").rsplit("/", 1)[-1]] for link in links
            if link.rstrip("/").rsplit("/", 1)[-1] in policies]


def collocated(state, instance: dict) -> bool:
    return any((policy.get("groupPlacementPolicy") or {}).get("collocation") == "COLLOCATED"
               for policy in _policies(state, instance))


def resource_status(state, name: str, instance: dict, status: dict) -> dict:
    """``status`` ({"resourceStatus": {...}} or {}) with the instance's topology added where it has one."""
    if instance.get("status") != "RUNNING" or not collocated(state, instance):
        return status
    slots = getattr(state, "placement_slots", None) or {}
    made = sorted(state.instances, key=lambda other: state.instances[other].get("internal_ip", ""))
    block, subblock, host = slots.get(name) or ("b1", "s1", f"h{made.index(name) + 1}")
    topology = {"cluster": f"{instance['zone']}-cluster-1", "block": block, "subblock": subblock, "host": host}
    merged = dict(status.get("resourceStatus") or {})
    merged["physicalHostTopology"] = topology
    return {"resourceStatus": merged}


def refusal(state, project: str, zone: str, body: dict) -> dict | None:
    """The error an insert's operation ends with when Compute cannot place one more VM of a COLLOCATED
    policy close to the others (``state.capacity.placement_room[zone]``: how many more it can; unset, any
    number), else None, taking the room. Compute's words are facts.COMPACT_PLACEMENT_REFUSAL's (a user's
    paste; the code is in doubt, so ``state.capacity.placement_code`` names the way the world runs)."""
    from tests.world import facts

    rooms = state.capacity.placement_room
    if zone not in rooms or not collocated(state, {"body": body}):
        return None
    if rooms[zone] > 0:
        rooms[zone] -= 1
        return None
    links = set(body.get("resourcePolicies") or [])
    placed = sum(1 for other_name, other in state.instances.items() if other_name != body.get("name")
                 and links & set((other.get("body") or {}).get("resourcePolicies") or []))
    machine = (body.get("machineType") or "").rsplit("/", 1)[-1]
    message = facts.COMPACT_PLACEMENT_REFUSAL.quote.format(room=placed, machine=machine)
    item = {"message": message}
    if state.capacity.placement_code:
        item["code"] = state.capacity.placement_code
    return {"httpErrorStatusCode": 503, "httpErrorMessage": "SERVICE UNAVAILABLE", "error": {"errors": [item]}}
