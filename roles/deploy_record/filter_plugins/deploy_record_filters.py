"""The deploy_record role's filters; their code and tests are vllm_fleet.ansible.deploy_record."""

from __future__ import annotations

from vllm_fleet.ansible.deploy_record import FILTERS


class FilterModule:
    def filters(self) -> dict[str, object]:
        return dict(FILTERS)
