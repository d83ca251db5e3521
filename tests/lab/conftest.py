"""The lab end to end: a fresh lab brought up once per session, then checked."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.lab.faults import ROGUE, ROGUE_ADDRESS
from tests.support.lab import (
    ATTACK_HEADER,
    ATTACKS,
    CHAOS_HEADER,
    CHAOS_LEGEND,
    CHAOS_MARKDOWN_HEADER,
    CHAOS_MATRIX,
    FAULTS_REPORT,
    MATRIX,
    MATRIX_HEADER,
    ROOT,
    PlaybookRun,
    TwoRuns,
    in_host,
    lab_engine_image,
    playbook,
)
from vllm_fleet.deploy.lock import read_record


@pytest.fixture(scope="session")
def fresh_lab() -> Iterator[PlaybookRun]:
    """Remove any lab, create a new one, run site.yml once; yields that run.

    VLLM_FLEET_LAB_REUSE=1 uses the lab as it is instead (while working on one test;
    CI always starts fresh).
    """
    if os.environ.get("VLLM_FLEET_LAB_REUSE") == "1":
        yield PlaybookRun(0, "lab reused as it is", 0.0)
        return
    down = playbook("lab/lab.yml", "-e", "lab_state=absent")
    assert down.returncode == 0, down.output[-3000:]
    up = playbook("lab/lab.yml", "-e", f"lab_engine_image={lab_engine_image()}")
    assert up.returncode == 0, up.output[-3000:]
    first = playbook("site.yml")
    print(f"\nfirst site.yml run: {first.seconds:.0f} s")
    yield first


@pytest.fixture(scope="session")
def two_runs(fresh_lab: PlaybookRun, tmp_path_factory: pytest.TempPathFactory) -> TwoRuns:
    """site.yml again on the converged lab, at -vvv (the secrets test reads its output); a
    second site.yml from the same checkout started while it holds the deploy lock, and a third
    as from another controller's checkout while it holds the deploy lease."""
    log = tmp_path_factory.mktemp("second-run") / "site.log"
    started = time.monotonic()
    with log.open("w") as out:
        first = subprocess.Popen(
            ["ansible-playbook", "site.yml", "-vvv"], cwd=ROOT, stdout=out, stderr=out
        )
    lock_taken = 0.0
    while (record := read_record(ROOT / ".deploy.lock")) is None or record.pid != first.pid:
        lock_taken = time.monotonic() - started
        assert first.poll() is None and lock_taken < 300, log.read_text()[-3000:]
        time.sleep(0.2)
    second = playbook("site.yml")
    # A second controller's checkout has a lock of its own: only the lease on the routers
    # (taken once the first run's inventory passed) stands between the two.
    while (lease := lease_on("router01")) is None or lease["pid"] != first.pid:
        assert first.poll() is None, log.read_text()[-3000:]
        time.sleep(0.5)
    other_lock = tmp_path_factory.mktemp("other-checkout") / "deploy.lock"
    other = playbook("site.yml", "-e", f"preflight_deploy_lock_path={other_lock}")
    returncode = first.wait()
    return TwoRuns(
        PlaybookRun(returncode, log.read_text(), time.monotonic() - started),
        second,
        lock_taken,
        first.pid,
        other,
        lease,
        {host: lease_on(host) for host in ("router01", "router02")},
    )


def lease_on(host: str) -> dict[str, object] | None:
    """The deploy lease a lab host holds, if any."""
    found = in_host(host, "cat", "/var/lib/vllm-fleet/deploy.lease", check=False)
    return json.loads(found.stdout) if found.returncode == 0 else None


@pytest.fixture(scope="module")
def rogue() -> Iterator[str]:
    """A container on the lab network at ROGUE_ADDRESS that is none of the fleet's hosts."""
    subprocess.run(["podman", "rm", "--force", ROGUE], capture_output=True, check=False)
    subprocess.run(
        ["podman", "run", "-d", "--name", ROGUE, "--network", "vllm-fleet-lab",
         "--ip", ROGUE_ADDRESS, "localhost/vllm-fleet-lab:bookworm", "sleep", "infinity"],
        capture_output=True, check=True,
    )  # fmt: skip
    yield ROGUE
    subprocess.run(["podman", "rm", "--force", ROGUE], capture_output=True, check=False)


@pytest.fixture(scope="session")
def second_run(two_runs: TwoRuns) -> PlaybookRun:
    return two_runs.first


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The attack, fault and change matrices, at the end of the run where CI's tail shows them."""
    if ATTACKS:
        terminalreporter.section("attack matrix")
        terminalreporter.write_line(ATTACK_HEADER)
        for attack in ATTACKS:
            terminalreporter.write_line(attack.line())
    if MATRIX:
        terminalreporter.section("change matrix")
        terminalreporter.write_line(MATRIX_HEADER)
        for matrix_row in MATRIX:
            terminalreporter.write_line(matrix_row.line())
    if not CHAOS_MATRIX:
        return
    terminalreporter.section("fault matrix")
    terminalreporter.write_line(CHAOS_LEGEND)
    terminalreporter.write_line(CHAOS_HEADER)
    for row in CHAOS_MATRIX:
        terminalreporter.write_line(row.line())
    # The same rows as docs/faults.md's table, each with the bound it asserted.
    FAULTS_REPORT.parent.mkdir(parents=True, exist_ok=True)
    rows = "\n".join(row.markdown() for row in CHAOS_MATRIX)
    FAULTS_REPORT.write_text(f"{CHAOS_MARKDOWN_HEADER}\n{rows}\n")
    terminalreporter.write_line(f"(as Markdown, with each row's asserted bound: {FAULTS_REPORT})")


# Run after every other lab test, in this order: the fault matrix restarts hosts and services;
# the rolling upgrades leave the lab on another revision and settings than the inventory's;
# the change matrix starts from there.
LAST = {"test_chaos_lab.py": 1, "test_upgrade_lab.py": 2, "test_change_matrix_lab.py": 3}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: LAST.get(item.path.name, 0))
