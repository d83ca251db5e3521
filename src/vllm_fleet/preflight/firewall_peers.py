"""The engine firewall lets in the routers and monitoring hosts by address: each needs one.

Checked fleet-wide before any host changes (the router play runs before the engines'), so a
router known only by name is refused here, naming it, rather than by the engine_firewall
role after the routers were already changed.
"""

from __future__ import annotations

from collections.abc import Callable

from vllm_fleet.preflight.checks import Finding, HostInput, is_address


def firewall_on(host: HostInput) -> bool:
    return (
        "fleet_engine_groups" in host.variables
        and host.variables.get("fleet_engine_firewall", True) is not False
    )


def check_firewall_peers(
    hosts: list[HostInput], peers: list[str], address_of: Callable[[str], str]
) -> list[Finding]:
    """A finding per router or monitoring host without an IP address, when an engine host of
    this run has its firewall on."""
    guarded = [h.name for h in hosts if firewall_on(h)]
    if not guarded:
        return []
    findings = []
    for peer in dict.fromkeys(peers):
        address = address_of(peer)
        if not is_address(address):
            findings.append(
                Finding(
                    peer,
                    "fleet_address",
                    address,
                    f"the engine firewall on {', '.join(guarded)} lets routers and monitoring "
                    "hosts in by IP address, and this host has none",
                    "set fleet_address to its private IP address (or fleet_engine_firewall: "
                    "false on the engine hosts)",
                )
            )
    return findings
