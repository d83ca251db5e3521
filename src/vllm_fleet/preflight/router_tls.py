"""The routers' client port speaks HTTPS whenever the fleet has a CA; plain HTTP only where
the inventory says so, and then on every host alike.

Clients send their prompts and the client key to the routers' client port, and the engine
hosts send their control keys there to add and remove workers. With a fleet CA
(``fleet_ca_dir``) each router host serves that port with its own certificate from it (role
host_tls) and every fleet client trusts the CA alone. A fleet with routers and no CA is
refused unless ``fleet_router.plain_http`` is true (a lab, or a network that alone keeps
those private); a router release without a TLS listener (``serves_tls: false`` in
catalog/routers.yml) likewise. The routers and the engine hosts must agree, or the engine
hosts would call https where the routers speak http (or the reverse) and never join.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping

from vllm_fleet.preflight.checks import Finding, HostInput

CA = "fleet_ca_dir"
PLAIN = "fleet_router.plain_http"
FIX_CA = (
    "create the fleet CA on the controller with `vllm-fleet ca init DIR` (or put your own "
    f"ca.crt and ca.key there) and set {CA}: DIR in group_vars/all; in a lab, or where the "
    f"network alone keeps prompts and keys private, set {PLAIN}: true"
)


def router_tls(variables: Mapping[str, object]) -> bool | None:
    """Whether this host's routers speak TLS (fleet_router_tls); None: plain_http is no bool."""
    router = variables.get("fleet_router")
    plain = router.get("plain_http", False) if isinstance(router, Mapping) else False
    if not isinstance(plain, bool):
        return None
    ca_dir = variables.get(CA)
    return isinstance(ca_dir, str) and bool(ca_dir) and not plain


def check_router_tls(
    routers: Mapping[str, Mapping[str, object]],
    engines: Mapping[str, Mapping[str, object]],
    releases: Mapping[str, object],
) -> list[Finding]:
    """``routers`` and ``engines``: host -> its variables (fleet_router, fleet_ca_dir);
    ``releases``: the catalog's fleet_router_releases."""
    if not routers:
        return []
    findings: list[Finding] = []
    decided: dict[str, bool] = {}
    for host, variables in {**routers, **engines}.items():
        tls = router_tls(variables)
        router = variables.get("fleet_router")
        plain = router.get("plain_http") if isinstance(router, Mapping) else None
        if tls is None:
            findings.append(
                Finding(host, PLAIN, plain, "must be true or false", "leave it out (TLS)")
            )
            continue
        decided[host] = tls
        if not tls and plain is not True:
            role = "serves" if host in routers else "calls"
            findings.append(
                Finding(
                    host,
                    CA,
                    variables.get(CA),
                    f"is not set, and this host {role} the routers' client port, which speaks "
                    "HTTPS with certificates from the fleet CA (clients' prompts and keys, the "
                    "engine hosts' control keys cross it)",
                    FIX_CA,
                )
            )
    findings.extend(_tls_listeners(routers, decided, releases))
    findings.extend(_agreement(routers, engines, decided))
    return findings


def _tls_listeners(
    routers: Mapping[str, Mapping[str, object]],
    decided: Mapping[str, bool],
    releases: Mapping[str, object],
) -> list[Finding]:
    findings = []
    for host, variables in routers.items():
        router = variables.get("fleet_router")
        impl = str((router.get("impl") if isinstance(router, Mapping) else None) or "sglang")
        release = releases.get(impl)
        if not decided.get(host) or not isinstance(release, Mapping):
            continue
        if release.get("serves_tls", False) is not True:
            findings.append(
                Finding(
                    host,
                    "fleet_router.impl",
                    impl,
                    f"{release.get('release', impl)} has no TLS listener (serves_tls: false in "
                    f"catalog/routers.yml), and this fleet has a CA ({CA}), so its routers must "
                    "speak HTTPS",
                    f"use impl: sglang, or set {PLAIN}: true where the network alone keeps "
                    "prompts and keys private",
                )
            )
    return findings


def _scheme(tls: bool) -> str:
    return "https" if tls else "http"


def _agreement(
    routers: Mapping[str, object], engines: Mapping[str, object], decided: Mapping[str, bool]
) -> list[Finding]:
    speaks = {decided[h] for h in routers if h in decided}
    if not speaks:
        return []
    if len(speaks) > 1:
        mixed = ", ".join(f"{h}: {_scheme(decided[h])}" for h in routers if h in decided)
        return [
            Finding(
                next(iter(routers)),
                PLAIN,
                mixed,
                "the routers disagree on TLS: clients and engine hosts would reach some of them "
                "with the wrong scheme",
                f"set {CA} and {PLAIN} alike for every router (group_vars/all)",
            )
        ]
    tls = speaks.pop()
    return [
        Finding(
            host,
            PLAIN,
            _scheme(decided[host]),
            f"this engine host would call the routers over {_scheme(decided[host])}, and they "
            f"speak {_scheme(tls)}: its engines would never join them",
            f"set {CA} and {PLAIN} for the engine hosts as for the routers (group_vars/all)",
        )
        for host in engines
        if host in decided and host not in routers and decided[host] != tls
    ]


def serving_tls(slurped: object) -> bool | None:
    """Whether the host's router serves TLS now, from the probe's slurp of its router.json
    (``{results: [{item: path, content: base64}]}``); None where no router runs yet."""
    results = slurped.get("results", []) if isinstance(slurped, Mapping) else []
    for result in results if isinstance(results, list) else []:
        if not isinstance(result, Mapping) or "content" not in result:
            continue
        if not str(result.get("item", "")).endswith("/router.json"):
            continue
        try:
            settings = json.loads(base64.b64decode(str(result["content"]), validate=True))
        except (ValueError, binascii.Error):
            return None
        return bool(settings.get("tls")) if isinstance(settings, dict) else None
    return None


def check_scheme_change(hosts: list[HostInput], routers: list[str]) -> list[Finding]:
    """A serving router whose scheme this run would change, refused before any host changes.

    site.yml restarts the routers before the engine hosts, which learn the new scheme only in
    their own batch: a router restarted onto the other scheme would have no engines until
    then, and behind a VIP a router cannot hand the VIP to a peer it reaches with the wrong
    scheme. That is no rolling change, so it is refused rather than half done.
    """
    findings = []
    for host in hosts:
        if host.name not in routers:
            continue
        now, planned = serving_tls(host.key_files), router_tls(host.variables)
        if now is None or planned is None or now == planned:
            continue
        findings.append(
            Finding(
                host.name,
                PLAIN,
                f"{_scheme(now)} now -> {_scheme(planned)}",
                f"this router serves {_scheme(now)} now and the run would restart it onto "
                f"{_scheme(planned)}: the routers restart before the engine hosts learn the new "
                "scheme in their own batches, so the routers would be left without engines in "
                "between (and behind a VIP no router could hand it over); changing a serving "
                "fleet's scheme is not a rolling change yet",
                f"keep this fleet's routers on {_scheme(now)}: set {PLAIN}: "
                f"{'true' if not now else 'false'} (a new fleet, or routers deployed fresh, take "
                "the other scheme)",
            )
        )
    return findings
