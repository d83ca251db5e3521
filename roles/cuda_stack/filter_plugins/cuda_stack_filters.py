"""The cuda_stack role's filters; their code and tests are vllm_fleet.ansible.cuda_stack."""

from __future__ import annotations

from vllm_fleet.ansible.cuda_stack import FILTERS


class FilterModule:
    def filters(self) -> dict[str, object]:
        return dict(FILTERS)
