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
