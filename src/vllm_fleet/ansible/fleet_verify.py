"""Filters of the fleet_verify role: the fleet as the verifier sees it."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from vllm_fleet.ansible.addresses import fleet_address, fleet_addresses, router_url, url_host
from vllm_fleet.engine.config import engine_url
from vllm_fleet.preflight.engine_tls import engine_tls


def _commits(records: list[Mapping[str, Any]]) -> dict[str, str]:
    """host -> the commit its deployed.json names, from slurp results looped over hosts."""
    commits = {}
    for result in records:
        try:
            record = json.loads(base64.b64decode(result.get("content", "")))
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("commit"):
            dirty = "+dirty" if record.get("dirty") else ""
            commits[str(result.get("item"))] = f"{str(record['commit'])[:12]}{dirty}"
    return commits


def verify_engines(
    hosts: list[str],
    hostvars: Mapping[str, Any],
    models: Mapping[str, Any],
    group_defaults: Mapping[str, Any],
    records: list[Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """One entry per engine group of the inventory, with what the report's table shows."""
    commits = _commits(records or [])
    engines = []
    for host in hosts:
        host_vars = hostvars[host]
        advertise = host_vars.get("vllm_engine_advertise_host", fleet_address(host, hostvars))
        tls = engine_tls(host_vars) is True
        for raw in host_vars.get("fleet_engine_groups", []):
            group = {**group_defaults, **raw}
            engines.append(
                {
                    "host": host,
                    "group": group["name"],
                    "url": engine_url(str(advertise), int(group["port"]), tls=tls),
                    "stack": host_vars.get("fleet_engine_stack", ""),
                    "commit": commits.get(host, "not recorded"),
                    "model": group["model"],
                    "served_name": models[group["model"]]["served_name"],
                    "revision": models[group["model"]]["revision"],
                    "devices": [int(d) for d in group["devices"]],
                    "max_num_seqs": int(group["max_num_seqs"]),
                    "dtype": str(group.get("dtype", "auto")),
                    "enable_prefix_caching": bool(group.get("enable_prefix_caching", True)),
                }
            )
    return engines


FILTERS = {
    "fleet_verify_engines": verify_engines,
    "fleet_verify_addresses": fleet_addresses,
    "fleet_verify_url_host": url_host,
    "fleet_verify_router_url": router_url,
}
