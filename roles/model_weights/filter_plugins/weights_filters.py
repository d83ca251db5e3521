"""The model_weights role's filters; their code and tests are vllm_fleet.ansible.model_weights."""

from __future__ import annotations

from vllm_fleet.ansible.model_weights import FILTERS


class FilterModule:
    def filters(self) -> dict[str, object]:
        return dict(FILTERS)
