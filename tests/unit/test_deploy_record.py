"""The deploy_record role, run for real on the controller (paths in a temporary directory):
it records the bundle's commit and the host's settings, changes nothing on a second run,
and moves applied_at only when what is deployed changed."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml

from tests.support.paths import ROOT
from tests.support.playbook import changed_count, role_play, run_play


def run_role(tmp_path: Path, revision: str, *args: str) -> tuple[int, int, str]:
    variables = {
        "fleet_engine_stack": "cpu-vllm-0.32.0",
        "fleet_engine_groups": [{"name": "g0", "model": "smollm2-135m", "port": 8100}],
        "fleet_models": {
            "smollm2-135m": {"source": "mirror", "revision": revision, "served_name": "smollm2"}
        },
        "fleet_engine_api_key": "never-recorded-0123456789",
        "deploy_record_path": str(tmp_path / "etc/deployed.json"),
        "deploy_record_facts_dir": str(tmp_path / "facts.d"),
        "deploy_record_bundle_dir": str(ROOT),
    }
    (tmp_path / "vars.yml").write_text(yaml.safe_dump(variables))
    play = role_play("Record", "deploy_record", "engine01", tmp_path / "vars.yml")
    proc = run_play(tmp_path, play, *args)
    return proc.returncode, changed_count(proc.stdout), proc.stdout


def test_record_is_written_once_and_moves_only_with_the_deployment(tmp_path):
    rc, changed, out = run_role(tmp_path, "a" * 64)
    assert rc == 0, out[-3000:]
    assert changed == 3  # directories, record, facts link
    record_file = tmp_path / "etc/deployed.json"
    first = json.loads(record_file.read_text())
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert first["commit"] == head
    assert first["stack"] == "cpu-vllm-0.32.0"
    assert first["models"] == {"smollm2-135m": "a" * 64}
    assert re.fullmatch(r"[0-9a-f]{64}", first["settings_sha256"])
    assert isinstance(first["dirty"], bool)
    assert "never-recorded" not in record_file.read_text()
    assert (tmp_path / "facts.d/vllm_fleet.fact").resolve() == record_file

    rc, changed, out = run_role(tmp_path, "a" * 64)
    assert (rc, changed) == (0, 0), out[-3000:]
    assert json.loads(record_file.read_text()) == first

    rc, changed, out = run_role(tmp_path, "b" * 64, "--check", "--diff")
    assert (rc, changed) == (0, 1), out[-3000:]
    assert '-        "smollm2-135m": "aaaa' in out
    assert json.loads(record_file.read_text()) == first

    rc, changed, out = run_role(tmp_path, "b" * 64)
    assert (rc, changed) == (0, 1), out[-3000:]
    second = json.loads(record_file.read_text())
    assert second["models"] == {"smollm2-135m": "b" * 64}
    assert second["settings_sha256"] != first["settings_sha256"]
    assert second["applied_at"] >= first["applied_at"]
