"""Preflight refuses a bad inventory before any host changes: it is the first play of every
entry point that changes hosts, it stops every host at once, and nothing it runs before the
verdict changes a host.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.support.paths import ROOT
from vllm_fleet.ansible import preflight_action
from vllm_fleet.preflight import Finding, PreflightResult

# Entry points that change hosts (model_cache.yml is imported by both, after preflight).
ENTRY_POINTS = ["site.yml", "playbooks/site.yml", "playbooks/upgrade.yml"]
IMPORT = ("ansible.builtin.import_playbook", "import_playbook")
VERDICT = "vllm_fleet_preflight"
# The deploy lock: a flock on a controller file, taken before anything else; no host change.
LOCK = "vllm_fleet_deploy_lock"
# Modules that only read the host (command tasks must say so with changed_when: false).
READ_ONLY = {
    "ansible.builtin.setup",
    "ansible.builtin.command",
    "ansible.builtin.slurp",
    "ansible.builtin.find",
    "ansible.builtin.stat",
    "ansible.builtin.set_fact",  # a controller-side variable, not a host change
}
TASK_KEYS = {
    "name", "when", "register", "changed_when", "failed_when", "check_mode", "loop",
    "loop_control", "vars", "tags", "run_once", "block", "delegate_to", "become", "no_log",
}  # fmt: skip


def plays(playbook: Path) -> list[tuple[Path, dict]]:
    """The plays a playbook runs, in order, with import_playbook expanded."""
    out = []
    for entry in yaml.safe_load(playbook.read_text()):
        target = next((entry[k] for k in IMPORT if k in entry), None)
        if target is None:
            out.append((playbook, entry))
        else:
            out += plays(playbook.parent / target)
    return out


def flatten(tasks: list[dict]) -> list[dict]:
    out = []
    for task in tasks:
        out += flatten(task["block"]) if "block" in task else [task]
    return out


def module_of(task: dict) -> str:
    [module] = set(task) - TASK_KEYS
    return module


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_preflight_is_the_first_play_and_stops_every_host(entry):
    source, play = plays(ROOT / entry)[0]
    assert source == ROOT / "playbooks/preflight.yml"
    assert play["hosts"] == "all"
    assert play["roles"] == [{"role": "preflight"}]
    # One refused host stops the run everywhere; no --tags selection leaves it out.
    assert play["any_errors_fatal"] is True
    assert "always" in play["tags"]


def test_nothing_before_the_verdict_changes_a_host():
    tasks = flatten(yaml.safe_load((ROOT / "roles/preflight/tasks/main.yml").read_text()))
    modules = [module_of(t) for t in tasks]
    verdict = modules.index(VERDICT)
    for task, module in zip(tasks[:verdict], modules[:verdict], strict=True):
        assert module in READ_ONLY | {LOCK}, (task["name"], module)
        if module == "ansible.builtin.command":
            assert task["changed_when"] is False, task["name"]
    # The verdict runs once, on the controller, for every host of the play.
    assert tasks[verdict]["run_once"] is True
    assert tasks[verdict][VERDICT]["hosts"] == "{{ ansible_play_hosts_all }}"


def test_the_deploy_lock_is_taken_first_once_on_the_controller():
    """Before any probe: a second run is refused before it reaches a host at all."""
    [first, *rest] = flatten(yaml.safe_load((ROOT / "roles/preflight/tasks/main.yml").read_text()))
    assert module_of(first) == LOCK
    assert first["run_once"] is True
    assert first["delegate_to"] == "localhost"
    assert LOCK not in map(module_of, rest)


def test_the_verdict_is_a_failure_that_changes_nothing():
    """What the plugin returns for a refused inventory (the fuzz drives the rest of its path)."""
    refused = PreflightResult(errors=[Finding("h1", "fleet_accelerator", "gpu", "bad", "fix")])
    result = preflight_action.summarize(refused, ["h1"])
    assert result["failed"] is True and result["changed"] is False
    assert "no host was changed" in result["msg"]
    assert "failed" not in preflight_action.summarize(PreflightResult(), ["h1"])
