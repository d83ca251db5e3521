"""The fleet_upgrade role's filters; their code and tests are vllm_fleet.ansible.fleet_upgrade."""

from __future__ import annotations

from vllm_fleet.ansible.fleet_upgrade import FILTERS


class FilterModule:
    def filters(self) -> dict[str, object]:
        return dict(FILTERS)
