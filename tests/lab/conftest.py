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


def playbook(*args: str) -> PlaybookRun:
    started = time.monotonic()
    proc = subprocess.run(
        ["ansible-playbook", *args], cwd=ROOT, capture_output=True, text=True, check=False
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


@pytest.fixture(scope="session")
def second_run(fresh_lab: PlaybookRun) -> PlaybookRun:
    """site.yml again on the converged lab, at -vvv (the secrets test reads its output)."""
    return playbook("site.yml", "-vvv")


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
