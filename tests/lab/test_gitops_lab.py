"""Git as the source of truth, on the lab: the example pipelines' drift job finds no drift
on a converged lab, finds a hand-edited unit file (host and file named), and the apply job
puts it back; every host records the commit it runs, and the verify report shows it."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest
import yaml

from tests.support.lab import ROOT, in_host

PIPELINE = ROOT / "examples/pipelines/gitlab-ci.yml"
DRIFT_MD = ROOT / "reports/drift/drift.md"
TIMER = "/etc/systemd/system/vllm-fleet-verify.timer"


def run_job(name: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The job's script lines, as the runner would run them, against the lab inventory."""
    lines = yaml.safe_load(PIPELINE.read_text())[name]["script"]
    variables = {"FLEET_INVENTORY": "inventories/lab", **env}
    exports = [f"export {k}={v}" for k, v in variables.items()]
    return subprocess.run(
        ["bash", "-ec", "\n".join([*exports, *lines])],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip


def drift_rows(report: str) -> dict[str, tuple[int, int]]:
    """host -> (would change, failed) from the drift report's table."""
    rows = {}
    for line in report.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 3 and cells[1].isdigit():
            rows[cells[0]] = (int(cells[1]), int(cells[2]))
    return rows


def head() -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_every_host_records_the_commit_it_runs(fresh_lab):
    for host in ("router01", "engine01", "engine02"):
        record = json.loads(in_host(host, "cat", "/etc/vllm-fleet/deployed.json").stdout)
        assert record["commit"] == head(), host
        assert record["settings_sha256"]
    engine = json.loads(in_host("engine01", "cat", "/etc/vllm-fleet/deployed.json").stdout)
    assert engine["stack"] == "cpu-vllm-0.32.0"
    assert set(engine["models"]) == {"smollm2-135m"}
    reports = sorted((ROOT / "reports").glob("2*T*Z/report.md"))
    assert f"| engine01 | g0 | cpu-vllm-0.32.0 | {head()[:12]}" in reports[-1].read_text()


# make test: the hand-edit case below shows a converged engine host with no change.
@pytest.mark.full
def test_drift_job_finds_nothing_on_a_converged_lab(fresh_lab):
    """Also the check-mode run on a converged fleet: the job's drift check is site.yml --check --diff."""
    job = run_job("drift")
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-2000:]
    assert DRIFT_MD.read_text().startswith("# Drift check: no drift")


@pytest.fixture(scope="module")
def hand_edited_timer(fresh_lab) -> Iterator[str]:
    """router01's verify timer edited by hand; put back afterwards if the apply job (make
    test-all) did not, so the lab's later tests (the idempotent re-run) start converged."""
    original = in_host("router01", "cat", TIMER).stdout
    in_host("router01", "sed", "-i", "s/^OnCalendar=.*/OnCalendar=hourly/", TIMER)
    yield original
    if in_host("router01", "cat", TIMER).stdout != original:
        in_host("router01", "sh", "-c", f"cat > {TIMER}", stdin=original)
        in_host("router01", "systemctl", "daemon-reload")


# make test: `vllm-fleet drift` runs a real ansible-playbook --check --diff with the bundle's
# callback in tests/unit/test_drift.py (an edited file named with its diff, a converged host
# no drift, a failed task a failure, a no_log task's content kept out); this whole-fleet
# check-mode run (262 s in make test at d01a684) runs in make test-all.
@pytest.mark.full
def test_a_hand_edited_unit_is_drift_named_by_host_and_file(hand_edited_timer):
    job = run_job("drift")
    assert job.returncode == 2, job.stdout[-3000:]
    report = DRIFT_MD.read_text()
    assert report.startswith("# Drift check: drift")
    rows = drift_rows(report)
    assert rows["router01"][0] >= 1
    # The converged engine hosts would change nothing: check mode on a fleet that matches its
    # inventory reports no change.
    assert rows["engine01"] == rows["engine02"] == (0, 0)
    assert f"Install the scheduled verification [vllm-fleet-verify.timer]: {TIMER}" in report
    assert "-OnCalendar=hourly" in report and "+OnCalendar=daily" in report
    # Check mode showed the change and made none.
    assert "OnCalendar=hourly" in in_host("router01", "cat", TIMER).stdout


# make test: site.yml itself puts hosts back (the lab's first run and its idempotent re-run).
@pytest.mark.full
def test_the_apply_job_puts_the_hand_edit_back(hand_edited_timer):
    applied = run_job("apply")
    assert applied.returncode == 0, applied.stdout[-3000:]
    assert "no upgrade" in applied.stdout
    assert in_host("router01", "cat", TIMER).stdout == hand_edited_timer
