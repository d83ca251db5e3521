"""The engine_watchdog role's filters; their code and tests are vllm_fleet.ansible.engine_watchdog."""

from __future__ import annotations

from vllm_fleet.ansible.engine_watchdog import FILTERS


class FilterModule:
    def filters(self) -> dict[str, object]:
        return dict(FILTERS)
