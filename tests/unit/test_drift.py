"""`vllm-fleet drift`: a real ansible-playbook --check --diff run on the controller, with the
bundle's callback, tells drift (exit 2) from none (0) and from failure (1), and names the
file and the change; a no_log task's content never reaches the report."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from tests.support.paths import ROOT
from vllm_fleet.deploy.drift import DRIFT, FAILED, NO_DRIFT, drift, enabled_callbacks

LOCAL = ["-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}"]


@pytest.fixture(autouse=True)
def bundle_config(monkeypatch):
    monkeypatch.setenv("ANSIBLE_CONFIG", str(ROOT / "ansible.cfg"))
    monkeypatch.setenv("ANSIBLE_NOCOLOR", "1")


def write_play(tmp_path: Path, tasks: list[dict[str, object]]) -> str:
    play = [{"name": "Drift test", "hosts": "localhost", "gather_facts": False, "tasks": tasks}]
    path = tmp_path / "play.yml"
    path.write_text(yaml.safe_dump(play, sort_keys=False))
    return str(path)


def unit_task(dest: Path, content: str, **extra: object) -> dict[str, object]:
    return {
        "name": "Install the unit",
        "ansible.builtin.copy": {"dest": str(dest), "content": content, "mode": "0644"},
        **extra,
    }


def test_an_edited_file_is_drift_with_its_name_and_diff(tmp_path):
    unit = tmp_path / "vllm-engine@.service"
    unit.write_text("[Service]\nExecStart=/bin/edited-by-hand\n")
    play = write_play(tmp_path, [unit_task(unit, "[Service]\nExecStart=/bin/declared\n")])

    result = drift(play, tmp_path / "out", LOCAL, tmp_path, stream=False)

    assert result.status == DRIFT
    (change,) = result.hosts["localhost"]["changed"]
    assert change["task"] == "Install the unit"
    assert change["diffs"][0]["after_header"] == str(unit)
    markdown = (tmp_path / "out/drift.md").read_text()
    assert markdown.startswith("# Drift check: drift")
    assert f"- would change: - / Install the unit: {unit}" in markdown
    assert "-ExecStart=/bin/edited-by-hand" in markdown
    assert "+ExecStart=/bin/declared" in markdown
    # --check: the host is untouched.
    assert unit.read_text() == "[Service]\nExecStart=/bin/edited-by-hand\n"


def test_a_converged_host_is_no_drift(tmp_path):
    unit = tmp_path / "unit.service"
    unit.write_text("[Service]\n")
    unit.chmod(0o644)
    play = write_play(tmp_path, [unit_task(unit, "[Service]\n")])

    result = drift(play, tmp_path / "out", LOCAL, tmp_path, stream=False)

    assert result.status == NO_DRIFT
    assert result.hosts == {"localhost": {"changed": [], "failed": []}}
    assert "| localhost | 0 | 0 |" in result.markdown


def test_a_failed_task_fails_the_drift_check(tmp_path):
    task = {"name": "Refuse", "ansible.builtin.fail": {"msg": "fleet_router.port=0 is not a port"}}
    result = drift(write_play(tmp_path, [task]), tmp_path / "out", LOCAL, tmp_path, stream=False)

    assert result.status == FAILED
    assert "- FAILED: - / Refuse: fleet_router.port=0 is not a port" in result.markdown


def test_a_no_log_change_keeps_its_content_out_of_the_report(tmp_path):
    secret = "sk-drift-test-0123456789abcdef"
    env_file = tmp_path / "g0.env"
    env_file.write_text("VLLM_API_KEY=old\n")
    play = write_play(tmp_path, [unit_task(env_file, f"VLLM_API_KEY={secret}\n", no_log=True)])

    result = drift(play, tmp_path / "out", LOCAL, tmp_path, stream=False)

    assert result.status == DRIFT
    for written in (tmp_path / "out").iterdir():
        assert secret not in written.read_text(), written.name


def test_a_template_change_names_its_destination_not_the_rendered_temp_file(tmp_path):
    (tmp_path / "timer.j2").write_text("[Timer]\nOnCalendar={{ schedule }}\n")
    timer = tmp_path / "vllm-fleet-verify.timer"
    timer.write_text("[Timer]\nOnCalendar=hourly\n")
    task = {
        "name": "Install the timer",
        "ansible.builtin.template": {"src": str(tmp_path / "timer.j2"), "dest": str(timer)},
        "vars": {"schedule": "daily"},
    }

    result = drift(write_play(tmp_path, [task]), tmp_path / "out", LOCAL, tmp_path, stream=False)

    assert result.status == DRIFT
    assert f"- would change: - / Install the timer: {timer}\n" in result.markdown
    assert f"--- {timer}" in result.markdown and f"+++ {timer}" in result.markdown
    assert "-OnCalendar=hourly" in result.markdown and "+OnCalendar=daily" in result.markdown


def test_without_the_callbacks_record_the_drift_check_fails_instead_of_saying_no_drift(
    tmp_path, monkeypatch
):
    # The callback cannot be found: the playbook itself runs fine and changes nothing.
    monkeypatch.setenv("ANSIBLE_CALLBACK_PLUGINS", str(tmp_path / "nowhere"))
    unit = tmp_path / "unit.service"
    unit.write_text("[Service]\n")
    unit.chmod(0o644)
    play = write_play(tmp_path, [unit_task(unit, "[Service]\n")])

    result = drift(play, tmp_path / "out", LOCAL, tmp_path, stream=False)

    assert result.playbook_rc == 0
    assert result.status == FAILED
    assert result.markdown.startswith("# Drift check: failed")


def test_the_drift_run_keeps_the_callbacks_already_enabled(monkeypatch):
    """Its callback is added to ansible.cfg's list (or the environment's), not put in its place:
    the variable it sets replaces the file's list, the plugin preload among them."""
    monkeypatch.delenv("ANSIBLE_CALLBACKS_ENABLED", raising=False)
    assert enabled_callbacks(ROOT) == ["vllm_fleet_timings", "vllm_fleet_preload"]
    monkeypatch.setenv("ANSIBLE_CALLBACKS_ENABLED", "profile_tasks, vllm_fleet_preload")
    assert enabled_callbacks(ROOT) == ["profile_tasks", "vllm_fleet_preload"]
