"""site.yml never restarts every engine at once: its engine play rolls like upgrade.yml,
except on hosts that run no engine group yet, which hold no capacity to protect."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.support.paths import ROOT

# Roles that restart engine groups (fleet_upgrade includes vllm_engine's apply).
RESTARTING = {"vllm_engine", "fleet_upgrade"}
IMPORT = "ansible.builtin.import_playbook"
NEW_HOSTS = "select('in', groups['fleet_new_engine_hosts']"


def role_names(play: dict) -> set[str]:
    return {r["role"] if isinstance(r, dict) else r for r in play.get("roles", [])}


def resolved(value: Any, play_vars: dict[str, Any]) -> Any:
    """A play keyword that is one of the import's vars (with or without a default), replaced
    by the value the import gives it."""
    if isinstance(value, str) and value.startswith("{{"):
        name = value.removeprefix("{{").split("|")[0].removesuffix("}}").strip()
        if name in play_vars:
            return play_vars[name]
    return value


def plays_of(playbook: Path, play_vars: dict[str, Any] | None = None) -> list[dict]:
    """The plays a playbook runs, imports expanded, each keyword that names an import's var
    replaced by the value the import gives it."""
    out: list[dict] = []
    for entry in yaml.safe_load(playbook.read_text()):
        if IMPORT in entry:
            out += plays_of(playbook.parent / entry[IMPORT], entry.get("vars", {}))
        else:
            out.append({k: resolved(v, play_vars or {}) for k, v in entry.items()})
    return out


def engine_plays(playbook: str) -> list[dict]:
    return [p for p in plays_of(ROOT / playbook) if role_names(p) & RESTARTING]


def test_every_play_that_restarts_serving_engines_goes_a_canary_then_batches():
    for playbook in ("playbooks/site.yml", "playbooks/upgrade.yml"):
        plays = engine_plays(playbook)
        assert plays, playbook
        for play in plays:
            new_hosts_only = NEW_HOSTS in str(play["hosts"])
            if not new_hosts_only:
                assert str(play["serial"]).startswith("{{ [1,"), (playbook, play["name"])
            assert play["max_fail_percentage"] == 0, (playbook, play["name"])
            # Restarts go through fleet_upgrade's drain, never vllm_engine applied bare.
            assert "vllm_engine" not in role_names(play), (playbook, play["name"])


def test_site_yml_starts_new_hosts_at_once_and_rolls_every_other_engine_host():
    """The two engine plays split the engine hosts: those preflight found running no group,
    all in one batch, and every other one (so none is left out) behind the canary."""
    new, serving = engine_plays("playbooks/site.yml")
    assert NEW_HOSTS in new["hosts"] and new["serial"] == "100%"
    assert serving["hosts"] == new["hosts"].replace("select(", "reject(")
    assert serving["serial"].startswith("{{ [1,")
    assert role_names(new) == role_names(serving)
    # Only a host whose engine groups the probe listed (and found none) counts as new.
    assert (
        new_host_rules()["fleet_new_engine_hosts"][0] == "preflight_engine_files.files is defined"
    )


def test_site_yml_sets_up_new_routers_at_once_and_restarts_the_others_one_at_a_time():
    new, serving = [p for p in plays_of(ROOT / "playbooks/site.yml") if "router" in role_names(p)]
    assert "groups['fleet_new_router_hosts']" in new["hosts"] and new["serial"] == "100%"
    assert serving["hosts"] == new["hosts"].replace("select(", "reject(")
    assert serving["serial"] == 1 and serving["max_fail_percentage"] == 0
    # Only a router host whose files the probe read (router.json not among them) is new.
    assert (
        "preflight_key_files_now.results is defined" in new_host_rules()["fleet_new_router_hosts"]
    )


def new_host_rules() -> dict[str, list[str]]:
    """Each group preflight forms, with its conditions."""
    tasks = yaml.safe_load((ROOT / "roles/preflight/tasks/main.yml").read_text())
    return {
        t["ansible.builtin.group_by"]["key"]: t["when"]
        for t in tasks
        if "ansible.builtin.group_by" in t
    }


def test_nothing_before_the_engine_plays_restarts_an_engine():
    plays = plays_of(ROOT / "playbooks/site.yml")
    before = plays[: next(i for i, p in enumerate(plays) if role_names(p) & RESTARTING)]
    for play in before:
        assert not role_names(play) & {"vllm_engine", "engine_watchdog"}, play.get("name")


def test_every_batch_of_a_serial_play_renews_the_deploy_lease_first():
    """A run one host at a time can outlast the lease; each batch renews it (and stops if
    another run took it) before its roles change anything."""
    for playbook in ("playbooks/site.yml", "playbooks/upgrade.yml"):
        serial = [p for p in plays_of(ROOT / playbook) if "serial" in p]
        assert serial, playbook
        for play in serial:
            renewals = [
                task
                for task in play.get("pre_tasks", [])
                if task.get("ansible.builtin.include_role", {}).get("tasks_from") == "renew_lease"
            ]
            assert len(renewals) == 1, (playbook, play["name"])
            assert renewals[0]["tags"] == ["always"], (playbook, play["name"])
