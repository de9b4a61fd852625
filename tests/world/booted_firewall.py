"""Compute's firewall rules as one machine's netfilter input (iptables-restore), for
tests/world/booted.py. The semantics, from https://cloud.google.com/firewall/docs/firewalls and
https://cloud.google.com/vpc/docs/firewalls (VPC firewall rules):
- implied rules: deny all ingress, allow all egress; only INGRESS rules are modelled;
- a rule belongs to one network and applies to that network's instances that carry one of its
  targetTags, or to all of them when it has none;
- its sources: sourceRanges (CIDRs), or sourceTags, which match "the primary internal IP address"
  of instances in the network carrying one of the tags; with both, either matches;
- allowed / denied: IPProtocol (tcp, udp, icmp, all, or a number) and ports ("22", "1000-2000",
  none meaning every port);
- the lowest priority number wins (default 1000), a deny beats an allow of the same priority, and
  a rule with disabled=true does not apply;
- the firewall is stateful: replies to an allowed connection are allowed.
Traffic from the metadata server is always allowed on Google (it is not subject to firewall
rules); here its replies are replies to the VM's own connections.
"""

from __future__ import annotations


def _last(url: str | None) -> str:
    return (url or "").rstrip("/").rsplit("/", 1)[-1]


def _network_of(state, record: dict) -> str:
    """The network of the instance's first interface: given, or its subnetwork's."""
    interface = (record.get("body", {}).get("networkInterfaces") or [{}])[0]
    if interface.get("network"):
        return _last(interface["network"])
    subnetwork = state.resources.get("subnetworks", {}).get(_last(interface.get("subnetwork")), {})
    return _last(subnetwork.get("network"))


def _tags_of(record: dict) -> set[str]:
    return set((record.get("body", {}).get("tags") or {}).get("items") or [])


def _matches(rule: dict, protocol_rules: list[dict], source: str, verdict: str) -> list[str]:
    lines = []
    for allowed in protocol_rules:
        protocol = str(allowed.get("IPProtocol", "all")).lower()
        match = f"-s {source}" + ("" if protocol == "all" else f" -p {protocol}")
        ports = [str(port).replace("-", ":") for port in allowed.get("ports") or []]
        if ports and protocol in ("tcp", "udp", "sctp"):
            match += f" -m multiport --dports {','.join(ports)}"
        lines.append(f"-A INPUT {match} -j {verdict}")
    return lines


def iptables_rules(state, name: str) -> str:
    """The filter table of instance ``name``'s network namespace (state.lock held by the caller
    or not: it only reads)."""
    record = state.instances[name]
    network, tags = _network_of(state, record), _tags_of(record)
    firewalls = [rule for rule in state.resources.get("firewalls", {}).values()
                 if _last(rule.get("network")) == network and rule.get("direction", "INGRESS") == "INGRESS"
                 and not rule.get("disabled") and (not rule.get("targetTags") or tags & set(rule["targetTags"]))]
    members = {other: (_tags_of(r), r.get("internal_ip")) for other, r in state.instances.items()
               if _network_of(state, r) == network and r.get("internal_ip")}
    lines = ["*filter", ":INPUT DROP [0:0]", ":FORWARD DROP [0:0]", ":OUTPUT ACCEPT [0:0]",
             "-A INPUT -i lo -j ACCEPT", "-A INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT"]
    # Sorted by priority, denies first within one: the first match decides, as Google's order does.
    for rule in sorted(firewalls, key=lambda r: (int(r.get("priority", 1000)), "allowed" in r, r["name"])):
        sources = list(rule.get("sourceRanges") or [])
        sources += sorted(ip for tagset, ip in members.values() if tagset & set(rule.get("sourceTags") or []))
        verdict, protocols = ("DROP", rule["denied"]) if rule.get("denied") else ("ACCEPT", rule.get("allowed", []))
        for source in sources:
            lines += _matches(rule, protocols, source, verdict)
    return "\n".join(lines + ["COMMIT", ""])
