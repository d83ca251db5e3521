"""Filters of the fleet_defaults role, which every role depends on: what all roles share."""

from __future__ import annotations

from vllm_fleet.ansible.addresses import bind_address

FILTERS = {
    "fleet_defaults_bind_address": bind_address,
}
