"""The monitoring role's filters; their code and tests are vllm_fleet.ansible.monitoring."""

from __future__ import annotations

from vllm_fleet.ansible.monitoring import FILTERS


class FilterModule:
    def filters(self) -> dict[str, object]:
        return dict(FILTERS)
