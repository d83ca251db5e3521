"""Filters of the engine_firewall role: who may connect to the engines' ports."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any

from vllm_fleet.ansible.addresses import fleet_address


def firewall_sources(
    hosts: list[str], hostvars: Mapping[str, Any], extra: Iterable[str] = ()
) -> dict[str, list[str]]:
    """The addresses and networks allowed in, by family, and the hosts (or extra entries)
    that are no address: nftables matches addresses, so those are refused by the role."""
    out: dict[str, list[str]] = {"ipv4": [], "ipv6": [], "names": []}
    entries = [(h, fleet_address(h, hostvars)) for h in dict.fromkeys(hosts)]
    entries += [(str(e), str(e)) for e in extra]
    for label, value in entries:
        try:
            network = ipaddress.ip_network(value, strict=False)
        except ValueError:
            out["names"].append(label if label == value else f"{label} ({value})")
            continue
        text = str(network.network_address) if network.num_addresses == 1 else str(network)
        family = "ipv4" if network.version == 4 else "ipv6"
        if text not in out[family]:
            out[family].append(text)
    return out


def unreached(failed_result: Mapping[str, Any]) -> str:
    """What a failed reachability check says: the router -> port pairs that timed out, from
    the loop's results, else the failed task's own message."""
    pairs = [
        f"{r['item'][0]} could not connect to port {r['item'][1]}"
        for r in failed_result.get("results", [])
        if r.get("failed") and isinstance(r.get("item"), list | tuple) and len(r["item"]) == 2
    ]
    return "; ".join(pairs) or str(
        failed_result.get("msg", "a router could not reach an engine port")
    )


FILTERS = {
    "engine_firewall_unreached": unreached,
    "engine_firewall_sources": firewall_sources,
    "engine_firewall_address": fleet_address,
}
