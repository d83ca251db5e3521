"""The routers' virtual IP (fleet_router.vip): what makes one a valid VRRP address."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence

FIX = "fleet_router.vip"


def whole(value: object, low: int, high: int) -> bool:
    """A whole number in [low, high]; true and false are not numbers."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def vip_problems(vip: Mapping[str, object], routers: Mapping[str, str]) -> list[str]:
    """What is wrong with this VIP for these routers (router host -> its primary IPv4
    address); empty when keepalived can hold it on any of them.

    The VIP must sit in each router's own subnet (VRRP moves it by ARP, so it only works on
    one link), differ from every host's address, and the VRRP settings must be in range.
    """
    problems: list[str] = []
    prefix = vip.get("prefix")
    if not whole(prefix, 8, 32):
        problems.append(
            f"{FIX}.prefix={prefix!r} must be the VIP's prefix length, 8 to 32 (e.g. 24)"
        )
        prefix = 32
    for key, low, high in (("vrid", 1, 255), ("advert_interval_seconds", 1, 255)):
        value = vip.get(key)
        if not whole(value, low, high):
            problems.append(f"{FIX}.{key}={value!r} must be a whole number from {low} to {high}")
    try:
        address = ipaddress.IPv4Address(str(vip.get("address")))
    except ValueError:
        problems.append(
            f"{FIX}.address={vip.get('address')!r} is not an IPv4 address; give a free address in "
            "the routers' subnet"
        )
        return problems
    if not (address.is_private and not address.is_loopback and not address.is_link_local):
        problems.append(
            f"{FIX}.address={address} is not a private address: the routers' VIP is for the fleet "
            "network (put a load balancer or NAT in front of it for public clients)"
        )
    for host, own in sorted(routers.items()):
        network = ipaddress.IPv4Network(f"{own}/{prefix}", strict=False)
        if str(address) == own:
            problems.append(
                f"{FIX}.address={address} is {host}'s own address; the VIP must be a free address"
            )
        elif address not in network:
            problems.append(
                f"{FIX}.address={address} is not in {host}'s subnet {network} (VRRP moves the "
                "address by ARP on one link); choose a free address in it"
            )
        elif (
            address in (network.network_address, network.broadcast_address)
            and int(str(prefix)) < 31
        ):
            problems.append(f"{FIX}.address={address} is {network}'s network or broadcast address")
    return problems


def peers(routers: Mapping[str, str], host: str) -> Sequence[str]:
    """The other routers' addresses, which this host's keepalived exchanges VRRP with."""
    return [address for name, address in sorted(routers.items()) if name != host]


def handover(
    readiness: Sequence[Mapping[str, object]],
    drains: Sequence[Mapping[str, object]],
    self_status: object,
) -> dict[str, list[str]]:
    """Which other routers could take the VIP from this one now, and why each other cannot.

    readiness and drains are Ansible's loop results over the other routers: a GET of each
    one's /readiness from here, and a stat of each one's drain flag on it; self_status is
    this router's own /readiness status. A router can take the VIP when it answers, is not
    being drained itself, and has engines - unless this router has none either (then it is
    as good a holder as this one).
    """
    self_ready = str(self_status) == "200"
    drained = {str(r.get("item")): r for r in drains}
    eligible: list[str] = []
    refused: list[str] = []
    for result in readiness:
        host = str(result.get("item"))
        status = int(str(result.get("status", -1)))
        drain = drained.get(host, {})
        stat = drain.get("stat")
        if drain.get("unreachable") or not isinstance(stat, Mapping):
            refused.append(f"{host}: unreachable ({drain.get('msg', 'no answer')})".strip())
        elif stat.get("exists"):
            refused.append(f"{host}: being drained itself (a restart is under way there)")
        elif status not in (200, 503):
            refused.append(f"{host}: its router does not answer ({result.get('msg', status)})")
        elif status == 503 and self_ready:
            refused.append(f"{host}: its router has no engines (/readiness 503)")
        else:
            eligible.append(host)
    return {"eligible": eligible, "refused": refused}
