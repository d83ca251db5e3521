"""The fleet's Grafana dashboard as data: its PromQL queries, rendered as Grafana would.

The dashboard ships as ``roles/monitoring/files/dashboards/vllm-fleet.json``. The unit
tests and the lab pull every panel's queries out of it and substitute Grafana's variables,
so each query can go through ``promtool`` or to Prometheus's HTTP API as Grafana sends it.

``render_query`` supports exactly these, and raises ``UnsupportedVariable`` on anything
else Grafana would interpolate, rather than send Prometheus a half-rendered query:

- dashboard variables the caller passes, as ``$name`` or ``${name}``: single values,
  substituted verbatim (the dashboard uses them inside ``="..."`` matchers);
- ``$__interval`` and ``$__interval_ms``: the interval given;
- ``$__rate_interval``: Grafana's max($__interval + scrape interval, 4 * scrape interval);
- ``$__range``, ``$__range_s`` and ``$__range_ms``: the time range given.

Not supported: ``${name:format}``, ``${name.field}``, the deprecated ``[[name]]``, multi-value
or "All" variables, and other built-ins (``$__from``, ``$__to``, ``$__user``...). A ``$``
followed by a word is always read as a variable, so label_replace's ``$1`` cannot be used
in the dashboard's queries (Grafana would leave it alone; here it raises).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# In a checkout of the repository (the controller); the agent's wheel does not ship roles/.
DASHBOARD_PATH = (
    Path(__file__).resolve().parents[3] / "roles/monitoring/files/dashboards/vllm-fleet.json"
)

MACROS = frozenset(
    {
        "__interval",
        "__interval_ms",
        "__rate_interval",
        "__range",
        "__range_s",
        "__range_ms",
    }
)

# Grafana's own variable syntaxes: $name, ${...} and the deprecated [[...]].
_VARIABLE = re.compile(r"\$(?:\{(?P<braced>[^}]*)\}|(?P<plain>\w+))|\[\[(?P<legacy>[^\]]*)\]\]")
_NAME = re.compile(r"\w+")
_DURATION_PART = re.compile(r"(\d+)(ms|s|m|h|d|w)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
# Values go inside double-quoted PromQL strings verbatim; these would need escaping there.
_UNSAFE_VALUE = re.compile(r'["\\\n]')

Dashboard = Mapping[str, Any]
Panel = Mapping[str, Any]


class UnsupportedVariable(ValueError):
    """A query uses a Grafana variable or syntax that render_query cannot substitute."""


@dataclass(frozen=True)
class PanelQuery:
    row: str | None  # title of the row the panel sits in; None above the first row
    panel_id: int
    title: str
    ref_id: str
    expr: str
    instant: bool  # Grafana runs it as an instant query (tables), not over the range


def load_dashboard(path: Path = DASHBOARD_PATH) -> dict[str, Any]:
    with path.open(encoding="utf-8") as handle:
        loaded = json.load(handle)
    if not isinstance(loaded, dict) or not isinstance(loaded.get("panels"), list):
        raise ValueError(f"{path}: not a Grafana dashboard (no panels list)")
    return loaded


def iter_panels(dashboard: Dashboard) -> Iterator[tuple[str | None, Panel]]:
    """(row title, panel) for every panel, rows included, in the dashboard's order.

    An expanded row lists its panels after itself at the top level; a collapsed row keeps
    them in its own ``panels``. Both belong to the row.
    """
    row: str | None = None
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            row = panel.get("title")
            yield row, panel
            for inner in panel.get("panels", []):
                yield row, inner
        else:
            yield row, panel


def panel_queries(dashboard: Dashboard) -> list[PanelQuery]:
    """Every query Grafana runs for the dashboard's panels.

    Hidden targets and targets without an expr are left out: Grafana does not run them.
    """
    queries = []
    for row, panel in iter_panels(dashboard):
        for target in panel.get("targets", []):
            expr = str(target.get("expr") or "").strip()
            if not expr or target.get("hide"):
                continue
            queries.append(
                PanelQuery(
                    row=row,
                    panel_id=int(panel["id"]),
                    title=str(panel.get("title", "")),
                    ref_id=str(target.get("refId", "")),
                    expr=expr,
                    instant=bool(target.get("instant")) and not target.get("range"),
                )
            )
    return queries


def variable_names(dashboard: Dashboard) -> list[str]:
    """The dashboard's template variables, in order."""
    return [str(v["name"]) for v in dashboard.get("templating", {}).get("list", [])]


def referenced_variables(expr: str) -> set[str]:
    """Names of the variables (built-in macros included) an expression refers to."""
    return {_variable_name(match) for match in _VARIABLE.finditer(expr)}


def render_query(
    expr: str,
    variables: Mapping[str, str],
    interval: str = "1m",
    *,
    scrape_interval: str = "15s",
    time_range: str = "1h",
) -> str:
    """``expr`` with every variable substituted, as Grafana would send it to Prometheus.

    ``interval`` is what Grafana computed as $__interval for the panel, ``scrape_interval``
    the data source's scrape interval (Grafana's default 15s, the fleet's Prometheus too)
    and ``time_range`` the dashboard's range (``now-1h`` to ``now`` by default).
    """
    values = _values(variables)
    values.update(_macros(_duration_ms(interval), _duration_ms(scrape_interval), time_range))

    def substitute(match: re.Match[str]) -> str:
        name = _variable_name(match)
        if name not in values:
            known = ", ".join(sorted(values))
            raise UnsupportedVariable(
                f"{match.group(0)!r} in {expr!r}: unknown variable {name!r} (known: {known})"
            )
        return values[name]

    return _VARIABLE.sub(substitute, expr)


def _values(variables: Mapping[str, str]) -> dict[str, str]:
    values = {}
    for name, value in variables.items():
        if name.startswith("__"):
            raise ValueError(f"variable {name!r}: names starting with __ are Grafana's built-ins")
        if _UNSAFE_VALUE.search(value):
            raise ValueError(f"variable {name!r}={value!r}: quotes, backslashes and newlines")
        values[name] = value
    return values


def _macros(interval_ms: int, scrape_ms: int, time_range: str) -> dict[str, str]:
    # Grafana's rule, so a rate window always spans at least four scrapes.
    rate_ms = max(interval_ms + scrape_ms, 4 * scrape_ms)
    range_ms = _duration_ms(time_range)
    return {
        "__interval": _format_duration(interval_ms),
        "__interval_ms": str(interval_ms),
        "__rate_interval": _format_duration(rate_ms),
        "__range": _format_duration(range_ms),
        "__range_s": str(range_ms // 1000),
        "__range_ms": str(range_ms),
    }


def _variable_name(match: re.Match[str]) -> str:
    """The variable a match names; syntaxes render_query does not support raise."""
    token = match.group(0)
    if match.group("legacy") is not None:
        raise UnsupportedVariable(f"{token!r}: the deprecated [[name]] syntax is not supported")
    name = match.group("plain") or match.group("braced")
    if not name or not _NAME.fullmatch(name):
        raise UnsupportedVariable(f"{token!r}: only $name and ${{name}} are supported")
    return name


def _duration_ms(text: str) -> int:
    """Milliseconds of a Prometheus-style duration such as 15s, 1m or 1h30m."""
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{text!r} is not a duration (like 500ms, 15s, 1m, 1h30m)")
    total = sum(int(number) * _UNIT_MS[unit] for number, unit in parts)
    if total <= 0:
        raise ValueError(f"{text!r}: a duration must be positive")
    return total


def _format_duration(ms: int) -> str:
    """The largest unit that states ``ms`` exactly (75s stays 75s, not Grafana's lossy 1m)."""
    for unit in ("d", "h", "m", "s"):
        if ms % _UNIT_MS[unit] == 0:
            return f"{ms // _UNIT_MS[unit]}{unit}"
    return f"{ms}ms"
