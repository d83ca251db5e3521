"""`vllm-fleet apply`: apply a fleet repository's change with the right playbook.

What each engine host runs is what its /etc/vllm-fleet/deployed.json records (the commit of
its last successful deploy), not what the previous push was: a skipped or failed apply is
caught up with on the next one. Engine hosts whose stack, engine groups, engine-related
variables or served models' pins differ between their recorded commit and the checkout, or
whose engine code (roles, catalog, agent) changed since, go through the rolling upgrade
(playbooks/upgrade.yml, limited to them: drain, switch, verify, roll back on failure);
site.yml then converges everything else (routers, monitoring, new hosts) and is a no-op on
the engines just upgraded. A host whose recorded commit is not in the repository is
upgraded (rolling is always safe, only slower). `--since REF` compares every host against
REF instead. Inventories are read with ansible-inventory at each commit (a detached
worktree); Jinja and vaulted values are compared as written, never resolved.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

UPGRADE = "playbooks/upgrade.yml"
SITE = "site.yml"
DEPLOYED = "/etc/vllm-fleet/deployed.json"
MODEL_PIN_KEYS = ("source", "url", "repo", "revision", "served_name")
ENGINE_VARIABLES = (
    "fleet_accelerator", "fleet_memory_utilization", "fleet_memory_reserve_bytes",
    "fleet_engine_memory_overhead_bytes",
)  # fmt: skip
ENGINE_PREFIXES = ("vllm_engine_", "engine_runtime_", "model_weights_")
# What engine hosts run besides their variables: a change here restarts engines.
ENGINE_CODE = ("roles/engine_runtime", "roles/model_weights", "roles/vllm_engine", "catalog",
               "src/vllm_fleet")  # fmt: skip
# ...except what never reaches a host: the roles' Molecule scenarios.
NOT_DEPLOYED = (":(exclude)roles/*/molecule/*",)
ONE_LINE = re.compile(r"^(?P<host>\S+) \| (?P<state>[A-Z!]+) => (?P<json>\{.*\})$")


class ApplyError(RuntimeError):
    pass


@dataclass
class Decision:
    upgrade_hosts: dict[str, list[str]] = field(default_factory=dict)  # host -> reasons
    notes: list[str] = field(default_factory=list)
    playbooks: list[list[str]] = field(default_factory=list)  # argv tails for ansible-playbook

    def describe(self) -> str:
        lines = [f"{host}: rolling upgrade ({'; '.join(reasons)})"
                 for host, reasons in sorted(self.upgrade_hosts.items())]  # fmt: skip
        if not self.upgrade_hosts:
            lines.append(
                "no engine host's stack, settings, model pins or engine code changed: no upgrade"
            )
        lines += self.notes
        lines += [f"run: ansible-playbook {' '.join(p)}" for p in self.playbooks]
        return "\n".join(lines)


def ansible_bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=check
    )


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
    settings = {
        k: v for k, v in hostvars.items() if k in ENGINE_VARIABLES or k.startswith(ENGINE_PREFIXES)
    }
    return {
        "stack": hostvars.get("fleet_engine_stack"),
        "groups": groups,
        "settings": settings,
        "models": {m: {k: (models.get(m) or {}).get(k) for k in MODEL_PIN_KEYS} for m in used},
    }


def reasons(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    found = []
    if before["stack"] != after["stack"]:
        found.append(f"stack {before['stack']} -> {after['stack']}")
    if before["groups"] != after["groups"]:
        found.append("engine group settings")
    keys = sorted(set(before["settings"]) | set(after["settings"]))
    if changed := [k for k in keys if before["settings"].get(k) != after["settings"].get(k)]:
        found.append(f"variables {', '.join(changed)}")
    for model, pins in after["models"].items():
        old = before["models"].get(model)
        if old is not None and old != pins:
            changed = [k for k in MODEL_PIN_KEYS if old.get(k) != pins.get(k)]
            found.append(f"model {model}: {', '.join(changed)}")
    return found


def code_changes(repo: Path, ref: str) -> list[str]:
    """Engine code files that differ between ref and the checkout."""
    diff = git(repo, "diff", "--name-only", ref, "--", *ENGINE_CODE, *NOT_DEPLOYED)
    return [line for line in diff.stdout.splitlines() if line]


def resolves(repo: Path, ref: str) -> bool:
    return (
        git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False).returncode
        == 0
    )


def hostvars_at(repo: Path, ref: str, inventory: str) -> dict[str, dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="vllm-fleet-apply-") as tmp:
        tree = Path(tmp) / "tree"
        git(repo, "worktree", "add", "--detach", "--quiet", str(tree), ref)
        try:
            return inventory_hostvars(tree, inventory)
        finally:
            git(repo, "worktree", "remove", "--force", str(tree), check=False)


def recorded_commits(repo: Path, inventory: str, hosts: list[str]) -> dict[str, str | None]:
    """host -> the commit its deployed.json records (None: no record on the host)."""
    if not hosts:
        return {}
    proc = subprocess.run(
        [ansible_bin("ansible"), "-i", inventory, ",".join(hosts), "--become", "-o",
         "-m", "ansible.builtin.slurp", "-a", f"src={DEPLOYED}"],
        cwd=repo, capture_output=True, text=True, check=False,
    )  # fmt: skip
    commits: dict[str, str | None] = {}
    for line in proc.stdout.splitlines():
        match = ONE_LINE.match(line.strip())
        if not match:
            continue
        if match["state"] == "UNREACHABLE!":
            raise ApplyError(f"{match['host']} is unreachable: cannot tell what it runs")
        result = json.loads(match["json"])
        try:
            record = json.loads(base64.b64decode(result.get("content", "")))
            commits[match["host"]] = str(record["commit"])
        except (ValueError, KeyError, TypeError):
            commits[match["host"]] = None
    missing = sorted(set(hosts) - set(commits))
    if missing:
        raise ApplyError(f"no answer from {', '.join(missing)}: {proc.stderr.strip()[-500:]}")
    return commits


def decide(
    repo: Path, inventory: str, after: dict[str, dict[str, Any]], bases: dict[str, str | None]
) -> Decision:
    """bases: engine host -> the commit to compare it against (None: nothing recorded)."""
    decision = Decision()
    before_at: dict[str, dict[str, dict[str, Any]]] = {}
    code_at: dict[str, list[str]] = {}
    for host, base in sorted(bases.items()):
        new = engine_state(after.get(host, {}))
        if new is None:
            continue
        if base is None:
            decision.notes.append(f"{host}: no deploy record; site.yml brings it up")
            continue
        if not resolves(repo, base):
            decision.upgrade_hosts[host] = [
                f"its base commit {base[:12]} is not in this repository"
            ]
            continue
        if base not in before_at:
            before_at[base] = hostvars_at(repo, base, inventory)
            code_at[base] = code_changes(repo, base)
        old = engine_state(before_at[base].get(host, {}))
        # A host that gains its first engines has nothing to drain: site.yml brings it up.
        if old is None:
            continue
        why = reasons(old, new)
        if code_at[base]:
            shown = ", ".join(code_at[base][:3]) + (" ..." if len(code_at[base]) > 3 else "")
            why.append(f"engine code: {len(code_at[base])} files ({shown})")
        if why:
            decision.upgrade_hosts[host] = why
    if decision.upgrade_hosts:
        # The cache host too: a new hf/modelscope revision is fetched there first.
        limit = ",".join([*sorted(decision.upgrade_hosts), "model_cache"])
        decision.playbooks.append(["-i", inventory, UPGRADE, "--limit", limit])
    decision.playbooks.append(["-i", inventory, SITE])
    return decision


def apply(repo: Path, since: str, inventory: str, dry_run: bool) -> int:
    after = inventory_hostvars(repo, inventory)
    engine_hosts = sorted(h for h, v in after.items() if engine_state(v) is not None)
    try:
        if since == "deployed":
            bases = recorded_commits(repo, inventory, engine_hosts)
        else:
            bases = dict.fromkeys(engine_hosts, since)
        decision = decide(repo, inventory, after, bases)
    except (ApplyError, subprocess.CalledProcessError) as err:
        detail = getattr(err, "stderr", "") or ""
        print(f"apply: {err} {detail}".strip(), file=sys.stderr)
        return 1
    print(decision.describe(), flush=True)
    if dry_run:
        return 0
    for argv in decision.playbooks:
        rc = subprocess.run([ansible_bin("ansible-playbook"), *argv], cwd=repo, check=False)
        if rc.returncode != 0:
            print(f"apply: ansible-playbook {' '.join(argv)} failed (exit {rc.returncode})")
            return rc.returncode
    return 0
