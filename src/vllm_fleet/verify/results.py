"""One check's outcome, as every check module returns it and the report renders it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["pass", "warn", "fail"]


@dataclass
class CheckResult:
    name: str
    status: Status
    summary: str
    details: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0


@dataclass
class Item:
    """One assertion inside a check (e.g. "chat answers" inside an engine's smoke check)."""

    name: str
    ok: bool
    detail: str
    warning: bool = False  # ok, but worth a look

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "warning": self.warning, "detail": self.detail}


def status_of(items: list[Item]) -> Status:
    if not items or not all(i.ok for i in items):
        return "fail"
    return "warn" if any(i.warning for i in items) else "pass"


def short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
