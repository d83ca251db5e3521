"""The verify report: a JSON document, its Markdown rendering and the console summary."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

from vllm_fleet import __version__
from vllm_fleet.verify.config import VerifyConfig
from vllm_fleet.verify.results import CheckResult
from vllm_fleet.verify.smoke import EngineFacts

TALLY_COLUMNS = ("index", "marker", "requests", "contaminated", "diverged", "errors", "retries")
FLEET_COLUMNS: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
    ("host", lambda r: r["host"]),
    ("group", lambda r: r["group"]),
    ("stack", lambda r: r["stack"]),
    ("commit", lambda r: r["commit"]),
    ("model", lambda r: r["model"]),
    ("served name", lambda r: r["served_name"]),
    ("revision", lambda r: r["revision"][:12]),
    ("devices", lambda r: r["devices"]),
    ("max_num_seqs", lambda r: r["max_num_seqs"]),
    ("dtype", lambda r: r["dtype"]),
    ("KV capacity (reported)", lambda r: r["kv_capacity"]),
    ("health", lambda r: r["health"]),
]


def fleet_rows(cfg: VerifyConfig, facts: dict[str, EngineFacts]) -> list[dict[str, Any]]:
    rows = []
    for engine in cfg.engines:
        fact = facts.get(engine.label, EngineFacts())
        kv = fact.kv_capacity
        rows.append(
            {
                "host": engine.host,
                "group": engine.group,
                "url": engine.url,
                "stack": engine.stack,
                "commit": engine.commit,
                "model": engine.model,
                "served_name": engine.served_name,
                "revision": engine.revision,
                "devices": engine.devices,
                "max_num_seqs": engine.max_num_seqs,
                "dtype": engine.dtype,
                "kv_capacity_tokens": kv.tokens if kv else None,
                "kv_capacity": str(kv) if kv else "not reported",
                "health": fact.health,
            }
        )
    return rows


def is_crosstalk(name: str) -> bool:
    """The cross-talk check, or one of its per-served-name copies (``crosstalk[NAME]``)."""
    return name == "crosstalk" or (name.startswith("crosstalk[") and name.endswith("]"))


def crosstalk_concurrency(checks: list[CheckResult]) -> dict[str, int]:
    """served name -> the C its cross-talk check chose (measured per run); absent: not run."""
    out = {}
    for check in checks:
        concurrency = check.details.get("concurrency")
        if is_crosstalk(check.name) and isinstance(concurrency, int):
            out[check.details.get("served_name", "")] = concurrency
    return out


def build_report(
    cfg: VerifyConfig,
    rows: list[dict[str, Any]],
    checks: list[CheckResult],
    started_at: datetime,
    duration_s: float,
) -> dict[str, Any]:
    counts = {s: sum(c.status == s for c in checks) for s in ("pass", "warn", "fail")}
    return {
        "tool": "vllm-fleet verify",
        "version": __version__,
        "started_at": started_at.isoformat(timespec="seconds"),
        "duration_s": round(duration_s, 3),
        "verdict": "fail" if counts["fail"] or not checks else "pass",
        "counts": counts,
        "served_names": cfg.served_names,
        "router": cfg.router.model_dump() if cfg.router else None,
        "concurrency": crosstalk_concurrency(checks),
        "fleet": rows,
        "checks": [{**asdict(c), "duration_s": round(c.duration_s, 3)} for c in checks],
    }


def write_report(report: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "report.json", out_dir / "report.md"
    json_path.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n")
    md_path.write_text(render_markdown(report))
    return json_path, md_path


def summary_lines(report: dict[str, Any]) -> list[str]:
    lines = [
        f"[{c['status'].upper():4}] {c['name']}: {c['summary']} ({c['duration_s']:.1f}s)"
        for c in report["checks"]
    ]
    counts = report["counts"]
    lines.append(
        f"verdict: {report['verdict'].upper()} ({counts['pass']} passed, "
        f"{counts['warn']} warnings, {counts['fail']} failed)"
    )
    return lines


def _cell(value: Any) -> str:
    text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return lines


def render_markdown(report: dict[str, Any]) -> str:
    router = report["router"]
    lines = [
        f"# vllm-fleet verify: {report['verdict'].upper()}",
        "",
        f"- started: {report['started_at']}, took {report['duration_s']:.1f} s",
        f"- served names: {_served(report)}",
        f"- router: {router['url'] + ' (' + router['policy'] + ')' if router else 'none'}",
        "",
        "## Fleet",
        "",
    ]
    lines += _table(
        [header for header, _ in FLEET_COLUMNS],
        [[cell(row) for _, cell in FLEET_COLUMNS] for row in report["fleet"]],
    )
    lines += ["", "## Checks", ""]
    lines += _table(
        ["check", "status", "duration", "summary"],
        [
            [c["name"], c["status"].upper(), f"{c['duration_s']:.1f} s", c["summary"]]
            for c in report["checks"]
        ],
    )
    for check in report["checks"]:
        lines += ["", f"### {check['name']}: {check['status'].upper()}", ""]
        lines += _details(check["details"])
    return "\n".join(lines) + "\n"


def _served(report: dict[str, Any]) -> str:
    concurrency = report["concurrency"]
    return ", ".join(
        f"`{name}` (cross-talk C = {concurrency.get(name, 'not run')})"
        for name in report["served_names"]
    )


def _details(details: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    rest = dict(details)
    for item in rest.pop("items", []):
        mark = "FAIL" if not item["ok"] else "warn" if item.get("warning") else "ok"
        lines.append(f"- [{mark}] {item['name']}: {item['detail']}")
    for reason in rest.pop("reasons", []):
        lines.append(f"- {reason}")
    tallies = rest.pop("per_prompt", None)
    baselines = rest.pop("baselines", None)
    for key, value in rest.items():
        if value in (None, {}, []):
            continue
        shown = json.dumps(value) if isinstance(value, dict | list) else str(value)
        lines.append(f"- {key}: {shown}")
    if tallies:
        lines += ["", "Per prompt:", ""]
        columns = [*TALLY_COLUMNS, "baseline_has_marker", "first_divergence", "foreign_markers"]
        lines += _table(columns, [[t[c] for c in columns] for t in tallies])
    if baselines:
        lines += ["", "Baselines:", ""] + [f"- `{k}`: {v!r}" for k, v in baselines.items()]
    return lines
