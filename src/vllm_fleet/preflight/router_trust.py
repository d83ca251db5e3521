"""A router whose worker endpoints take no key runs only where the inventory says so.

sglang-router's worker endpoints take the control keys (one per engine host, revocable, each
change audited). vllm-router's (``/add_worker``, ``/remove_worker``) take none: any host that
reaches its port can add a worker of its own and receive every client's prompts. The catalog
says which release is which (``authenticates_control``); such a router is refused unless the
router host's ``fleet_router.accept_unauthenticated_control`` is true. The router role
asserts the same when it runs on its own.
"""

from __future__ import annotations

from collections.abc import Mapping

from vllm_fleet.preflight.checks import Finding

IMPL = "fleet_router.impl"
ACCEPT = "accept_unauthenticated_control"


def check_open_control_planes(
    routers: Mapping[str, object], releases: Mapping[str, object]
) -> list[Finding]:
    """``routers``: router host -> its fleet_router settings; ``releases``: the catalog's
    fleet_router_releases. An unknown implementation is the router role's to refuse."""
    findings = []
    for host, given in routers.items():
        settings = given if isinstance(given, Mapping) else {}
        impl = str(settings.get("impl") or "sglang")
        release = releases.get(impl)
        if not isinstance(release, Mapping) or release.get("authenticates_control", False):
            continue
        if settings.get(ACCEPT) is True:
            continue
        findings.append(
            Finding(
                host,
                IMPL,
                impl,
                "takes no key on its worker endpoints (authenticates_control: false in "
                "catalog/routers.yml): any host that reaches its port can add a worker and "
                "receive every client's prompts, with no per-host key to revoke and no audit log",
                f"use impl: sglang, or set fleet_router.{ACCEPT}: true with a comment saying "
                "what keeps other hosts off the router's port",
            )
        )
    return findings
