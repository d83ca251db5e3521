"""The engine_runtime role's filters; their code and tests are vllm_fleet.ansible.engine_runtime."""

from __future__ import annotations

from vllm_fleet.ansible.engine_runtime import FILTERS


class FilterModule:
    def filters(self) -> dict[str, object]:
        return dict(FILTERS)
