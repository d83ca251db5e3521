"""The lab end to end: a fresh lab brought up once per session, then checked."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.lab_images import engine_image_tag
from vllm_fleet.deploy.lock import read_record
from vllm_fleet.lab.client_load import LoadStats

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("VLLM_FLEET_CACHE", "/var/cache/vllm-fleet"))
ENGINES = ["engine01", "engine02"]
RECAP = re.compile(
    r"^(?P<host>\S+)\s+: ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+"
    r"unreachable=(?P<unreachable>\d+)\s+failed=(?P<failed>\d+)",
    re.MULTILINE,
)


@dataclass
class PlaybookRun:
    returncode: int
    output: str
    seconds: float

    def recap(self) -> dict[str, dict[str, int]]:
        return {
            m["host"]: {k: int(m[k]) for k in ("ok", "changed", "unreachable", "failed")}
            for m in RECAP.finditer(self.output)
        }


TIMINGS = ROOT / "reports" / "timings"


def timings_env(name: str) -> dict[str, str]:
    """Seconds per task of this run in reports/timings/ (plugins/callback/vllm_fleet_timings)."""
    TIMINGS.mkdir(parents=True, exist_ok=True)
    out = TIMINGS / f"{time.strftime('%H%M%S')}-{Path(name).stem}.json"
    return {**os.environ, "VLLM_FLEET_TIMINGS_OUT": str(out)}


def playbook(*args: str) -> PlaybookRun:
    started = time.monotonic()
    proc = subprocess.run(
        ["ansible-playbook", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env=timings_env(args[0]),
    )
    return PlaybookRun(proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started)


def in_host(
    host: str, *argv: str, check: bool = True, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run argv in a lab container; ``stdin`` feeds it (secrets go there, not on argv)."""
    interactive = ["-i"] if stdin is not None else []
    return subprocess.run(
        ["podman", "exec", *interactive, host, *argv],
        capture_output=True,
        text=True,
        check=check,
        input=stdin,
    )


def lab_engine_image() -> str:
    """The engine-host image the Molecule run baked, else the bare base image."""
    image = os.environ.get("VLLM_FLEET_ENGINE_IMAGE") or engine_image_tag()
    exists = subprocess.run(["podman", "image", "exists", image], check=False).returncode == 0
    return image if exists else "localhost/vllm-fleet-lab:bookworm"


def pinned_revision() -> str:
    models = yaml.safe_load((ROOT / "inventories/lab/group_vars/all/models.yml").read_text())
    return models["fleet_models"]["smollm2-135m"]["revision"]


def engine_key() -> str:
    return (ROOT / ".lab/secrets/engine_api_key").read_text().strip()


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


@dataclass
class TwoRuns:
    """site.yml run twice at once: the first holds the deploy lock, the second is refused."""

    first: PlaybookRun
    second: PlaybookRun
    lock_taken: float  # seconds after the first started
    first_pid: int


@pytest.fixture(scope="session")
def two_runs(fresh_lab: PlaybookRun, tmp_path_factory: pytest.TempPathFactory) -> TwoRuns:
    """site.yml again on the converged lab, at -vvv (the secrets test reads its output), and a
    second site.yml started while it holds the deploy lock."""
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
    returncode = first.wait()
    return TwoRuns(
        PlaybookRun(returncode, log.read_text(), time.monotonic() - started),
        second,
        lock_taken,
        first.pid,
    )


@pytest.fixture(scope="session")
def second_run(two_runs: TwoRuns) -> PlaybookRun:
    return two_runs.first


def smoke_in(
    host: str, env_file: str = "/etc/vllm-fleet/engines/g0.env"
) -> subprocess.CompletedProcess[str]:
    return in_host(
        host,
        "vllm-fleet",
        "smoke",
        "--config=/etc/vllm-fleet/engines/g0.json",
        f"--env-file={env_file}",
        check=False,
    )


def engine_settings(host: str) -> dict[str, object]:
    return json.loads(in_host(host, "cat", "/etc/vllm-fleet/engines/g0.json").stdout)


@dataclass
class ChaosRow:
    """One fault of the matrix and what it cost."""

    fault: str
    detected: float | None  # seconds from the fault until the fleet noticed it
    recovered: float  # seconds from the fault until it served fully again
    stats: LoadStats
    lost: int  # files of the serving revision missing or changed afterwards
    note: str = ""

    def line(self) -> str:
        detected = "-" if self.detected is None else f"{self.detected:.1f}"
        stats = self.stats
        return (
            f"{self.fault:28s} {detected:>8s} {self.recovered:>9.1f} {stats.plain_ok:>5d} "
            f"{stats.plain_retried:>7d} {stats.plain_failed:>6d} {stats.streams_ok:>5d} "
            f"{stats.streams_cut:>4d} {stats.streams_refused:>7d} {self.lost:>5d}  {self.note}"
        )


CHAOS_MATRIX: list[ChaosRow] = []
CHAOS_HEADER = (
    f"{'fault':28s} {'detect s':>8s} {'recover s':>9s} {'ok':>5s} {'retried':>7s} "
    f"{'failed':>6s} {'s.ok':>5s} {'cut':>4s} {'refused':>7s} {'lost':>5s}  note"
)
CHAOS_LEGEND = (
    "ok/retried/failed: non-streaming requests (retried = succeeded after a client retry); "
    "s.ok/cut/refused: streams (cut = broken off after they started); "
    "lost: files of the serving revision missing or changed afterwards"
)


@dataclass
class MatrixRow:
    """One change of the change matrix (tests/lab/test_change_matrix_lab.py) and what it cost."""

    change: str
    playbook: str
    seconds: float
    stats: LoadStats
    min_serving: int  # fewest engines of a served name the load used, in any router sample
    verify: str
    rerun_changed: int | None

    def line(self) -> str:
        s = self.stats
        rerun = "-" if self.rerun_changed is None else str(self.rerun_changed)
        return (
            f"{self.change:32s} | {self.playbook:11s} | {self.seconds:5.0f} | "
            f"{s.plain_ok:5d} / {s.plain_failed:<3d} | {s.streams_ok:4d} / {s.streams_cut:<3d} | "
            f"{self.min_serving:3d} | {self.verify:6s} | {rerun}"
        )


MATRIX: list[MatrixRow] = []
MATRIX_HEADER = (
    f"{'change':32s} | {'playbook':11s} | {'secs':>5s} | requests ok/failed | "
    "streams ok/cut | min engines serving | verify | rerun changed"
)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The fault and change matrices, at the end of the run where CI's tail shows them."""
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


# Run after every other lab test, in this order: the fault matrix restarts hosts and services;
# the rolling upgrades leave the lab on another revision and settings than the inventory's;
# the change matrix starts from there.
LAST = {"test_chaos_lab.py": 1, "test_upgrade_lab.py": 2, "test_change_matrix_lab.py": 3}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: LAST.get(item.path.name, 0))
