"""The engine_firewall role's filters; their code and tests are vllm_fleet.ansible.engine_firewall."""

from __future__ import annotations

from vllm_fleet.ansible.engine_firewall import FILTERS


class FilterModule:
    def filters(self) -> dict[str, object]:
        return dict(FILTERS)
