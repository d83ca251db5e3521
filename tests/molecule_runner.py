"""Run every role's Molecule scenario, sharing one engine-host image between them.

engine_runtime's scenario runs first on the bare base image. Its converged, verified
container is then committed as the engine-host image that the model_weights and
vllm_engine scenarios (and the lab end-to-end test) start from, where engine_runtime
must find nothing to change. Prints each scenario's time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.lab_images import ENGINE_IMAGE_ENV, engine_image_tag

ROOT = Path(__file__).resolve().parents[1]
BAKER = ("engine_runtime", "vf-engine-runtime")
SCENARIOS = ["model_weights", "vllm_engine"]


def molecule(role: str, *args: str, env: dict[str, str]) -> int:
    print(f"\n=== molecule {' '.join(args)} ({role})", flush=True)
    return subprocess.run(["molecule", *args], cwd=ROOT / "roles" / role, env=env, check=False).returncode


def main() -> int:
    env = dict(os.environ)
    image = engine_image_tag()
    env[ENGINE_IMAGE_ENV] = image
    timings: list[tuple[str, float, str]] = []
    failed = False

    role, container = BAKER
    started = time.monotonic()
    rc = molecule(role, "test", "--destroy=never", env=env)
    if rc == 0:
        subprocess.run(["podman", "commit", "--quiet", container, image], check=True, env=env)
    molecule(role, "destroy", env=env)
    timings.append((role, time.monotonic() - started, "ok" if rc == 0 else f"FAILED rc={rc}"))
    failed |= rc != 0

    for role in SCENARIOS if not failed else []:
        started = time.monotonic()
        rc = molecule(role, "test", env=env)
        timings.append((role, time.monotonic() - started, "ok" if rc == 0 else f"FAILED rc={rc}"))
        failed |= rc != 0

    print("\nmolecule scenarios:")
    for role, seconds, status in timings:
        print(f"  {role:16s} {seconds:6.0f} s  {status}")
    print(f"{sum(1 for t in timings if t[2] == 'ok')} passed, {sum(1 for t in timings if t[2] != 'ok')} failed")
    return 1 if failed or len(timings) != 1 + len(SCENARIOS) else 0


if __name__ == "__main__":
    sys.exit(main())
