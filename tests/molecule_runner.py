"""Run every role's Molecule scenario, sharing one engine-host image between them.

The scenarios run in two lanes at once. The first lane starts with engine_runtime's
scenario on the bare base image; its converged, verified container is then committed as the
engine-host image that the scenarios after it in that lane (model_weights, and in make
test-all vllm_engine, router, engine_watchdog and fleet_upgrade) and the lab end-to-end test
start from, where engine_runtime must find nothing to change. The scenarios that need no
engine host (apt, reboots, fixtures) wait in one queue, longest first: the second lane takes
them from the start, the first once its engine-host scenarios are done, so the two lanes end
close together whatever each scenario takes on the machine. Each keeps its whole output in
reports/molecule/ROLE-test.log; the runner prints a line per scenario as it ends, then why
each failed one failed, then a table of seconds.
"""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.lab_images import ENGINE_IMAGE_ENV, ENGINE_IMAGE_REPO, engine_image_tag

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "reports" / "molecule"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Lines that say why a scenario failed: Ansible's fatal/failed results, pytest's failures.
WHY = re.compile(r"fatal:|failed=[1-9]|FAILED(?! - RETRYING)|Traceback|ERROR|(^|│ )E {3,}")
ASSERTION = re.compile(r"(^|│ )E {3,}")
BAKER = ("engine_runtime", "vf-engine-runtime")
# After the baker, on its image, in order.
ENGINE_HOST = ["vllm_engine", "model_weights", "router", "engine_watchdog", "fleet_upgrade"]
# Need no engine host: either lane takes the next, longest first (seconds side by side on a
# 2-core machine: ascend_stack 250, cuda_stack 166, fleet_verify 103, monitoring 87, ...).
ANY_HOST = [
    "ascend_stack",
    "cuda_stack",
    "fleet_verify",
    "monitoring",
    "engine_firewall",
    "preflight",
    "host_tls",
]
SCENARIOS = [BAKER[0], *ENGINE_HOST, *ANY_HOST]
# What the lab proves with real engines on every make test (tests/lab): these scenarios
# repeat it, so they run in make test-all only. The router's own checks (its user, its
# files' modes, keys out of its environment) are in tests/lab/test_exposure_lab.py; the
# engine's (its user, offline, pinned, its key files, bind, memory bound, sandbox score, a
# clean stop) in test_lab_e2e.py, test_exposure_lab.py and the change matrix's first row.
LAB_COVERED = {"router", "engine_watchdog", "fleet_upgrade", "vllm_engine"}


def molecule(role: str, *args: str, env: dict[str, str], echo: bool = True) -> int:
    """Run molecule, keeping its output in reports/molecule/ROLE-ACTION.log (and echoing it
    when it runs alone: lanes running at once would interleave)."""
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
            if echo:
                print(line, end="", flush=True)
            kept.write(line)
    return proc.returncode


def bake(env: dict[str, str]) -> tuple[str, float, int]:
    """engine_runtime's scenario, its container committed as the engine-host image."""
    role, container = BAKER
    started = time.monotonic()
    # --destroy=never also skips the sequence's first destroy: clear any instance (or stale
    # Molecule state) an interrupted earlier run left behind.
    molecule(role, "destroy", env=env, echo=False)
    rc = molecule(role, "test", "--destroy=never", env=env, echo=False)
    if rc == 0:
        subprocess.run(
            ["podman", "commit", "--quiet", container, env[ENGINE_IMAGE_ENV]], check=True
        )
        drop_stale_images(keep=env[ENGINE_IMAGE_ENV])
    molecule(role, "destroy", env=env, echo=False)
    seconds = time.monotonic() - started
    print(f"=== {role}: {'ok' if rc == 0 else f'FAILED rc={rc}'} in {seconds:.0f} s", flush=True)
    return role, seconds, rc


def run_scenario(role: str, env: dict[str, str]) -> tuple[str, float, int]:
    started = time.monotonic()
    rc = molecule(role, "test", env=env, echo=False)
    seconds = time.monotonic() - started
    print(f"=== {role}: {'ok' if rc == 0 else f'FAILED rc={rc}'} in {seconds:.0f} s", flush=True)
    return role, seconds, rc


def run_lane(
    own: list[str], shared: queue.SimpleQueue[str], env: dict[str, str], baked: bool = False
) -> list[tuple[str, float, int]]:
    """The lane's own scenarios (after the bake, on its image), then the shared queue's."""
    results = []
    if baked:
        results.append(bake(env))
        if results[0][2] != 0:
            own = []  # they start from the image it did not make; the queue's need none
    results += [run_scenario(role, env) for role in own]
    while True:
        try:
            role = shared.get_nowait()
        except queue.Empty:
            return results
        results.append(run_scenario(role, env))


def why_it_failed(role: str, context: int = 25) -> tuple[list[str], str]:
    """The first failure line of a scenario's log (and pytest's first ``E`` line after it),
    and the lines around it.

    CI keeps only the last few dozen lines of the run: the caller prints the excerpt before
    the summary table and the first lines in it, so the tail always names what failed.
    """
    log = LOGS / f"{role}-test.log"
    lines = [ANSI.sub("", line.rstrip()) for line in log.read_text().splitlines()]
    first = next((i for i, line in enumerate(lines) if WHY.search(line)), None)
    if first is None:
        return ["(no failure line found)"], "\n".join(f"  | {line}" for line in lines[-context:])
    said = [lines[first].strip()[:240]]
    said += [line.strip()[:240] for line in lines[first + 1 :] if ASSERTION.search(line)][:1]
    excerpt = lines[max(0, first - 3) : first + context]
    return said, "\n".join(f"  | {line}" for line in excerpt)


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
    env[ENGINE_IMAGE_ENV] = engine_image_tag()
    results: list[tuple[str, float, int]] = []

    everything = os.environ.get("VLLM_FLEET_MOLECULE_ALL") == "1"
    engine_host = [r for r in ENGINE_HOST if everything or r not in LAB_COVERED]
    scenarios = [BAKER[0], *engine_host, *ANY_HOST]
    shared: queue.SimpleQueue[str] = queue.SimpleQueue()
    for role in ANY_HOST:
        shared.put(role)
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = [
            pool.submit(run_lane, engine_host, shared, env, baked=True),
            pool.submit(run_lane, [], shared, env),
        ]
        for run in runs:
            results.extend(run.result())

    failures = {role: why_it_failed(role) for role, _, code in results if code != 0}
    for role, (_, excerpt) in failures.items():
        print(f"\n--- why {role} failed (whole log: reports/molecule/{role}-test.log)")
        print(excerpt)
    print("\nmolecule scenarios:")
    for role, seconds, code in results:
        print(f"  {role:16s} {seconds:6.0f} s  {'ok' if code == 0 else f'FAILED rc={code}'}")
    for role, (said, _) in failures.items():
        for line in said:
            print(f"  {role} failed: {line}")
    passed = sum(1 for _, _, code in results if code == 0)
    print(f"{passed} passed, {len(scenarios) - passed} failed or not run")
    skipped = sorted(set(SCENARIOS) - set(scenarios))
    if skipped:
        print(f"left to make test-all (the lab covers them): {', '.join(skipped)}")
    return 0 if passed == len(scenarios) else 1


if __name__ == "__main__":
    sys.exit(main())
