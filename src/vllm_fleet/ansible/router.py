"""Filters of the router role."""

from __future__ import annotations

import ipaddress

from ansible.errors import AnsibleFilterError


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


def served_names(groups: list[dict[str, object]], models: dict[str, object]) -> list[str]:
    """The served names of these engine groups' models, each once, sorted (a model preflight
    does not know is preflight's to name, not the router's)."""
    names = set()
    for group in groups:
        model = models.get(str(group.get("model"))) if isinstance(group, dict) else None
        if isinstance(model, dict) and model.get("served_name"):
            names.add(str(model["served_name"]))
    return sorted(names)


FILTERS = {
    "router_address_scope": address_scope,
    "router_served_names": served_names,
}
