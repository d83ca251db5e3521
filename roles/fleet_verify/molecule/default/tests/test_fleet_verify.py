"""fleet_verify over two fixture engines: an honest fleet passes; real faults make it fail.

The fixtures (tests/fixtures/openai_fixture_server.py) stand in for vLLM engines. The failure
proofs restart fixture g1 misbehaving and re-run the verifier on the host with the config and
keys the role left there: it must exit 1 and blame the right check.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tests.molecule_hosts import podman_hosts

testinfra_hosts = podman_hosts()

KEY = "molecule-only-verify-engine-key-4b2d9e"  # fleet_engine_api_key in molecule.yml
WORK = "/var/lib/vllm-fleet/verify"
AGENT = "/opt/vllm-fleet/agent/bin/vllm-fleet"
GROUPS = {"g0": 8100, "g1": 8101}
ALL_CHECKS = {
    "smoke vf-verify/g0",
    "smoke vf-verify/g1",
    "crosstalk",
    "prefix_cache vf-verify/g0",
    "prefix_cache vf-verify/g1",
}


def report_of(host, out_dir: str) -> dict:
    return json.loads(host.file(f"{out_dir}/report.json").content_string)


def checks_of(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}


def set_mode(host, group: str, mode: str) -> None:
    """Restart one fixture in another mode and wait until it answers again."""
    env = f"/etc/vf-verify-fixture/{group}.env"
    host.check_output(f"sed -i 's/^FIXTURE_MODE=.*/FIXTURE_MODE={mode}/' {env}")
    host.check_output(f"systemctl restart vf-verify-fixture@{group}.service")
    host.check_output(
        f"for i in $(seq 100); do curl -sf -o /dev/null http://127.0.0.1:{GROUPS[group]}/health"
        " && exit 0; sleep 0.1; done; exit 1"
    )
    assert f"--mode {mode}" in host.check_output(
        f"systemctl show -p MainPID --value vf-verify-fixture@{group} | xargs ps -o args= -p"
    )


def run_verify(host, name: str) -> tuple[int, str, dict, str]:
    """Re-run the verifier as the role does, into another --out; (rc, stdout, report, ps).

    ps (with every process's environment) is captured while the verifier runs.
    """
    out = f"/tmp/vf-verify-proof/{name}"
    result = host.run(
        f"rm -rf {out} && mkdir -p {out}.d && "
        f"{{ {AGENT} verify --config={WORK}/verify.json --env-file={WORK}/verify.env"
        f" --out={out} > {out}.d/stdout 2>&1 & pid=$!; sleep 1;"
        f" ps axeww -o args > {out}.d/ps; wait $pid; echo $? > {out}.d/rc; }}"
    )
    assert result.rc == 0, result.stderr
    rc = int(host.file(f"{out}.d/rc").content_string)
    stdout = host.file(f"{out}.d/stdout").content_string
    ps = host.file(f"{out}.d/ps").content_string
    assert "vllm-fleet verify" in ps, "ps missed the verifier run"
    return rc, stdout, report_of(host, out), ps


@pytest.fixture
def honest_afterwards(host):
    yield
    for group in GROUPS:
        set_mode(host, group, "honest")


def test_fixtures_run_as_stand_ins(host):
    for group in GROUPS:
        unit = f"vf-verify-fixture@{group}.service"
        assert host.service(unit).is_running
        description = host.check_output(f"systemctl show -p Description --value {unit}")
        assert description.startswith(f"Test fixture {group}:")


def test_the_role_left_a_passing_report_on_the_host(host):
    report = report_of(host, f"{WORK}/last")
    assert report["verdict"] == "pass"
    checks = checks_of(report)
    assert set(checks) == ALL_CHECKS
    assert {c["status"] for c in checks.values()} == {"pass"}
    assert report["router"] is None
    assert report["concurrency"] == {"smollm2": 16}
    rows = {row["group"]: row for row in report["fleet"]}
    assert sorted(rows) == ["g0", "g1"]
    for group, port in GROUPS.items():
        row = rows[group]
        assert row["host"] == "vf-verify"
        assert row["url"] == f"http://127.0.0.1:{port}"
        assert row["stack"] == "cpu-vllm-0.32.0"
        assert row["model"] == "smollm2-135m"
        assert row["dtype"] == "float32"
        assert row["max_num_seqs"] == 4
        assert row["health"] == "ok"
        # The fixture reports 1000 blocks of 16.
        assert row["kv_capacity_tokens"] == 16000
    markdown = host.file(f"{WORK}/last/report.md").content_string
    assert markdown.startswith("# vllm-fleet verify: PASS")
    # No deploy record in this scenario (the deploy_record role does not run here).
    assert "| vf-verify | g0 | cpu-vllm-0.32.0 | not recorded | smollm2-135m |" in markdown
    assert "| vf-verify | g1 | cpu-vllm-0.32.0 | not recorded | smollm2-135m |" in markdown


def test_the_report_was_fetched_to_the_controller():
    runs = sorted(Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"], "reports").iterdir())
    assert runs, "no report fetched"
    for run in runs:
        assert json.loads((run / "report.json").read_text())["verdict"] == "pass"
        assert (run / "report.md").read_text().startswith("# vllm-fleet verify: PASS")
        assert KEY not in (run / "report.json").read_text() + (run / "report.md").read_text()


def test_the_keys_file_is_root_only(host):
    assert host.file(WORK).mode == 0o700
    for name in ("verify.env", "verify.json"):
        f = host.file(f"{WORK}/{name}")
        assert (f.user, f.group, f.mode) == ("root", "root", 0o600)
    assert KEY in host.file(f"{WORK}/verify.env").content_string
    assert KEY not in host.file(f"{WORK}/verify.json").content_string


def test_the_key_is_in_no_report_process_list_or_journal(host):
    for name in ("report.json", "report.md"):
        assert KEY not in host.file(f"{WORK}/last/{name}").content_string
    assert KEY not in host.check_output("ps axeww -o args")
    assert KEY not in host.check_output("journalctl --no-pager -o cat")


def test_a_swapping_engine_fails_crosstalk(host, honest_afterwards):
    set_mode(host, "g1", "swap")
    rc, stdout, report, ps = run_verify(host, "swap")
    assert rc == 1, stdout
    assert KEY not in ps
    assert "verdict: FAIL" in stdout
    assert report["verdict"] == "fail"
    checks = checks_of(report)
    crosstalk = checks["crosstalk"]
    assert crosstalk["status"] == "fail"
    assert crosstalk["details"]["totals"]["contaminated"] > 0
    assert any("carry another prompt's marker" in r for r in crosstalk["details"]["reasons"])
    assert crosstalk["details"]["contamination_examples"]
    # Only the cross-talk check sees it: every request alone still gets its own answer.
    assert {n for n, c in checks.items() if c["status"] == "fail"} == {"crosstalk"}


def test_an_engine_without_prefix_caching_fails_the_probe(host, honest_afterwards):
    set_mode(host, "g1", "no_prefix_cache")
    rc, stdout, report, ps = run_verify(host, "no_prefix_cache")
    assert rc == 1, stdout
    assert KEY not in ps
    checks = checks_of(report)
    assert {n for n, c in checks.items() if c["status"] == "fail"} == {"prefix_cache vf-verify/g1"}
    probe = checks["prefix_cache vf-verify/g1"]
    assert probe["details"]["second"]["hits"] == 0
    assert probe["details"]["second"]["queries"] > 0
    assert checks["prefix_cache vf-verify/g0"]["details"]["second"]["hits"] > 0


def test_restored_fixtures_pass_again(host):
    rc, stdout, report, _ = run_verify(host, "honest")
    assert rc == 0, stdout
    assert report["verdict"] == "pass"
