"""A rolling upgrade of the lab under load: failed requests, engines serving, unavailability.

    python bench/upgrade_bench.py      # the lab must be up and deployed (make lab)

One run, measured side by side: the upgrade to a variant (a new model revision published
to the mirror, max_num_seqs 16 -> 12 on every engine), then the upgrade back to the
inventory. During each, a bounded client load runs through the router (3 non-streaming
clients, 1 streaming) and the router's worker listing is sampled every 0.25 s. Printed per
upgrade: failed requests (target 0), the minimum number of engines serving at any moment
(target: all but one), each engine's time out of rotation, and the wall time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from vllm_fleet.lab.client_load import ClientLoad
from vllm_fleet.lab.paths import LAB_ROUTER_URL
from vllm_fleet.lab.rotation import RotationSampler
from vllm_fleet.lab.variants import inventory_variant, publish_revision, remove_revision

ROOT = Path(__file__).resolve().parents[1]

CACHE = Path(os.environ.get("VLLM_FLEET_CACHE", "/var/cache/vllm-fleet"))
ROUTER = LAB_ROUTER_URL
# The router lists engines by address (inventories/lab fleet_address).
ENGINES = {"engine01": "http://10.89.0.21:8100", "engine02": "http://10.89.0.22:8100"}
MODEL = "smollm2"
VARIANT = "upgrade-bench"


def secret(name: str) -> str:
    return (ROOT / ".lab/secrets" / name).read_text().strip()


def measured_upgrade(name: str, args: list[str]) -> dict[str, Any]:
    print(f"{name}: upgrading ...", flush=True)
    started = time.monotonic()
    with (
        RotationSampler(ROUTER, secret("router_control_key"), list(ENGINES.values())) as sampler,
        ClientLoad(ROUTER, secret("router_client_key"), MODEL) as clients,
    ):
        proc = subprocess.run(
            ["ansible-playbook", "playbooks/upgrade.yml", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        wall = time.monotonic() - started
        time.sleep(2)  # a little load after the last engine returned
    if proc.returncode != 0:
        sys.exit(f"{name}: upgrade.yml failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}")
    stats, rotation = clients.stats, sampler.rotation
    return {
        "upgrade": name,
        "wall_seconds": round(wall, 1),
        "requests_ok": stats.plain_ok + stats.streams_ok,
        "requests_failed": stats.plain_failed + stats.streams_cut + stats.streams_refused,
        "min_engines_serving": rotation.min_serving(),
        "engines": len(ENGINES),
        "unavailable_seconds": {
            host: round(rotation.unavailable_seconds()[url], 1) for host, url in ENGINES.items()
        },
        "samples": len(rotation.samples),
        "sample_errors": rotation.errors,
        "failures": stats.failures[:5],
    }


def main() -> int:
    revision = publish_revision(CACHE, "revision B of the upgrade bench")
    inventory = inventory_variant(ROOT, VARIANT, revision, 12)
    try:
        rows = [
            measured_upgrade("to variant", ["-i", str(inventory)]),
            measured_upgrade("back", []),
        ]
    finally:
        remove_revision(CACHE, revision)
        shutil.rmtree(inventory, ignore_errors=True)
    print()
    print(
        f"{'upgrade':<12} {'wall s':>7} {'ok':>6} {'failed':>7} {'min serving':>12}  out of rotation (s)"
    )
    for r in rows:
        out = ", ".join(f"{h} {s}" for h, s in r["unavailable_seconds"].items())
        print(
            f"{r['upgrade']:<12} {r['wall_seconds']:>7} {r['requests_ok']:>6} "
            f"{r['requests_failed']:>7} {r['min_engines_serving']:>7} of {r['engines']}  {out}"
        )
    for r in rows:
        met = r["requests_failed"] == 0 and r["min_engines_serving"] >= r["engines"] - 1
        print(
            f"{r['upgrade']}: 0 failed and >= {r['engines'] - 1} serving: {'met' if met else 'MISSED'}"
        )
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out_file = ROOT / "reports" / f"bench-upgrade-{stamp}.json"
    out_file.parent.mkdir(exist_ok=True)
    out_file.write_text(json.dumps({"revision": revision, "runs": rows}, indent=2))
    print(f"report: {out_file.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
