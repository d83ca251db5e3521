"""Lab bring-up time by phase, and the idempotent re-run as a fraction of the first run.

    python bench/lab_bringup.py          # with whatever the cache already holds
    python bench/lab_bringup.py --cold   # empty cache dir and a rebuilt base image

Phases: image, wheelhouse (and the other prepare steps), containers, runtime, weights,
engine start, smoke; then a full second site.yml run. All measured in this one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", action="store_true", help="rebuild image and caches from nothing")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.cold:
        env["VLLM_FLEET_CACHE"] = tempfile.mkdtemp(prefix="vllm-fleet-bench-")
        subprocess.run(
            ["podman", "rmi", "--force", "localhost/vllm-fleet-lab:bookworm"], check=False
        )

    timings_file = ROOT / ".lab" / "bench-prepare.json"
    timings_file.parent.mkdir(parents=True, exist_ok=True)
    phases: list[tuple[str, float]] = []
    timed([sys.executable, "-m", "vllm_fleet.lab", "prepare", "--timings", str(timings_file)], env)
    phases += list(json.loads(timings_file.read_text()).items())

    timed(["ansible-playbook", "lab/lab.yml", "-e", "lab_state=absent"], env)
    phases.append(("containers", timed(["ansible-playbook", "lab/lab.yml"], env)))
    for tag, label in [
        ("runtime", "runtime"),
        ("weights", "weights"),
        ("engines", "engine start"),
        ("smoke", "smoke"),
    ]:
        phases.append((label, timed(["ansible-playbook", "site.yml", "--tags", tag], env)))
    first = sum(s for name, s in phases if name in {"runtime", "weights", "engine start", "smoke"})
    rerun = timed(["ansible-playbook", "site.yml"], env)

    print(f"\nlab bring-up ({'cold' if args.cold else 'warm cache'}), seconds by phase:")
    for name, seconds in phases:
        print(f"  {name:14s} {seconds:7.1f}")
    print(f"  {'total':14s} {sum(s for _, s in phases):7.1f}")
    print(f"\nsite.yml first run (runtime+weights+engines+smoke): {first:.1f} s")
    print(f"site.yml idempotent re-run: {rerun:.1f} s = {rerun / first:.2f} of the first run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
