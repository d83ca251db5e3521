"""Filters of the router role."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

from vllm_fleet.ansible.addresses import url_host
from vllm_fleet.router.control_keys import host_generations, router_control_keys
from vllm_fleet.router.vip import handover, peers, vip_problems


def address_scope(address: str) -> str:
    """'loopback', 'private' or 'public': who can reach a socket bound to this address.

    A wildcard bind (0.0.0.0, ::) listens on every interface, so it counts as public.
    """
    try:
        ip = ipaddress.ip_address(str(address))
    except ValueError as err:
        raise AnsibleFilterError(f"{address!r} is not an IP address: {err}") from err
    if ip.is_unspecified:
        return "public"
    if ip.is_loopback:
        return "loopback"
    if ip.is_private or ip.is_link_local:
        return "private"
    return "public"


def public_reach(bind_address: str, host_addresses: list[str] | None) -> list[str]:
    """The public addresses a socket bound to bind_address answers on: the address itself
    when it is public. A wildcard bind counts as public itself, unless host_addresses are
    given (a VIP needs the wildcard): then it reaches each public address the host has."""
    if address_scope(bind_address) != "public":
        return []
    if not ipaddress.ip_address(str(bind_address)).is_unspecified or host_addresses is None:
        return [str(bind_address)]
    return [a for a in host_addresses if address_scope(a) == "public"]


def served_names(groups: list[dict[str, object]], models: dict[str, object]) -> list[str]:
    """The served names of these engine groups' models, each once, sorted (a model preflight
    does not know is preflight's to name, not the router's)."""
    names = set()
    for group in groups:
        model = models.get(str(group.get("model"))) if isinstance(group, dict) else None
        if isinstance(model, dict) and model.get("served_name"):
            names.add(str(model["served_name"]))
    return sorted(names)


def router_addresses(
    hosts: list[str], hostvars: Mapping[str, Mapping[str, object]]
) -> dict[str, str]:
    """Router host -> its primary IPv4 address (gathered facts), for the VRRP peers."""
    addresses = {}
    for host in hosts:
        facts = hostvars.get(host, {}).get("ansible_facts", {})
        address = (
            facts.get("default_ipv4", {}).get("address") if isinstance(facts, Mapping) else None
        )
        if not address:
            raise AnsibleFilterError(
                f"router host {host}: no primary IPv4 address in its facts (default_ipv4); "
                "gather its network facts, or give it a default route"
            )
        addresses[host] = str(address)
    return addresses


FILTERS = {
    "router_addresses": router_addresses,
    "router_url_host": url_host,
    "router_vip_peers": peers,
    "router_vip_problems": vip_problems,
    "router_vip_handover": handover,
    "router_address_scope": address_scope,
    "router_public_reach": public_reach,
    "router_served_names": served_names,
    "router_control_keys": router_control_keys,
    "router_control_generations": host_generations,
}
