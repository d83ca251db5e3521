"""``python -m vllm_fleet.lab prepare``: build whatever the lab is missing, timing each step."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from vllm_fleet.lab import promtool, steps
from vllm_fleet.lab.paths import LabPaths

LAB_STACK = "cpu-vllm-0.32.0"
# Stacks the lab can also serve from its mirror (the change matrix moves the lab 0.31.0 ->
# 0.32.0 and back). Built only on demand (`prepare --only wheelhouse-extra`), so that the
# default prepare of a new checkout stays fast.
EXTRA_STACKS = ["cpu-vllm-0.31.0"]
ON_DEMAND = {"wheelhouse-extra"}
PINNED_MODELS = Path("inventories/lab/group_vars/all/models.yml")


def check_pin(paths: LabPaths, revision: str) -> None:
    pinned = yaml.safe_load((paths.repo / PINNED_MODELS).read_text())["fleet_models"]
    want = pinned[steps.LAB_MODEL]["revision"]
    if want != revision:
        raise SystemExit(
            f"lab model {steps.LAB_MODEL}: the mirror holds revision {revision}, but "
            f"{PINNED_MODELS} pins {want}. The conversion was not reproducible here; "
            "check the versions in vllm_fleet/lab/steps.py CONVERT_PACKAGES."
        )


def prepare(
    paths: LabPaths, only: list[str], extra_stacks: list[str] | None = None
) -> dict[str, float]:
    """Run the steps (only those named, if any); ON_DEMAND steps run only when named."""
    extra = EXTRA_STACKS if extra_stacks is None else extra_stacks
    plan: dict[str, Callable[[], object]] = {
        "host-packages": lambda: steps.host_packages(paths),
        "collection": lambda: steps.collection(paths),
        "image": lambda: steps.image(paths),
        "wheelhouse": lambda: steps.wheelhouse(paths, LAB_STACK),
        "wheelhouse-extra": lambda: [steps.wheelhouse(paths, stack) for stack in extra],
        "router-wheelhouses": lambda: steps.router_wheelhouses(paths),
        "router-vocab": lambda: steps.router_vocab(paths),
        "agent": lambda: steps.agent(paths),
        "model": lambda: check_pin(paths, steps.model(paths)),
        "secrets": lambda: steps.lab_secrets(paths),
        "promtool": lambda: promtool.prepare(paths),
    }
    timings = {}
    for name, step in plan.items():
        if (only and name not in only) or (not only and name in ON_DEMAND):
            continue
        started = time.monotonic()
        step()
        timings[name] = round(time.monotonic() - started, 1)
        steps.log(f"{name}: {timings[name]} s")
    return timings


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_fleet.lab")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="build what the lab needs (cached)")
    p.add_argument("--only", nargs="*", default=[])
    p.add_argument(
        "--extra-stack",
        action="append",
        help=f"a stack for wheelhouse-extra (repeatable; default {', '.join(EXTRA_STACKS)})",
    )
    p.add_argument("--timings", help="write step timings (JSON) here")
    args = parser.parse_args(argv)
    paths = LabPaths.default()
    timings = prepare(paths, args.only, args.extra_stack)
    if args.timings:
        Path(args.timings).write_text(json.dumps(timings, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
