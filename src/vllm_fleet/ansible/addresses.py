"""How fleet hosts reach each other: by address, not by a name looked up per connection.

A router reaches its engines, an engine and its watchdog reach the routers, and Prometheus
reaches every target at the host's ``fleet_address``, else its ``ansible_host``, else its
inventory name. The field reports advise addresses: a name is resolved again on every new
connection, so a DNS outage would stop a restarted engine from rejoining the routers.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any


def fleet_address(host: str, hostvars: Mapping[str, Any]) -> str:
    """The address other fleet hosts reach ``host`` on."""
    own = hostvars[host]
    for key in ("fleet_address", "ansible_host"):
        value = own.get(key)
        if isinstance(value, str) and value:
            return value
    return host


def fleet_addresses(hosts: list[str], hostvars: Mapping[str, Any]) -> list[str]:
    return [fleet_address(h, hostvars) for h in hosts]


def url_host(address: str) -> str:
    """``address`` as a URL's host: an IPv6 literal in brackets."""
    try:
        return f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    except ValueError:
        return address


def bind_address(host: str, hostvars: Mapping[str, Any], facts: Mapping[str, Any]) -> str:
    """The address ``host``'s fleet listeners (engines, metrics, the router without a VIP,
    Prometheus, the model cache) bind: the one the fleet reaches it at (``fleet_address``)
    when that is an address the host has, else its default IPv4 address.

    Never loopback by default: a listener bound there would pass the host's own checks and be
    unreachable by every other host. A host without either (its default route gone, as after
    an interface was taken down and up) is refused, naming the fix.
    """
    advertised = fleet_address(host, hostvars)
    try:
        literal = str(ipaddress.ip_address(advertised))
    except ValueError:
        literal = ""
    if "all_ipv4_addresses" not in facts:
        # A play that gathers no facts (the routers' drain healing, validation alone) binds
        # nothing itself: the fleet address when it is one, else loopback.
        return literal or "127.0.0.1"
    own = {*facts.get("all_ipv4_addresses", []), *facts.get("all_ipv6_addresses", [])}
    if literal and literal in own:
        return literal
    default = (facts.get("default_ipv4") or {}).get("address")
    if isinstance(default, str) and default:
        return default
    raise ValueError(
        f"host {host}: no address to bind its listeners to: the address the fleet reaches it at "
        f"({advertised!r}, from fleet_address / ansible_host) is not one of its addresses "
        f"({', '.join(sorted(own)) or 'none'}) and it has no default IPv4 route. Set "
        "fleet_address to the host's private address."
    )


def router_url(address: str, port: int | str, tls: bool | str = False) -> str:
    """A router's client URL at ``address``: https when the routers serve TLS (fleet_router_tls)."""
    scheme = "https" if _truthy(tls) else "http"
    return f"{scheme}://{url_host(address)}:{int(port)}"


def router_targets(
    addresses: list[str], impl: str, port: int | str, tls: bool | str = False, ca_file: str = ""
) -> list[dict[str, str]]:
    """The routers an engine host calls (joins, leaves, the watchdog's reconciliation): one
    {impl, url} per router address, with the fleet CA's certificate that alone is trusted
    when the routers serve TLS."""
    targets = []
    for address in addresses:
        target = {"impl": str(impl), "url": router_url(address, port, tls)}
        if _truthy(tls):
            target["ca_file"] = str(ca_file)
        targets.append(target)
    return targets


def _truthy(value: bool | str) -> bool:
    # Ansible hands a templated boolean over as the string "True" or "False".
    return value is True or (
        isinstance(value, str) and value.strip().lower() in {"true", "yes", "1"}
    )
