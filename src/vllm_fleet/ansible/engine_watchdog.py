"""Filters of the engine_watchdog role."""

from __future__ import annotations

from vllm_fleet.ansible.addresses import fleet_addresses, url_host

FILTERS = {
    "engine_watchdog_addresses": fleet_addresses,
    "engine_watchdog_url_host": url_host,
}
