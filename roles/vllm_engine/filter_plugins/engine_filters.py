"""The vllm_engine role's filters; their code and tests are vllm_fleet.ansible.vllm_engine."""

from __future__ import annotations

from vllm_fleet.ansible.vllm_engine import FILTERS


class FilterModule:
    def filters(self) -> dict[str, object]:
        return dict(FILTERS)
