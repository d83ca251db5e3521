"""The lab's shared helpers: run playbooks against it, run commands in its hosts, and the
rows of its fault and change matrices (tests/lab/conftest.py prints them at the end)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.lab_images import engine_image_tag
from tests.support.paths import ROOT
from vllm_fleet.lab.client_load import LoadStats

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
# The fault matrix of the last lab session that ran it, as Markdown (docs/faults.md's table).
FAULTS_REPORT = ROOT / "reports" / "faults.md"


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


@dataclass
class TwoRuns:
    """site.yml run thrice at once: the first holds the lock and the lease, the others are refused."""

    first: PlaybookRun
    second: PlaybookRun
    lock_taken: float  # seconds after the first started
    first_pid: int
    other_checkout: PlaybookRun  # with a lock of its own: refused by the lease
    lease: dict[str, object]  # the first run's, on router01
    lease_after: dict[str, dict[str, object] | None]  # per router, once the first ended


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
    asserted: str = ""  # the bound the case asserted, set by the case before it asserts

    def line(self) -> str:
        detected = "-" if self.detected is None else f"{self.detected:.1f}"
        stats = self.stats
        return (
            f"{self.fault:28s} {detected:>8s} {self.recovered:>9.1f} {stats.plain_ok:>5d} "
            f"{stats.plain_retried:>7d} {stats.plain_failed:>6d} {stats.streams_ok:>5d} "
            f"{stats.streams_cut:>4d} {stats.streams_refused:>7d} {self.lost:>5d}  {self.note}"
        )

    def markdown(self) -> str:
        """The row as docs/faults.md's table has it, with what the case asserted."""
        detected = "-" if self.detected is None else f"{self.detected:.1f}"
        s = self.stats
        loaded = bool(s.requests)
        requests = f"{s.plain_ok} / {s.plain_retried} / **{s.plain_failed}**" if loaded else "-"
        streams = f"{s.streams_ok} / {s.streams_cut} / {s.streams_refused}" if loaded else "-"
        cells = [self.fault, detected, f"{self.recovered:.1f}", requests, streams,
                 str(self.lost), self.asserted or "(failed before its bound)", self.note]  # fmt: skip
        return "| " + " | ".join(c.replace("|", "/") for c in cells) + " |"


@dataclass
class AttackRow:
    """One attack tried on the lab (tests/lab/test_attack_lab.py) and what answered."""

    who: str
    tried: str
    expected: str
    answered: str

    def line(self) -> str:
        # The boundary held: what was refused was refused, what it must allow was allowed.
        verdict = "held" if self.answered == self.expected else "GOT THROUGH"
        return (
            f"{self.who:22s} | {self.tried:58s} | {self.expected:8s} | "
            f"{self.answered:26s} | {verdict}"
        )


ATTACKS: list[AttackRow] = []
ATTACK_HEADER = f"{'who':22s} | {'tried':58s} | {'expected':8s} | {'answered':26s} | verdict"

CHAOS_MATRIX: list[ChaosRow] = []
CHAOS_HEADER = (
    f"{'fault':28s} {'detect s':>8s} {'recover s':>9s} {'ok':>5s} {'retried':>7s} "
    f"{'failed':>6s} {'s.ok':>5s} {'cut':>4s} {'refused':>7s} {'lost':>5s}  note"
)
CHAOS_MARKDOWN_HEADER = (
    "| fault | detect s | recover s | requests ok / retried / failed | streams ok / cut / "
    "refused | files lost | asserted | note |\n|---|---|---|---|---|---|---|---|"
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
    names: int = 1  # served names the load asked for (each: 2 non-streaming clients, 1 streaming)

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
# Each row as it is recorded: a run that is stopped or killed before its summary (the whole
# matrix takes hours) keeps the figures of the rows it finished.
MATRIX_REPORT = ROOT / "reports" / "change-matrix.txt"


def record_matrix_row(row: MatrixRow) -> None:
    if not MATRIX:
        MATRIX_REPORT.parent.mkdir(parents=True, exist_ok=True)
        MATRIX_REPORT.write_text(f"{MATRIX_HEADER}\n")
    MATRIX.append(row)
    with MATRIX_REPORT.open("a") as report:
        report.write(f"{row.line()}\n")
