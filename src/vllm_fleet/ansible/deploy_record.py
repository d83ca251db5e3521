"""Filters of the deploy_record role."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any


def stamp(record: Mapping[str, Any], current: Mapping[str, Any], now: str) -> dict[str, Any]:
    """The record with applied_at: kept from the current record when nothing else changed
    (so a converged host's file stays byte-identical), else now."""
    new = {**record, "dirty": str(record.get("dirty")).lower() == "true"}
    try:
        old = json.loads(base64.b64decode(current.get("content", "")))
    except ValueError:
        old = {}
    if isinstance(old, dict) and {k: v for k, v in old.items() if k != "applied_at"} == new:
        return {**new, "applied_at": old.get("applied_at", now)}
    return {**new, "applied_at": now}


def model_specs(
    groups: list[Mapping[str, Any]], models: Mapping[str, Any]
) -> dict[str, Mapping[str, Any]]:
    """The inventory's entries of the models this host's engine groups serve."""
    names = sorted({str(g.get("model")) for g in groups})
    return {name: models.get(name, {}) for name in names}


def revisions(specs: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """model -> pinned revision."""
    return {name: str(spec.get("revision", "")) for name, spec in specs.items()}


FILTERS = {
    "deploy_record_stamp": stamp,
    "deploy_record_model_specs": model_specs,
    "deploy_record_revisions": revisions,
}
