"""A VIP change the routers cannot roll: a new VRRP router id (fleet_router.vip.vrid).

site.yml restarts the routers one at a time. A router restarted with a new
``virtual_router_id`` runs a VRRP instance of its own: it hears no master of that instance,
so it takes the VIP, while the master of the old instance keeps it. Until the last router
moves, two hosts answer ARP for one address and clients' connections split between them.
So the change is refused, with the sequence that makes it safely: take the VIP down (remove
fleet_router.vip; clients use a router's own address meanwhile), then add it back with the
new id.

The id a router runs now comes from the probe's slurp of its keepalived.conf, when the router
role wrote it (a keepalived configured by someone else is not the fleet's VIP).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from vllm_fleet.preflight.checks import Finding, HostInput

VRID = "fleet_router.vip.vrid"
KEEPALIVED_CONF = "keepalived.conf"
# The router role's instance (roles/router/templates/keepalived.conf.j2).
OUR_INSTANCE = "vrrp_instance vllm_fleet_router"
VRID_LINE = re.compile(r"^\s*virtual_router_id\s+(\d{1,3})\s*$", re.MULTILINE)


def keepalived_vrid(text: str) -> str | None:
    """The VRRP router id of the router role's instance in this keepalived.conf."""
    if OUR_INSTANCE not in text:
        return None
    found = VRID_LINE.search(text)
    return found.group(1) if found else None


def wanted_vrid(variables: Mapping[str, object], default: int) -> int | None:
    """The id the inventory gives the VIP; None when it has no VIP."""
    router = variables.get("fleet_router")
    vip = router.get("vip") if isinstance(router, Mapping) else None
    if not isinstance(vip, Mapping):
        return None
    value = vip.get("vrid", default)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def check_vrid(host: HostInput, now: str | None, default: int) -> list[Finding]:
    wanted = wanted_vrid(host.variables, default)
    if now is None or wanted is None or str(wanted) == now:
        return []
    return [
        Finding(
            host.name,
            VRID,
            wanted,
            f"changes the VIP's VRRP router id (this router runs {now}): restarted one at a "
            "time, a router on the new id and one on the old would both hold the VIP, two "
            "hosts answering for one address",
            "move the clients to a router's own address, remove fleet_router.vip and run "
            "site.yml --tags router (keepalived stops on every router), then add the VIP back "
            f"with the new vrid and run it again; or keep vrid: {now}",
        )
    ]
