"""Filters the preflight role needs to read an inventory that may be malformed."""

from __future__ import annotations


def preflight_group_models(groups: object) -> list[str]:
    """Model names of the engine groups; [] for anything that is not a list of mappings.

    Preflight must reach its checks (and report the bad shape) instead of failing in Jinja.
    """
    if not isinstance(groups, list):
        return []
    names = [g.get("model") for g in groups if isinstance(g, dict)]
    return sorted({n for n in names if isinstance(n, str)})


FILTERS = {
    "preflight_group_models": preflight_group_models,
}
