"""The router role's filters; their code and tests are vllm_fleet.ansible.router."""

from __future__ import annotations

from vllm_fleet.ansible.router import FILTERS


class FilterModule:
    def filters(self) -> dict[str, object]:
        return dict(FILTERS)
