"""Record, per host, the tasks that changed (or would change in --check) and their diffs.

Enabled only by `vllm-fleet drift` (ANSIBLE_CALLBACKS_ENABLED=vllm_fleet_drift), next to the
normal output; writes JSON to $VLLM_FLEET_DRIFT_OUT when the run ends.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: vllm_fleet_drift
type: aggregate
short_description: per-host changed tasks and diffs, as JSON, for vllm-fleet drift
description:
  - Writes every changed, failed or unreachable task result per host to a JSON file.
options:
  out:
    description: Where to write the JSON.
    env:
      - name: VLLM_FLEET_DRIFT_OUT
requirements:
  - enabled in ANSIBLE_CALLBACKS_ENABLED
"""

# Diff text kept per change: enough to read an edited unit file, bounded for big files.
MAX_DIFF_CHARS = 20000


def _diffs(result: dict[str, Any]) -> list[dict[str, str]]:
    raw = result.get("diff") or []
    entries = raw if isinstance(raw, list) else [raw]
    diffs = []
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        before, after = entry.get("before", ""), entry.get("after", "")
        # template's after_header is its rendered temporary file on the controller: the file
        # that changes is the destination (before_header, or the result's dest/path).
        path = entry.get("before_header") or result.get("dest") or result.get("path") or ""
        diffs.append(
            {
                "path": str(path),
                "before_header": str(entry.get("before_header", "")),
                "after_header": str(entry.get("after_header", "")),
                "before": before if isinstance(before, str) else json.dumps(before, indent=1),
                "after": after if isinstance(after, str) else json.dumps(after, indent=1),
            }
        )
    return diffs


def _changes(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per changed item (a looped task reports each item)."""
    items = result.get("results")
    if isinstance(items, list):
        return [
            {"item": str(r.get("_ansible_item_label", r.get("item", ""))), "diffs": _diffs(r)}
            for r in items
            if isinstance(r, dict) and r.get("changed")
        ]
    return [{"item": "", "diffs": _diffs(result)}]


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "vllm_fleet_drift"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self.hosts: dict[str, dict[str, list[dict[str, Any]]]] = {}

    def _host(self, name: str) -> dict[str, list[dict[str, Any]]]:
        return self.hosts.setdefault(name, {"changed": [], "failed": []})

    def _task(self, result: Any) -> dict[str, str]:
        task = result._task
        role = getattr(task, "_role", None)
        return {
            "task": task.get_name(),
            "role": role.get_name() if role else "",
            "action": task.action,
        }

    def v2_runner_on_ok(self, result: Any) -> None:
        if not result._result.get("changed"):
            return
        for change in _changes(result._result):
            for diff in change["diffs"]:
                diff["before"] = diff["before"][:MAX_DIFF_CHARS]
                diff["after"] = diff["after"][:MAX_DIFF_CHARS]
            self._host(result._host.get_name())["changed"].append({**self._task(result), **change})

    def v2_runner_on_failed(self, result: Any, ignore_errors: bool = False) -> None:
        if ignore_errors:
            return
        message = str(result._result.get("msg", ""))[:2000]
        self._host(result._host.get_name())["failed"].append({**self._task(result), "msg": message})

    def v2_runner_on_unreachable(self, result: Any) -> None:
        message = str(result._result.get("msg", "unreachable"))[:2000]
        self._host(result._host.get_name())["failed"].append({**self._task(result), "msg": message})

    def v2_playbook_on_stats(self, stats: Any) -> None:
        out = os.environ.get("VLLM_FLEET_DRIFT_OUT")
        if not out:
            return
        for host in stats.processed:
            self._host(host)
        Path(out).write_text(json.dumps({"hosts": self.hosts}, indent=1, sort_keys=True) + "\n")
