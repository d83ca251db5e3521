"""What verifying a fleet of several served names costs, all names at once against one after
another.

    python bench/verify_names_bench.py                  # 4 names, 3 rounds
    python bench/verify_names_bench.py --names 2 --rounds 2    # quick (make bench-check)

`vllm-fleet verify` checks every served name at once, their loads in lockstep
(vllm_fleet.verify.lockstep). Against fixture engines (tests/fixtures: real HTTP on loopback,
each request held for a fixed latency, as a busy engine would) behind a fixture router that
routes by model, one run verifies every name at once; the other verifies each name alone, one
after another (what verify did before the lockstep). The arms alternate round by round;
medians are compared.

Target: all names at once take at most 0.6x the time of one after another (ideal 1/names).
A missed target is printed as MISSED; only a failed verification makes the exit status
non-zero.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fixtures.openai_fixture_server import (  # noqa: E402
    CLIENT_KEY,
    ENGINE_KEY,
    fixture_fleet,
    verify_config,
)

from vllm_fleet.verify.config import ApiKeys, VerifyConfig  # noqa: E402
from vllm_fleet.verify.runner import run_checks  # noqa: E402

TARGET = 0.6
KEYS = ApiKeys(ENGINE_KEY, CLIENT_KEY)


def timed(cfg: VerifyConfig) -> float:
    start = time.perf_counter()
    checks, _ = asyncio.run(run_checks(cfg, KEYS))
    failed = [f"{c.name}: {c.summary}" for c in checks if c.status == "fail"]
    if failed:
        raise SystemExit("verification failed:\n" + "\n".join(failed))
    return time.perf_counter() - start


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", type=int, default=4, help="served names, one engine each")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--latency", type=float, default=0.2, help="seconds an engine holds a request"
    )
    args = parser.parse_args(argv)
    names = [f"model-{i}" for i in range(args.names)]
    arms: dict[str, list[float]] = {"all names at once": [], "one after another": []}
    with fixture_fleet(served_names=names, latency_s=args.latency) as (engines, router):
        fleet = VerifyConfig.model_validate(verify_config(engines, router))
        for _ in range(args.rounds):
            arms["all names at once"].append(timed(fleet))
            arms["one after another"].append(sum(timed(view) for view in fleet.views()))
    at_once, one_by_one = (statistics.median(v) for v in arms.values())
    ratio = at_once / one_by_one
    print(f"verify: {args.names} served names, one engine each, {args.rounds} rounds (medians)")
    for arm, seconds in arms.items():
        print(f"  {arm:20s} {statistics.median(seconds):7.2f} s")
    verdict = "met" if ratio <= TARGET else "MISSED"
    print(f"  ratio {ratio:.2f} (target at most {TARGET}, ideal {1 / args.names:.2f}): {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
