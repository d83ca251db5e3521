"""Filters of the engine_watchdog role."""

from __future__ import annotations

from vllm_fleet.ansible.addresses import fleet_addresses, router_targets, url_host
from vllm_fleet.router.control_keys import host_control_key

FILTERS = {
    "engine_watchdog_control_key": host_control_key,
    "engine_watchdog_addresses": fleet_addresses,
    "engine_watchdog_url_host": url_host,
    "engine_watchdog_router_targets": router_targets,
}
