"""The host_tls role's filters; their code and tests are vllm_fleet.ansible.host_tls."""

from __future__ import annotations

from vllm_fleet.ansible.host_tls import FILTERS


class FilterModule:
    def filters(self) -> dict[str, object]:
        return dict(FILTERS)
