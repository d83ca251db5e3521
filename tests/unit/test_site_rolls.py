"""site.yml never restarts every engine at once: its engine play rolls like upgrade.yml."""

from __future__ import annotations

import yaml

from tests.support.paths import ROOT

# Roles that restart engine groups (fleet_upgrade includes vllm_engine's apply).
RESTARTING = {"vllm_engine", "fleet_upgrade"}


def role_names(play: dict) -> set[str]:
    return {r["role"] if isinstance(r, dict) else r for r in play.get("roles", [])}


def engine_plays(playbook: str) -> list[dict]:
    plays = yaml.safe_load((ROOT / playbook).read_text())
    return [p for p in plays if role_names(p) & RESTARTING]


def test_every_play_that_restarts_engines_goes_a_canary_then_batches_and_stops_on_failure():
    for playbook in ("playbooks/site.yml", "playbooks/upgrade.yml"):
        plays = engine_plays(playbook)
        assert plays, playbook
        for play in plays:
            assert play["serial"].startswith("{{ [1,"), (playbook, play["name"])
            assert play["max_fail_percentage"] == 0, (playbook, play["name"])
            # Restarts go through fleet_upgrade's drain, never vllm_engine applied bare.
            assert "vllm_engine" not in role_names(play), (playbook, play["name"])


def test_nothing_before_the_rolling_play_restarts_an_engine():
    plays = yaml.safe_load((ROOT / "playbooks/site.yml").read_text())
    before = plays[: next(i for i, p in enumerate(plays) if role_names(p) & RESTARTING)]
    for play in before:
        assert not role_names(play) & {"vllm_engine", "engine_watchdog"}, play.get("name")


def test_every_batch_of_a_serial_play_renews_the_deploy_lease_first():
    """A run one host at a time can outlast the lease; each batch renews it (and stops if
    another run took it) before its roles change anything."""
    for playbook in ("playbooks/site.yml", "playbooks/upgrade.yml"):
        plays = yaml.safe_load((ROOT / playbook).read_text())
        serial = [p for p in plays if "serial" in p]
        assert serial, playbook
        for play in serial:
            renewals = [
                task
                for task in play.get("pre_tasks", [])
                if task.get("ansible.builtin.include_role", {}).get("tasks_from") == "renew_lease"
            ]
            assert len(renewals) == 1, (playbook, play["name"])
            assert renewals[0]["tags"] == ["always"], (playbook, play["name"])
