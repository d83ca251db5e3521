"""Run every role's Molecule scenario, sharing one engine-host image between them.

engine_runtime's scenario runs first on the bare base image. Its converged, verified
container is then committed as the engine-host image that the model_weights, vllm_engine,
router (its engine host) and engine_watchdog scenarios (and the lab end-to-end test) start
from, where engine_runtime must find nothing to change. Prints each scenario's time.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from tests.lab_images import ENGINE_IMAGE_ENV, ENGINE_IMAGE_REPO, engine_image_tag

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "reports" / "molecule"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Lines that say why a scenario failed: Ansible's fatal/failed results, pytest's failures.
WHY = re.compile(r"fatal:|failed=[1-9]|FAILED(?! - RETRYING)|Traceback|ERROR|(^|│ )E {3,}")
BAKER = ("engine_runtime", "vf-engine-runtime")
SCENARIOS = [
    "preflight",
    "model_weights",
    "vllm_engine",
    "router",
    "engine_watchdog",
    "fleet_verify",
    "fleet_upgrade",
    "monitoring",
    "ascend_stack",
    "cuda_stack",
]


def molecule(role: str, *args: str, env: dict[str, str]) -> int:
    """Run molecule, echoing its output and keeping it in reports/molecule/ROLE-ACTION.log."""
    print(f"\n=== molecule {' '.join(args)} ({role})", flush=True)
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / f"{role}-{args[0]}.log"
    with (
        subprocess.Popen(
            ["molecule", *args],
            cwd=ROOT / "roles" / role,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        ) as proc,
        log.open("w") as kept,
    ):
        assert proc.stdout is not None
        for line in proc.stdout:
            print(line, end="", flush=True)
            kept.write(line)
    return proc.returncode


def why_it_failed(role: str, context: int = 40) -> str:
    """The end of a failed scenario's log from its first failure line: CI shows only a tail."""
    log = LOGS / f"{role}-test.log"
    lines = [ANSI.sub("", line.rstrip()) for line in log.read_text().splitlines()]
    first = next((i for i, line in enumerate(lines) if WHY.search(line)), len(lines) - context)
    start = max(0, first - 5)
    excerpt = lines[start : start + 3 * context]
    return "\n".join(f"  | {line}" for line in excerpt)


def drop_stale_images(keep: str) -> None:
    """Engine images of earlier sources are 3 GB each: keep only the current one."""
    listing = subprocess.run(
        ["podman", "images", "--format", "{{.Repository}}:{{.Tag}}", ENGINE_IMAGE_REPO],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for image in listing:
        if image != keep:
            subprocess.run(["podman", "rmi", "--force", image], check=False)


def main() -> int:
    env = dict(os.environ)
    image = engine_image_tag()
    env[ENGINE_IMAGE_ENV] = image
    results: list[tuple[str, float, int]] = []

    role, container = BAKER
    started = time.monotonic()
    # --destroy=never also skips the sequence's first destroy: clear any instance (or stale
    # Molecule state) an interrupted earlier run left behind.
    molecule(role, "destroy", env=env)
    rc = molecule(role, "test", "--destroy=never", env=env)
    if rc == 0:
        subprocess.run(["podman", "commit", "--quiet", container, image], check=True)
        drop_stale_images(keep=image)
    molecule(role, "destroy", env=env)
    results.append((role, time.monotonic() - started, rc))

    if rc == 0:
        for role in SCENARIOS:
            started = time.monotonic()
            rc = molecule(role, "test", env=env)
            results.append((role, time.monotonic() - started, rc))

    print("\nmolecule scenarios:")
    for role, seconds, code in results:
        print(f"  {role:16s} {seconds:6.0f} s  {'ok' if code == 0 else f'FAILED rc={code}'}")
    for role, _, code in results:
        if code != 0:
            print(f"\n--- why {role} failed (whole log: reports/molecule/{role}-test.log)")
            print(why_it_failed(role))
    passed = sum(1 for _, _, code in results if code == 0)
    print(f"{passed} passed, {1 + len(SCENARIOS) - passed} failed")
    return 0 if passed == 1 + len(SCENARIOS) else 1


if __name__ == "__main__":
    sys.exit(main())
