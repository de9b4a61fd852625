"""Compact placement for multi-VM GPU clusters (Google's rules, tfcluster/backends/gcp/zones/placement.py
cites each), and the TF_CONFIG order by where Compute put the VMs (tfcluster/tfconfig.py)."""

from __future__ import annotations

import json

from tfcluster.backends.gcp.zones.placement import decide
from tfcluster.tfconfig import render_all, spread, topology_order


def test_compact_placement_follows_googles_rules_and_the_plan_says_why_in_one_line():
    for family in ("g2", "a2", "a3"):
        placed = decide(family, 4, "STANDARD")
        assert placed.compact and placed.line.startswith(f"placement: compact (COLLOCATED), 4 {family.upper()} VMs")
        assert "harder to get" in placed.line
    assert decide("a3", 2, "SPOT").compact  # No restriction on Spot in the pages read.
    n1 = decide("n1", 4)
    assert not n1.compact and n1.line == ("placement: none: N1 (T4, V100) does not support compact placement "
                                          "policies, so the VMs land anywhere in the zone")
    assert not decide("a2", 1).compact  # One VM: nothing to place close.
    assert not decide("a2", 151).compact and "at most 150 VMs" in decide("a2", 151).line
    reserved = decide("a3", 4, "STANDARD", reservation="dense-h100")
    assert not reserved.compact and "reservation dense-h100's own" in reserved.line
    assert not decide("a3", 4, "FLEX_START").compact
    off = decide("g2", 4, enabled=False)
    assert not off.compact and "compact_placement = false" in off.line
    assert all("\n" not in decide(f, n, p).line for f in ("n1", "g2") for n in (1, 3) for p in ("SPOT", "STANDARD"))


def _topology(cluster: str, block: str, subblock: str, host: str) -> dict:
    # compute.v1 ResourceStatusPhysicalHostTopology's fields, as strings (the discovery document's types).
    return {"cluster": cluster, "block": block, "subblock": subblock, "host": host}


def test_workers_are_ordered_by_physical_host_topology_where_compute_fills_it():
    # VM index 0..3: the index order puts the two sub-blocks' VMs alternately on the ring.
    topologies = [_topology("c1", "b7", "s2", "h9"), _topology("c1", "b7", "s1", "h3"),
                  _topology("c1", "b7", "s2", "h1"), _topology("c1", "b7", "s1", "h4")]
    order = topology_order(topologies)
    assert order == [1, 3, 2, 0]
    assert spread(topologies) == "4 VMs on 1 block, 2 sub-blocks"
    # The same hosts after a restart (Compute reports the same topology): the same chief.
    assert topology_order([dict(t) for t in topologies])[0] == 1
    endpoints = [f"10.0.0.{index + 2}:2222" for index in range(4)]
    chief = json.loads(render_all([endpoints[i] for i in order])[0])
    assert chief["cluster"]["chief"] == ["10.0.0.3:2222"] and chief["task"] == {"type": "chief", "index": 0}
    # Without a topology on every VM (most VMs without a compact policy), the VM's index decides.
    assert topology_order([topologies[0], None, topologies[2], {}]) == [0, 1, 2, 3]
    assert topology_order([None, None]) == [0, 1] and spread([None, None]) == ""
