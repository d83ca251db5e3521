"""The fleet_verify role's filters; their code and tests are vllm_fleet.ansible.fleet_verify."""

from __future__ import annotations

from vllm_fleet.ansible.fleet_verify import FILTERS


class FilterModule:
    def filters(self) -> dict[str, object]:
        return dict(FILTERS)
