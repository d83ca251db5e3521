"""Run every role's Molecule scenario, sharing one engine-host image between them.

The scenarios run in two lanes at once. The first lane starts with engine_runtime's
scenario on the bare base image; its converged, verified container is then committed as the
engine-host image that the rest of that lane (model_weights, vllm_engine, and in make
test-all router and engine_watchdog and fleet_upgrade) and the lab end-to-end test start
from, where engine_runtime must find nothing to change. The second lane holds the scenarios
that need no engine host (apt, reboots, fixtures); fleet_verify (fixtures too) runs in the
first lane, where it balances the two. Each keeps its whole output in
reports/molecule/ROLE-test.log; the runner prints a line per scenario as it ends, then why
each failed one failed, then a table of seconds.
"""

from __future__ import annotations

import os
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
# (engine-host lane after the baker, lane without engine hosts), in order: balanced by the
# seconds each took side by side on a 2-core machine (make test: about 1180 s each).
LANES = (
    [
        "vllm_engine",
        "model_weights",
        "fleet_verify",
        "router",
        "engine_watchdog",
        "fleet_upgrade",
    ],
    ["ascend_stack", "cuda_stack", "monitoring", "preflight", "engine_firewall", "host_tls"],
)
SCENARIOS = [BAKER[0]] + [role for lane in LANES for role in lane]
# What the lab proves with real engines on every make test (tests/lab): these scenarios
# repeat it, so they run in make test-all only. The router's own checks (its user, its
# files' modes, keys out of its environment) are in tests/lab/test_exposure_lab.py.
LAB_COVERED = {"router", "engine_watchdog", "fleet_upgrade"}


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


def run_lane(
    lane: list[str], env: dict[str, str], baked: bool = False
) -> list[tuple[str, float, int]]:
    results = []
    if baked:
        results.append(bake(env))
        if results[0][2] != 0:
            return results  # the rest of this lane starts from the image it did not make
    for role in lane:
        started = time.monotonic()
        rc = molecule(role, "test", env=env, echo=False)
        seconds = time.monotonic() - started
        print(
            f"=== {role}: {'ok' if rc == 0 else f'FAILED rc={rc}'} in {seconds:.0f} s", flush=True
        )
        results.append((role, seconds, rc))
    return results


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
    lanes = [[r for r in lane if everything or r not in LAB_COVERED] for lane in LANES]
    scenarios = [BAKER[0]] + [role for lane in lanes for role in lane]
    with ThreadPoolExecutor(max_workers=len(lanes)) as pool:
        runs = [pool.submit(run_lane, lane, env, baked=i == 0) for i, lane in enumerate(lanes)]
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
