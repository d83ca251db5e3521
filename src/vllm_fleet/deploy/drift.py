"""`vllm-fleet drift`: what site.yml would change on each host, and whether the fleet drifted.

Runs the playbook with --check --diff (preflight first, as site.yml imports it) and the
vllm_fleet_drift callback, then writes a per-host summary (Markdown + JSON) to the reports
directory. Exit status: 0 nothing would change, 2 drift (some host would change),
1 the run failed (preflight refused the inventory, a host was unreachable, a task failed).
"""

from __future__ import annotations

import configparser
import difflib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NO_DRIFT, FAILED, DRIFT = 0, 1, 2
DIFF_LINES = 40


@dataclass
class DriftResult:
    status: int
    hosts: dict[str, dict[str, list[dict[str, Any]]]]
    playbook_rc: int
    markdown: str


def changed_paths(change: dict[str, Any]) -> list[str]:
    """The files (or other objects) a change touches, from its diff headers."""
    paths = []
    for diff in change.get("diffs", []):
        path = diff.get("path") or diff.get("before_header")
        if path and path not in paths:
            paths.append(path)
    return paths


def unified(diff: dict[str, str]) -> list[str]:
    lines = list(
        difflib.unified_diff(
            diff.get("before", "").splitlines(),
            diff.get("after", "").splitlines(),
            fromfile=diff.get("path") or diff.get("before_header") or "before",
            tofile=diff.get("path") or diff.get("after_header") or "after",
            lineterm="",
        )
    )
    if len(lines) > DIFF_LINES:
        lines = [*lines[:DIFF_LINES], f"... ({len(lines) - DIFF_LINES} more lines)"]
    return lines


def status_of(hosts: dict[str, dict[str, list[dict[str, Any]]]], playbook_rc: int) -> int:
    if playbook_rc != 0 or any(h["failed"] for h in hosts.values()):
        return FAILED
    return DRIFT if any(h["changed"] for h in hosts.values()) else NO_DRIFT


def render_markdown(hosts: dict[str, dict[str, list[dict[str, Any]]]], status: int) -> str:
    verdict = {NO_DRIFT: "no drift", DRIFT: "drift", FAILED: "failed"}[status]
    out = [f"# Drift check: {verdict}", "", "| host | would change | failed |", "|---|---|---|"]
    for host in sorted(hosts):
        h = hosts[host]
        out.append(f"| {host} | {len(h['changed'])} | {len(h['failed'])} |")
    for host in sorted(hosts):
        h = hosts[host]
        if not (h["changed"] or h["failed"]):
            continue
        out += ["", f"## {host}"]
        for change in h["changed"]:
            where = ", ".join(changed_paths(change))
            item = f" [{change['item']}]" if change.get("item") else ""
            line = f"- would change: {change['role'] or '-'} / {change['task']}{item}"
            out.append(line + (f": {where}" if where else ""))
            for diff in change.get("diffs", []):
                body = unified(diff)
                if body:
                    out += ["", "```diff", *body, "```", ""]
        out += [f"- FAILED: {f['role'] or '-'} / {f['task']}: {f['msg']}" for f in h["failed"]]
    return "\n".join(out) + "\n"


def enabled_callbacks(root: Path) -> list[str]:
    """The callbacks ansible-playbook enables when run from ``root``: the environment's
    ANSIBLE_CALLBACKS_ENABLED, else the ansible.cfg it reads (ANSIBLE_CONFIG, else root's)."""
    listed = os.environ.get("ANSIBLE_CALLBACKS_ENABLED")
    if listed is None:
        config = configparser.ConfigParser(interpolation=None)
        config.read(os.environ.get("ANSIBLE_CONFIG") or root / "ansible.cfg")
        listed = config.get("defaults", "callbacks_enabled", fallback="")
    return [name.strip() for name in listed.split(",") if name.strip()]


def drift(
    playbook: str, out_dir: Path, extra: list[str], root: Path, stream: bool = True
) -> DriftResult:
    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = out_dir / "callback.json"
    raw.unlink(missing_ok=True)
    env = dict(
        os.environ,
        # Added to, not replacing, the callbacks enabled already (the environment setting
        # would otherwise replace ansible.cfg's list, vllm_fleet_preload among them).
        ANSIBLE_CALLBACKS_ENABLED=",".join([*enabled_callbacks(root), "vllm_fleet_drift"]),
        VLLM_FLEET_DRIFT_OUT=str(raw),
    )
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), playbook, "--check", "--diff"]
    with (out_dir / "ansible.log").open("w") as log:
        proc = subprocess.Popen(
            [*argv, *extra], cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        assert proc.stdout is not None
        for chunk in proc.stdout:
            text = chunk.decode(errors="replace")
            log.write(text)
            if stream:
                sys.stdout.write(text)
        rc = proc.wait()
    if not raw.exists():
        # Without the callback's record nothing is known: never report "no drift" then.
        missing = f"the vllm_fleet_drift callback wrote nothing (ansible-playbook exit {rc})"
        markdown = f"# Drift check: failed\n\n{missing}; see ansible.log\n"
        (out_dir / "drift.md").write_text(markdown)
        (out_dir / "drift.json").write_text(json.dumps({"status": "failed", "hosts": {}}) + "\n")
        return DriftResult(FAILED, {}, rc, markdown)
    hosts = json.loads(raw.read_text())["hosts"]
    raw.unlink()
    status = status_of(hosts, rc)
    markdown = render_markdown(hosts, status)
    (out_dir / "drift.md").write_text(markdown)
    summary = {"status": {0: "no-drift", 1: "failed", 2: "drift"}[status], "hosts": hosts}
    (out_dir / "drift.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    return DriftResult(status, hosts, rc, markdown)


def default_out_dir(root: Path) -> Path:
    return root / "reports" / f"drift-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
