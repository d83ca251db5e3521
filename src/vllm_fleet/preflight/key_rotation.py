"""Key changes the routers would refuse mid-run, refused before any host changes.

site.yml restarts the routers before the engine hosts. A router restarted with a new control
key refuses the old one, which the engine hosts' watchdogs and engines still present until
their own batch: their joins get 401, the restarted routers stay without engines, and the
next router cannot hand its VIP over. So the old key is listed in
``fleet_router_control_keys_retiring`` for one run (the routers accept both while the engine
hosts move to the new one), and emptied by the next.

sglang-router takes a single client key, so a new client key refuses the clients' old one
from each router's restart on: there is no two-key window to offer. Preflight refuses that
change until the operator says, for the one run, that the clients are ready
(``-e fleet_router_client_key_cutover=true``).

Changing the router implementation changes the key clients present: sglang-router checks
its client key, vllm-router passes the client's Authorization header through to the engines,
which check the engine key. Unless the two keys are the same, that is a client-key cut-over
too, refused the same way.

The keys a host uses now come from the probe's slurp of its router.env and watchdog.env, and
the router it runs from its router.json; keys are compared, never shown.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping

from vllm_fleet.env_file import parse_env
from vllm_fleet.preflight.checks import REDACTED, Finding, HostInput
from vllm_fleet.preflight.vip_change import KEEPALIVED_CONF, check_vrid, keepalived_vrid
from vllm_fleet.router.control_keys import host_control_key

CONTROL = "fleet_router_control_key"
RETIRING = "fleet_router_control_keys_retiring"
CLIENT = "fleet_router_client_key"
CUTOVER = "fleet_router_client_key_cutover"
GENERATION = "fleet_router_control_key_generation"
# How far above the inventory's generation a host's key is looked for (a lowered generation).
LOWERED_SEARCH = 64
ENGINE_KEY = "fleet_engine_api_key"
IMPL = "fleet_router.impl"
CONTROL_ENV = "VLLM_FLEET_ROUTER_CONTROL_KEY"
CLIENT_ENV = "VLLM_FLEET_ROUTER_CLIENT_KEY"
TWO_RUNS = (
    f"rotate it in two runs: first set the new key and list the current one in {RETIRING} "
    "(the routers accept both while the engine hosts move to the new one), run site.yml; "
    f"then empty {RETIRING} and run site.yml again"
)


def keys_now(slurped: object) -> dict[str, dict[str, str]]:
    """File name (router.env, watchdog.env, router.json, keepalived.conf) -> its variables (a
    JSON file's top-level strings; keepalived.conf's VRRP id as vrid), from the probe's slurp
    loop (``{results: [{item: path, content: base64}]}``); files absent or unreadable are left
    out."""
    results = slurped.get("results", []) if isinstance(slurped, Mapping) else []
    found = {}
    for result in results if isinstance(results, list) else []:
        if not isinstance(result, Mapping) or "content" not in result:
            continue
        try:
            text = base64.b64decode(str(result["content"]), validate=True).decode()
        except (ValueError, binascii.Error):
            continue
        name = str(result.get("item", "")).rsplit("/", 1)[-1]
        if name == KEEPALIVED_CONF:
            vrid = keepalived_vrid(text)
            found[name] = {} if vrid is None else {"vrid": vrid}
        else:
            found[name] = _json_strings(text) if name.endswith(".json") else parse_env(text)
    return found


def _json_strings(text: str) -> dict[str, str]:
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): v for k, v in data.items() if isinstance(v, str)}


def check_keys(host: HostInput) -> list[Finding]:
    """The key changes on one host that the routers would refuse mid-run."""
    v = host.variables
    findings = []
    files = keys_now(host.key_files)
    presented = files.get("watchdog.env", {}).get(CONTROL_ENV)
    control = v.get(CONTROL)
    later = _later_generation(host.name, v, presented) if presented else None
    if later is not None:
        findings.append(
            Finding(
                host.name,
                GENERATION,
                str(v.get(GENERATION, 0)),
                f"is lower than the generation of the control key this host holds now ({later}): "
                "it would give the host back a key that was revoked",
                f"set {GENERATION}: {later} (or higher, to revoke that one too)",
            )
        )
    elif presented and isinstance(control, str) and not _accepted(host.name, v, presented):
        findings.append(
            Finding(
                host.name,
                CONTROL,
                REDACTED,
                "is not the control key this host's watchdog and engines present now, and "
                f"that key is not in {RETIRING}: the routers restart first and would refuse "
                "this host's engines (401) until its own batch, so the routers would run out "
                "of engines and could not hand their VIP over",
                TWO_RUNS,
            )
        )
    client_now = files.get("router.env", {}).get(CLIENT_ENV)
    client = v.get(CLIENT)
    cut_over = v.get(CUTOVER) in (True, "true", "True", "yes")
    changed = bool(client_now) and isinstance(client, str) and client != client_now
    impl_now = files.get("router.json", {}).get("impl")
    impl = _impl(v)
    if impl_now and impl_now != impl:
        if not cut_over and _clients_present(v, impl_now, client_now) != _clients_present(
            v, impl, client
        ):
            findings.append(_impl_finding(host.name, impl_now, impl))
    elif changed and impl == "sglang" and not cut_over:
        findings.append(
            Finding(
                host.name,
                CLIENT,
                REDACTED,
                "is not the client key this router accepts now, and sglang-router accepts "
                "one client key: from this router's restart on, every client still "
                "presenting the current key gets 401",
                "give the clients the new key first (a client holding both keys can retry "
                f"a 401 with the other), then run once with -e {CUTOVER}=true; to keep the "
                f"current key, set {CLIENT} back to it",
            )
        )
    return findings


def _accepted(host: str, variables: Mapping[str, object], presented: str) -> bool:
    """Whether the routers, once restarted, still accept the key this host presents now, or
    the host's own earlier key is being revoked on purpose (its generation was raised)."""
    retiring = variables.get(RETIRING)
    fleet_keys = [
        k
        for k in [variables.get(CONTROL), *(retiring if isinstance(retiring, list) else [])]
        if isinstance(k, str)
    ]
    generation = generation_of(variables)
    if generation is None:
        return True  # refused on its own by check_control_generation
    # The fleet's key itself is the operator's identity at the routers: a host that still
    # presents it (rendered before keys were per host) is accepted until its own batch.
    if presented in fleet_keys:
        return True
    return any(
        presented == host_control_key(key, host, g)
        for key in fleet_keys
        for g in range(generation + 1)
    )


def _later_generation(host: str, variables: Mapping[str, object], presented: str) -> int | None:
    """The generation of the host's key now when it is above the inventory's (a lowered
    generation); None otherwise. Searched up to a bound: generations are raised one at a time."""
    control, generation = variables.get(CONTROL), generation_of(variables)
    if not isinstance(control, str) or generation is None:
        return None
    for later in range(generation + 1, generation + 1 + LOWERED_SEARCH):
        if presented == host_control_key(control, host, later):
            return later
    return None


def generation_of(variables: Mapping[str, object]) -> int | None:
    """The host's control-key generation; None when it is not a non-negative integer."""
    value = variables.get(GENERATION, 0)
    # A template or -e on the command line gives the digits as a string.
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def check_control_generation(host: HostInput) -> list[Finding]:
    value = host.variables.get(GENERATION, 0)
    if generation_of(host.variables) is not None:
        return []
    return [
        Finding(
            host.name,
            GENERATION,
            str(value),
            "must be a non-negative integer: the generation of this host's router control key",
            f"set {GENERATION}: 1 (one more than before) to revoke the host's current key, "
            "or remove it for 0",
        )
    ]


def _clients_present(variables: Mapping[str, object], impl: str, client_key: object) -> object:
    """The key a client must present to be served through this router."""
    return client_key if impl == "sglang" else variables.get(ENGINE_KEY)


def _impl_finding(host: str, now: str, new: str) -> Finding:
    what = {
        "sglang": f"sglang-router checks {CLIENT}",
        "vllm": f"vllm-router passes the client's key to the engines, which check {ENGINE_KEY}",
    }
    return Finding(
        host,
        IMPL,
        new,
        f"changes the key clients present (this host runs {now} now): {what[now]}; "
        f"{what[new]}. From this router's restart on, clients still presenting the key "
        f"{now} takes get 401",
        "give the clients the key the new router takes first (a client holding both keys "
        f"can retry a 401 with the other), then run once with -e {CUTOVER}=true; or keep "
        f"impl: {now}",
    )


def _impl(variables: Mapping[str, object]) -> str:
    router = variables.get("fleet_router")
    impl = router.get("impl") if isinstance(router, Mapping) else None
    return str(impl or "sglang")


def _retiring_list(host: str, variables: Mapping[str, object]) -> list[Finding]:
    retiring = variables.get(RETIRING)
    if retiring is None:
        return []
    keys = retiring if isinstance(retiring, list) else None
    if (
        keys is None
        or not all(isinstance(k, str) and len(k) >= 16 for k in keys)
        or variables.get(CONTROL) in keys
        or variables.get(CLIENT) in keys
    ):
        return [
            Finding(
                host,
                RETIRING,
                REDACTED,
                "must be a list of the control keys being rotated out: each at least 16 "
                f"characters, and neither {CONTROL} nor {CLIENT}",
                f"list only the previous control key, e.g. {RETIRING}: "
                "['{{ vault_previous_router_control_key }}']",
            )
        ]
    return []


def check_fleet_keys(hosts: list[HostInput], default_vrid: int) -> list[Finding]:
    """Every host's findings, and the retiring list's once (it is the fleet's setting);
    ``default_vrid`` is the router role's, for a VIP that sets none."""
    with_list = [h for h in hosts if h.variables.get(RETIRING) is not None]
    findings = _retiring_list(with_list[0].name, with_list[0].variables) if with_list else []
    for host in hosts:
        findings += check_control_generation(host)
        findings += check_keys(host)
        vrid_now = keys_now(host.key_files).get(KEEPALIVED_CONF, {}).get("vrid")
        findings += check_vrid(host, vrid_now, default_vrid)
    return findings
