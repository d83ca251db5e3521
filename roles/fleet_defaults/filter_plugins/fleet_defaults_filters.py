"""The fleet_defaults role's filters (every role depends on it, so every role sees them);
their code and tests are vllm_fleet.ansible.fleet_defaults."""

from __future__ import annotations

from vllm_fleet.ansible.fleet_defaults import FILTERS


class FilterModule:
    def filters(self) -> dict[str, object]:
        return dict(FILTERS)
