"""The suite by layer, with a time table at the end (``make test`` / ``make test-all``).

Each layer is a make target; the first that fails stops the run (the later ones would only
repeat its failure), and the table says which layer failed and how long each took.
``test`` is what CI runs: every mechanism once. ``test-all`` adds every further row of the
change and fault matrices (pytest marker ``full``), every Molecule scenario, and the benches'
own checks in quick sizes on the lab the matrices leave up (``make bench-check``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

# (layer, make target, environment it adds)
LAYERS: dict[str, list[tuple[str, str, dict[str, str]]]] = {
    "test": [
        ("lint", "lint", {}),
        ("unit", "unit", {}),
        ("molecule", "molecule", {}),
        ("lab", "e2e", {}),
    ],
    "test-all": [
        ("lint", "lint", {}),
        ("unit", "unit", {}),
        ("molecule", "molecule", {"VLLM_FLEET_MOLECULE_ALL": "1"}),
        ("lab", "e2e-all", {}),
        ("bench", "bench-check", {}),
    ],
}


def main(suite: str) -> int:
    rows: list[tuple[str, float, int]] = []
    status = 0
    for name, target, env in LAYERS[suite]:
        started = time.monotonic()
        status = subprocess.call(
            ["make", "--no-print-directory", target], env={**os.environ, **env}
        )
        rows.append((name, time.monotonic() - started, status))
        if status != 0:
            break
    total = sum(seconds for _, seconds, _ in rows)
    print(f"\n== make {suite}: time per layer ==")
    print(f"{'layer':10s} {'seconds':>8s}  result")
    for name, seconds, code in rows:
        print(f"{name:10s} {seconds:8.0f}  {'ok' if code == 0 else f'FAILED (exit {code})'}")
    print(f"{'total':10s} {total:8.0f}  ({total / 60:.1f} min)")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "test"))
