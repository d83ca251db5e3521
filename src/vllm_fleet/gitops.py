"""`vllm-fleet apply --since REF`: apply a fleet repository's change with the right playbook.

Engine hosts whose stack, engine groups or served models' pins changed between REF and the
checkout go through the rolling upgrade (playbooks/upgrade.yml, limited to them: drain,
switch, verify, roll back on failure); site.yml then converges everything else (routers,
monitoring, new hosts) and is a no-op on the engines just upgraded. Inventories are read
with ansible-inventory at both commits (a detached worktree for REF); Jinja and vaulted
values are compared as written, never resolved.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

UPGRADE = "playbooks/upgrade.yml"
SITE = "site.yml"
MODEL_PIN_KEYS = ("source", "url", "repo", "revision", "served_name")


@dataclass
class Decision:
    upgrade_hosts: dict[str, list[str]] = field(default_factory=dict)  # host -> reasons
    playbooks: list[list[str]] = field(default_factory=list)  # argv tails for ansible-playbook

    def describe(self) -> str:
        lines = []
        for host, reasons in sorted(self.upgrade_hosts.items()):
            lines.append(f"{host}: rolling upgrade ({'; '.join(reasons)})")
        if not self.upgrade_hosts:
            lines.append("no engine host's stack, groups or model pins changed: no upgrade")
        lines += [f"run: ansible-playbook {' '.join(p)}" for p in self.playbooks]
        return "\n".join(lines)


def ansible_bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def inventory_hostvars(checkout: Path, inventory: str) -> dict[str, dict[str, Any]]:
    env = dict(os.environ, ANSIBLE_CONFIG=str(checkout / "ansible.cfg"))
    out = subprocess.run(
        [ansible_bin("ansible-inventory"), "-i", str(checkout / inventory), "--list"],
        cwd=checkout, env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return dict(json.loads(out).get("_meta", {}).get("hostvars", {}))


def engine_state(hostvars: dict[str, Any]) -> dict[str, Any] | None:
    groups = hostvars.get("fleet_engine_groups")
    if not groups:
        return None
    models = hostvars.get("fleet_models") or {}
    used = sorted({str(g.get("model")) for g in groups})
    return {
        "stack": hostvars.get("fleet_engine_stack"),
        "groups": groups,
        "models": {m: {k: (models.get(m) or {}).get(k) for k in MODEL_PIN_KEYS} for m in used},
    }


def reasons(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    found = []
    if before["stack"] != after["stack"]:
        found.append(f"stack {before['stack']} -> {after['stack']}")
    if before["groups"] != after["groups"]:
        found.append("engine group settings")
    for model, pins in after["models"].items():
        old = before["models"].get(model)
        if old is not None and old != pins:
            changed = [k for k in MODEL_PIN_KEYS if old.get(k) != pins.get(k)]
            found.append(f"model {model}: {', '.join(changed)}")
    return found


def decide(
    before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]], inventory: str
) -> Decision:
    decision = Decision()
    for host, hostvars in after.items():
        new, old = engine_state(hostvars), engine_state(before.get(host, {}))
        # A host that gains its first engines has nothing to drain: site.yml brings it up.
        if new is None or old is None:
            continue
        if why := reasons(old, new):
            decision.upgrade_hosts[host] = why
    if decision.upgrade_hosts:
        limit = ",".join(sorted(decision.upgrade_hosts))
        decision.playbooks.append(["-i", inventory, UPGRADE, "--limit", limit])
    decision.playbooks.append(["-i", inventory, SITE])
    return decision


def hostvars_at(repo: Path, ref: str, inventory: str) -> dict[str, dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="vllm-fleet-apply-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(
            ["git", "-C", str(repo), "worktree", "add", "--detach", "--quiet", str(tree), ref],
            check=True,
        )
        try:
            return inventory_hostvars(tree, inventory)
        finally:
            subprocess.run(
                ["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)], check=False
            )


def apply(repo: Path, since: str, inventory: str, dry_run: bool) -> int:
    decision = decide(
        hostvars_at(repo, since, inventory), inventory_hostvars(repo, inventory), inventory
    )
    print(decision.describe(), flush=True)
    if dry_run:
        return 0
    for argv in decision.playbooks:
        rc = subprocess.run([ansible_bin("ansible-playbook"), *argv], cwd=repo, check=False)
        if rc.returncode != 0:
            print(f"apply: ansible-playbook {' '.join(argv)} failed (exit {rc.returncode})")
            return rc.returncode
    return 0
