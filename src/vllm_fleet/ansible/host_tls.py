"""Filters of the host_tls role: the controller side of a host certificate.

Filters run on the controller, where the fleet CA's key is; what reaches them from a host is
its public key, its signing request and its current certificate, never its private key.
"""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError

from vllm_fleet.ansible.addresses import bind_address, fleet_address
from vllm_fleet.tls.ca import CaError, FleetCa, load_ca, renewal_reason


def identity(
    host: str,
    hostvars: Mapping[str, Any],
    facts: Mapping[str, Any] | None = None,
    vip: bool = True,
) -> dict[str, list[str]]:
    """What the host's certificate names: its inventory name, the address the fleet reaches
    it on (fleet_address, else ansible_host) as an IP address or a DNS name, the address its
    listeners bind (from its facts, where the play gathered them: a host without an address
    in the inventory binds its default one), a router host's VIP (clients reach whichever
    router holds it there), and the loopback the host's own checks call its listeners on.
    ``vip=False``: not the VIP, for the engines' certificate, whose key the engine's user
    holds (on a host that is also a router it must not vouch for the routers' address)."""
    names, addresses = [host], []
    own = hostvars[host]
    candidates = [fleet_address(host, hostvars)]
    if facts and "all_ipv4_addresses" in facts:
        # No address to bind: the roles that bind refuse it, naming the fix.
        with contextlib.suppress(ValueError):
            candidates.append(bind_address(host, hostvars, facts))
    router = own.get("fleet_router")
    router_vip = router.get("vip") if isinstance(router, dict) else None
    vip_address = router_vip.get("address") if isinstance(router_vip, dict) else None
    if vip and "routers" in own.get("group_names", []) and vip_address:
        candidates.append(str(vip_address))
    candidates += ["localhost", "127.0.0.1"]
    for address in candidates:
        try:
            ip = str(ipaddress.ip_address(address))
        except ValueError:
            if address not in names:
                names.append(address)
        else:
            if ip not in addresses:
                addresses.append(ip)
    return {"names": names, "addresses": addresses}


def _ca(ca_dir: str) -> FleetCa:
    try:
        return load_ca(Path(ca_dir))
    except CaError as err:
        raise AnsibleFilterError(f"fleet CA: {err}") from err


def renewal(
    cert_pem: str, ca_dir: str, public_key_pem: str, names: list[str], addresses: list[str]
) -> str:
    """Why the host's certificate must be issued again; "" when it is still good."""
    reason = renewal_reason(
        cert_pem.encode() if cert_pem else None,
        _ca(ca_dir),
        public_key_pem.encode(),
        list(names),
        list(addresses),
    )
    return reason or ""


def issue(csr_pem: str, ca_dir: str, names: list[str], addresses: list[str], days: int) -> str:
    """The host certificate for the request's key, for the inventory's names and addresses."""
    try:
        return _ca(ca_dir).issue(csr_pem.encode(), list(names), list(addresses), int(days)).decode()
    except CaError as err:
        raise AnsibleFilterError(f"fleet CA: {err}") from err


def ca_certificate(ca_dir: str) -> str:
    """The fleet CA's certificate (PEM), checked with its key."""
    return _ca(ca_dir).cert_pem.decode()


FILTERS = {
    "host_tls_identity": identity,
    "host_tls_renewal": renewal,
    "host_tls_issue": issue,
    "host_tls_ca_certificate": ca_certificate,
}
