"""Changes that cannot be made safely, refused before any host changes.

Preflight reads what each engine host serves now (its engine settings files) and compares it
with what the inventory asks for across the whole fleet (every engine host of the inventory,
not only those a ``--limit`` selected):

- a served name that is served now and that no group serves afterwards: every client still
  asking for it would get 404. The safe sequence adds the new model beside the old one, moves
  the clients, then retires the old name by listing it in ``fleet_retired_served_names``
  (or the new model takes over the old one's served name, a rolling change);
- a name listed there that the inventory still serves (the list would hide the next mistake);
- one served name given to two different models: the routers would mix their answers;
- more than one served name behind a router whose release cannot route by model
  (``multi_model: false`` in catalog/routers.yml). The router role runs the others in their
  multi-model mode when the fleet serves more than one name; in the regular mode a router
  sends a request to any engine whatever model it names (measured with sglang-router 0.3.2
  and two real engines: half of each name's requests got the other model's 404, and those
  404s opened the engines' circuits).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass

from vllm_fleet.preflight.checks import Finding, HostInput, PreflightResult

RETIRED_KEY = "fleet_retired_served_names"


@dataclass(frozen=True)
class RunningGroup:
    host: str
    group: str
    served_name: str


def running_groups(host: str, slurped: object) -> list[RunningGroup]:
    """The groups a host serves now, from the preflight probe's slurp of its engine settings
    (``{results: [{item: {path}, content: base64}]}``); unreadable files are skipped."""
    results = slurped.get("results", []) if isinstance(slurped, Mapping) else []
    found = []
    for result in results if isinstance(results, list) else []:
        if not isinstance(result, Mapping) or "content" not in result:
            continue
        try:
            data = json.loads(base64.b64decode(str(result["content"])))
        except (ValueError, binascii.Error):
            continue
        if isinstance(data, Mapping) and data.get("served_name") and data.get("group"):
            found.append(RunningGroup(host, str(data["group"]), str(data["served_name"])))
    return found


def desired_served_names(
    engine_hosts: Mapping[str, Mapping[str, object]], models: Mapping[str, object]
) -> dict[str, list[str]]:
    """served name -> 'host/group' of every group the inventory has serve it."""
    names: dict[str, list[str]] = {}
    for host, variables in sorted(engine_hosts.items()):
        groups = variables.get("fleet_engine_groups")
        for group in groups if isinstance(groups, list) else []:
            if not isinstance(group, Mapping):
                continue
            model = models.get(str(group.get("model")))
            served = model.get("served_name") if isinstance(model, Mapping) else None
            if isinstance(served, str) and served:
                names.setdefault(served, []).append(f"{host}/{group.get('name')}")
    return names


def check_change(
    running: list[RunningGroup],
    engine_hosts: Mapping[str, Mapping[str, object]],
    models: object,
    retired: object,
    single_name_routers: Mapping[str, str] | None = None,
) -> list[Finding]:
    """``single_name_routers``: router host -> its implementation, for routers that cannot
    route by model."""
    models = models if isinstance(models, Mapping) else {}
    findings = _shared_names(models, _used_models(engine_hosts))
    retired_names = [str(r) for r in retired] if isinstance(retired, list) else []
    if retired is not None and not isinstance(retired, list):
        findings.append(
            Finding(
                "all",
                RETIRED_KEY,
                retired,
                "must be a list of served names",
                f"write {RETIRED_KEY}: [old-name]",
            )
        )
    desired = desired_served_names(engine_hosts, models)
    if single_name_routers and len(desired) > 1:
        findings.append(_names_behind_routers(desired, single_name_routers))
    now: dict[str, list[RunningGroup]] = {}
    for group in running:
        now.setdefault(group.served_name, []).append(group)
    for name, groups in sorted(now.items()):
        if name in desired or name in retired_names:
            continue
        where = ", ".join(f"{g.host}/{g.group}" for g in groups)
        findings.append(
            Finding(
                groups[0].host,
                "fleet_models.*.served_name",
                name,
                f"served now by {where}, and no engine group serves it after this change: "
                "clients still asking for it would get 404",
                "change it safely: first add the new model beside it (a group or host "
                f"serving each), move the clients, then retire it with {RETIRED_KEY}: [{name}]; "
                f"or give the new model served_name: {name} (it rolls one batch at a time)",
            )
        )
    for name in retired_names:
        if name in desired:
            findings.append(
                Finding(
                    desired[name][0].split("/", 1)[0],
                    RETIRED_KEY,
                    name,
                    f"is still served by {', '.join(desired[name])}",
                    f"remove {name} from {RETIRED_KEY}, or stop serving it",
                )
            )
    return findings


def _names_behind_routers(desired: Mapping[str, list[str]], routers: Mapping[str, str]) -> Finding:
    served = "; ".join(f"{name} by {', '.join(where)}" for name, where in sorted(desired.items()))
    host, impl = sorted(routers.items())[0]
    return Finding(
        host,
        "fleet_router.impl",
        impl,
        f"the engine groups behind the routers ({', '.join(sorted(routers))}) would serve "
        f"{len(desired)} names ({served}), and this router cannot route by model "
        "(multi_model: false in catalog/routers.yml): it would send requests to the other "
        "model's engines, which answer 404",
        "use impl: sglang (its multi-model mode routes each request by the model it names), "
        "or serve one name behind these routers",
    )


def _used_models(engine_hosts: Mapping[str, Mapping[str, object]]) -> set[str]:
    used = set()
    for variables in engine_hosts.values():
        groups = variables.get("fleet_engine_groups")
        for group in groups if isinstance(groups, list) else []:
            if isinstance(group, Mapping):
                used.add(str(group.get("model")))
    return used


def _shared_names(models: Mapping[str, object], used: set[str]) -> list[Finding]:
    """Served names that two models the fleet serves share (an unused entry is harmless)."""
    owners: dict[str, list[str]] = {}
    for key, model in models.items():
        if str(key) not in used:
            continue
        served = model.get("served_name") if isinstance(model, Mapping) else None
        if isinstance(served, str) and served:
            owners.setdefault(served, []).append(str(key))
    return [
        Finding(
            "all",
            f"fleet_models.{keys[1]}.served_name",
            name,
            f"is also the served name of model {keys[0]}: the routers would send a client's "
            "request for it to either model",
            "give each model its own served_name",
        )
        for name, keys in sorted(owners.items())
        if len(keys) > 1
    ]


def check_fleet_change(
    hosts: list[HostInput],
    engine_hosts: Mapping[str, Mapping[str, object]],
    result: PreflightResult,
    single_name_routers: Mapping[str, str] | None = None,
) -> None:
    """Add the change-safety findings to ``result``: ``hosts`` are the probed ones,
    ``engine_hosts`` the variables of every engine host of the inventory,
    ``single_name_routers`` the router hosts that cannot route by model (host -> impl)."""
    running = [g for h in hosts for g in running_groups(h.name, h.engine_settings)]
    first = hosts[0].variables if hosts else {}
    result.errors.extend(
        check_change(
            running,
            engine_hosts,
            first.get("fleet_models"),
            first.get(RETIRED_KEY),
            single_name_routers,
        )
    )
