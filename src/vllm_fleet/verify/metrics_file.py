"""The last verification as Prometheus metrics, in node exporter's textfile format.

A verification is a batch job: node exporter's textfile collector (Debian's package reads
/var/lib/prometheus/node-exporter/*.prom) exposes the file, and the fleet's alert rules
page on cross-talk and on a verification that stopped running.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

from vllm_fleet.verify.report import is_crosstalk


def contaminated_answers(report: dict[str, Any]) -> int:
    """Summed over the served names' cross-talk checks."""
    return sum(
        int(check.get("details", {}).get("totals", {}).get("contaminated", 0))
        for check in report.get("checks", [])
        if is_crosstalk(str(check.get("name", "")))
    )


def write_metrics(report: dict[str, Any], path: Path) -> None:
    registry = CollectorRegistry()
    ok = Gauge(
        "vllm_fleet_verify_check_ok",
        "1 when the check passed (warnings included) in the last verification, else 0",
        ["check"],
        registry=registry,
    )
    for check in report.get("checks", []):
        ok.labels(check=check["name"]).set(int(check["status"] != "fail"))
    Gauge(
        "vllm_fleet_verify_passed",
        "1 when the last verification's verdict was pass",
        registry=registry,
    ).set(int(report.get("verdict") == "pass"))
    Gauge(
        "vllm_fleet_verify_crosstalk_contaminated_answers",
        "Answers of the last verification that carried another prompt's marker",
        registry=registry,
    ).set(contaminated_answers(report))
    started = datetime.fromisoformat(str(report["started_at"]))
    Gauge(
        "vllm_fleet_verify_last_run_timestamp_seconds",
        "When the last verification started (Unix time)",
        registry=registry,
    ).set(started.timestamp())
    path.parent.mkdir(parents=True, exist_ok=True)
    # prometheus_client's own atomic write (a temporary file renamed into place: node exporter
    # never reads half a file). Under a 0077 umask the file would be the writer's alone, and
    # node exporter runs as another user: 0644 while it is written.
    umask = os.umask(0o022)
    try:
        write_to_textfile(str(path), registry)
    finally:
        os.umask(umask)
