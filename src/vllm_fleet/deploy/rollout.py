"""How a playbook run moves a host's engine groups: what restarts, what drains first.

The vllm_engine and fleet_upgrade roles call these (through their filter shims) so that the
decision is made from the host's actual state (vllm_fleet.engine.state) and the whole fleet's
inventory, never from what one run happened to change.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any


def restart_plan(
    groups: list[str],
    unit_changed: bool,
    render_results: list[dict[str, object]],
    state_json: str,
) -> dict[str, list[str]]:
    """What the vllm_engine role restarts and which run holds it lifts, for ``groups`` (the
    inventory's): every group when the unit file changed, else those whose files this run
    changed, plus those the host's actual state says are stale or stopped."""
    state = json.loads(state_json) if state_json.strip() else {}
    wanted = set(groups)
    changed = {str(r["item"]["name"]) for r in render_results if r.get("changed")}  # type: ignore[index]
    restart = set(groups) if unit_changed else changed
    restart |= wanted & set(state.get("pending_restart", []))
    return {
        "restart": sorted(restart),
        "run_holds": sorted(wanted & set(state.get("run_holds", []))),
        "operator_holds": sorted(wanted & set(state.get("operator_holds", []))),
    }


def served_name_peers(
    served_name: str,
    engine_hosts: list[str],
    batch_hosts: list[str],
    hostvars: Mapping[str, Any],
    models: Mapping[str, Any],
) -> int:
    """Groups outside this batch that the inventory has serve ``served_name``: all of them
    must be serving it before a group that serves it now is drained. 0 when the name is
    retired (preflight made the operator say so), or when only this batch serves it."""
    batch = set(batch_hosts)
    return sum(
        1
        for host in engine_hosts
        if host not in batch
        for group in hostvars[host].get("fleet_engine_groups", [])
        if models.get(group.get("model"), {}).get("served_name") == served_name
    )


def drain_plan(
    snapshot: list[Mapping[str, Any]],
    *,
    groups: list[str],
    restart: list[str],
    state_json: str,
    engine_hosts: list[str],
    batch_hosts: list[str],
    hostvars: Mapping[str, Any],
    models: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """The running groups to drain before this host's restarts: those about to restart and
    those leaving the inventory, each with the peers (by the served name it serves now)
    that must keep serving. A group that is not active serves nothing: nothing to drain."""
    state = json.loads(state_json) if state_json.strip() else {}
    running = {
        name
        for name, info in state.get("groups", {}).items()
        if info.get("active_state") == "active"
    }
    # An operator's hold already keeps the group out of the routers; draining it again would
    # replace the operator's reason with this run's, and a later run would lift it.
    operator_held = set(state.get("operator_holds", []))
    previous = {}
    for result in snapshot:
        path = PurePosixPath(str(result["item"]["path"]))
        if path.suffix == ".json":
            previous[path.stem] = json.loads(base64.b64decode(result["content"]))
    leaving = set(previous) - set(groups)
    plan = []
    for name in sorted((set(restart) | leaving) & set(previous) & running - operator_held):
        served = str(previous[name].get("served_name", ""))
        plan.append(
            {
                "name": name,
                "served_name": served,
                "leaving": name in leaving,
                "min_peers": served_name_peers(served, engine_hosts, batch_hosts, hostvars, models),
            }
        )
    return plan
