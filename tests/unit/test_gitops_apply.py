"""`vllm-fleet apply --since REF` on a real fleet repository (a temporary git repo holding
the lab inventory), read with the real ansible-inventory at both commits."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.paths import ROOT
from vllm_fleet.deploy.gitops import SITE, UPGRADE, apply

INVENTORY = "inventories/lab"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "fleet"
    shutil.copytree(ROOT / INVENTORY, repo / INVENTORY)
    shutil.copy(ROOT / "ansible.cfg", repo / "ansible.cfg")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "base")
    return repo


def edit(repo: Path, relative: str, change) -> str:
    path = repo / INVENTORY / relative
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    git(repo, "commit", "-qam", "x")
    return git(repo, "rev-parse", "HEAD~1")


def run_apply(repo: Path, since: str, capsys) -> str:
    assert apply(repo, since, INVENTORY, dry_run=True) == 0
    return capsys.readouterr().out


def test_a_model_revision_change_is_a_rolling_upgrade_of_its_engines(repo, capsys):
    def new_revision(data):
        data["fleet_models"]["smollm2-135m"]["revision"] = "c" * 64

    since = edit(repo, "group_vars/all/models.yml", new_revision)
    out = run_apply(repo, since, capsys)
    assert "engine01: rolling upgrade (model smollm2-135m: revision)" in out
    assert "engine02: rolling upgrade (model smollm2-135m: revision)" in out
    assert (
        f"run: ansible-playbook -i {INVENTORY} {UPGRADE} --limit engine01,engine02,model_cache"
        in out
    )
    assert out.rstrip().endswith(f"run: ansible-playbook -i {INVENTORY} {SITE}")


def test_one_hosts_engine_settings_upgrade_only_that_host(repo, capsys):
    def fewer_seqs(data):
        data["fleet_engine_groups"][0]["max_num_seqs"] = 12

    since = edit(repo, "host_vars/engine02.yml", fewer_seqs)
    out = run_apply(repo, since, capsys)
    assert "engine02: rolling upgrade (engine group settings)" in out
    assert "engine01" not in out
    assert f"{UPGRADE} --limit engine02,model_cache" in out


def test_a_router_setting_change_is_site_yml_only(repo, capsys):
    def router_timeout(data):
        data["fleet_router"]["request_timeout_seconds"] = 30

    since = edit(repo, "group_vars/all/fleet.yml", router_timeout)
    out = run_apply(repo, since, capsys)
    assert "no upgrade" in out
    assert UPGRADE not in out
    assert f"run: ansible-playbook -i {INVENTORY} {SITE}" in out
    # The base commit's worktree is gone again.
    assert git(repo, "worktree", "list").count("\n") == 0


def test_an_engine_role_change_upgrades_every_engine_host(repo, capsys):
    template = repo / "roles/vllm_engine/templates/vllm-engine@.service.j2"
    template.parent.mkdir(parents=True)
    template.write_text("[Service]\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "engine unit")
    out = run_apply(repo, git(repo, "rev-parse", "HEAD~1"), capsys)
    reason = "engine code: 1 files (roles/vllm_engine/templates/vllm-engine@.service.j2)"
    assert f"engine01: rolling upgrade ({reason})" in out
    assert f"engine02: rolling upgrade ({reason})" in out


def test_a_molecule_scenario_change_upgrades_nothing(repo, capsys):
    scenario = repo / "roles/vllm_engine/molecule/default/molecule.yml"
    scenario.parent.mkdir(parents=True)
    scenario.write_text("---\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "scenario only")
    out = run_apply(repo, git(repo, "rev-parse", "HEAD~1"), capsys)
    assert "no upgrade" in out
    assert UPGRADE not in out


def test_a_base_commit_missing_from_the_repository_is_upgraded(repo, capsys):
    out = run_apply(repo, "f" * 40, capsys)
    assert (
        "engine01: rolling upgrade (its base commit ffffffffffff is not in this repository)" in out
    )
    assert f"{UPGRADE} --limit engine01,engine02,model_cache" in out
