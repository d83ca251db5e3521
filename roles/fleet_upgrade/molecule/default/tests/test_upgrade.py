"""fleet_upgrade moved a real engine from max_num_seqs 4 to 3 behind a real router; a broken
target (a flag vLLM refuses) is rolled back to 3 and the engine serves again."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from tests.molecule_hosts import podman_host

ROUTER = "vf-upgrade-router"
ENGINE = "vf-upgrade-engine"
ROUTER_URL = f"http://{ROUTER}:30000"
WORKER_URL = f"http://{ENGINE}:8100"
CLIENT_KEY = "molecule-only-router-client-key-8f02d4"
CONTROL_KEY = "molecule-only-router-control-key-1b7a55"
CONFIG = "/etc/vllm-fleet/engines/g0.json"
PREVIOUS = "/var/lib/vllm-fleet/upgrade/previous"
HOLD = "/var/lib/vllm-fleet/hold"
REPORTS = Path(os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY", "/nonexistent"), "reports")


@pytest.fixture(scope="module")
def engine():
    return podman_host(ENGINE)


def call(client, method, path, key, body=None):
    args = ["curl", "-s", "-m", "30", "-X", method, "-w", "\n%{http_code}", ROUTER_URL + path]
    args += ["-H", f"Authorization: Bearer {key}"]
    if body is not None:
        args += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
    text, _, status = client.check_output(shlex.join(args)).rpartition("\n")
    return int(status), text


def serving(engine) -> bool:
    status, text = call(engine, "GET", "/workers", CONTROL_KEY)
    assert status == 200, text
    return any(w["url"] == WORKER_URL and w["is_healthy"] for w in json.loads(text)["workers"])


def settings(engine) -> dict:
    return json.loads(engine.file(CONFIG).content_string)


def vllm_args(engine) -> str:
    return engine.check_output("ps -eo args | grep -F 'vllm serve' | grep -v grep")


def reports() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(REPORTS.glob("upgrade-*/report.json"))]


def test_the_engine_runs_the_new_settings(engine):
    assert settings(engine)["max_num_seqs"] == 3
    assert "--max-num-seqs 3" in vllm_args(engine)


def test_the_settings_it_started_from_are_kept_root_only(engine):
    previous = engine.file(f"{PREVIOUS}/g0.json")
    assert (previous.user, previous.mode) == ("root", 0o600)
    assert json.loads(previous.content_string)["max_num_seqs"] == 4


def test_it_is_back_in_the_router_with_no_hold_left(engine):
    assert engine.check_output(f"ls -A {HOLD}") == ""
    assert serving(engine)
    chat = {"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    status, text = call(engine, "POST", "/v1/chat/completions", CLIENT_KEY, chat)
    assert status == 200, text


def test_the_report_says_upgraded_after_an_idle_drain():
    upgraded = [r for r in reports() if r["hosts"] and r["hosts"][0]["groups"] == ["g0"]]
    assert len(upgraded) == 1, reports()
    record = upgraded[0]["hosts"][0]
    assert (record["host"], record["outcome"], record["step"]) == (ENGINE, "upgraded", "done")
    assert [d["idle"] for d in record["drained"]] == [True]
    # The idempotence run changed nothing, so it wrote no report: site.yml runs the role on
    # every run, and only a run that moved something has one (tasks/main.yml).
    assert len(reports()) == 1, [r["hosts"] for r in reports()]


def test_a_broken_target_is_rolled_back_and_serves_again(engine, tmp_path):
    scenario = Path(os.environ["MOLECULE_SCENARIO_DIRECTORY"])
    inventory = Path(os.environ["MOLECULE_INVENTORY_FILE"]).parent
    group_vars = yaml.safe_load((scenario / "molecule.yml").read_text())
    groups = group_vars["provisioner"]["inventory"]["group_vars"]["engines"]["fleet_engine_groups"]
    broken = [dict(g, extra_args=["--no-such-flag"]) for g in groups]
    extra = tmp_path / "broken.yml"
    extra.write_text(yaml.safe_dump({"fleet_engine_groups": broken}))
    env = dict(os.environ, ANSIBLE_ROLES_PATH=str(scenario.parents[2]))
    run = subprocess.run(
        ["ansible-playbook", "-i", str(inventory), str(scenario / "converge.yml"),
         "-e", f"@{extra}", "-e", "fleet_upgrade_stamp=broken-target"],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    output = run.stdout + run.stderr
    assert run.returncode != 0, output[-3000:]
    assert "failed at step restart" in output
    report = json.loads((REPORTS / "upgrade-broken-target/report.json").read_text())
    record = report["hosts"][0]
    assert (record["outcome"], record["step"]) == ("rolled back", "restart")
    assert "unrecognized arguments: --no-such-flag" in record["error"]
    assert record["rollback"] == "rolled back: g0 serving on the previous settings again"
    assert "--no-such-flag" not in settings(engine)["extra_args"]
    assert "--no-such-flag" not in vllm_args(engine)
    assert (REPORTS / "upgrade-broken-target/report.md").read_text().count("rolled back") >= 1
    assert serving(engine)
    assert engine.check_output(f"ls -A {HOLD}") == ""
