"""``vllm-fleet verify --config verify.json --out DIR``: run every check, write the report.

Exit status: 0 when every check passed (warnings allowed), 1 when one failed, 2 when the
config or the keys are unusable.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import time
from collections.abc import Awaitable
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from pydantic import ValidationError

from vllm_fleet.tls.trust import TrustError
from vllm_fleet.verify.config import (
    CLIENT_KEY_VAR,
    ENGINE_KEY_VAR,
    ApiKeys,
    EngineSpec,
    MissingKeyError,
    VerifyConfig,
    keys_from_env,
    load_config,
)
from vllm_fleet.verify.crosstalk import LOAD_PHASES, run_crosstalk
from vllm_fleet.verify.lockstep import Lockstep, Party
from vllm_fleet.verify.metrics_file import write_metrics
from vllm_fleet.verify.prefix_probe import probe_engine, probe_router
from vllm_fleet.verify.report import build_report, fleet_rows, summary_lines, write_report
from vllm_fleet.verify.results import CheckResult
from vllm_fleet.verify.smoke import EngineFacts, smoke_engine, smoke_router

# Each served name's checks, in step with the other names' (vllm_fleet.verify.lockstep).
PHASES = (*LOAD_PHASES, "prefix probes")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-fleet verify",
        description="Verify a deployed fleet: smoke, cross-talk under load, prefix caching.",
        epilog=f"Keys come from {ENGINE_KEY_VAR} and {CLIENT_KEY_VAR} (the router's).",
    )
    parser.add_argument("--config", required=True, help="verify.json rendered by Ansible")
    parser.add_argument("--out", required=True, help="directory for report.json and report.md")
    parser.add_argument(
        "--metrics-file",
        help="also write the result as Prometheus metrics here (node exporter textfile, *.prom)",
    )
    return parser


async def _guarded(name: str, check: Awaitable[CheckResult]) -> CheckResult:
    """A check that crashes is a failed check, not a crashed verify (the other reports count)."""
    start = time.perf_counter()
    try:
        return await check
    except Exception as err:
        summary = f"check crashed: {type(err).__name__}: {err}"
        return CheckResult(name, "fail", summary, {}, time.perf_counter() - start)


async def _smoke(
    client: httpx.AsyncClient, engine: EngineSpec, keys: ApiKeys, cfg: VerifyConfig
) -> tuple[CheckResult, EngineFacts]:
    try:
        return await smoke_engine(client, engine, keys.engine, cfg)
    except Exception as err:
        summary = f"check crashed: {type(err).__name__}: {err}"
        return CheckResult(f"smoke {engine.label}", "fail", summary), EngineFacts()


def _named(name: str, served_name: str | None) -> str:
    """A fleet-wide check's name, qualified by the served name when the fleet has several."""
    return f"{name}[{served_name}]" if served_name else name


async def run_checks(
    cfg: VerifyConfig, keys: ApiKeys
) -> tuple[list[CheckResult], dict[str, EngineFacts]]:
    """Each served name is verified on its own engines, every name at once: its engines'
    smoke, the router's smoke for that name (an engine of another name behind it answers
    404), a cross-talk load sized from that name's capacity, and its prefix probes. The
    names' loads go in lockstep (vllm_fleet.verify.lockstep): they calibrate together and
    burst together, and the prefix probes start once every load has ended. The report lists
    each name's checks together, names in order."""
    checks: list[CheckResult] = []
    facts: dict[str, EngineFacts] = {}
    views = cfg.views()
    lockstep = Lockstep(len(views), PHASES)
    timeout = httpx.Timeout(cfg.timeout_seconds)
    async with httpx.AsyncClient(timeout=timeout, verify=cfg.tls_verify()) as client:
        done = await asyncio.gather(
            *(
                _run_view(
                    client, view, keys, view.served_name if len(views) > 1 else None, lockstep
                )
                for view in views
            )
        )
    for view_checks, view_facts in done:
        checks += view_checks
        facts.update(view_facts)
    return checks, facts


async def _run_view(
    client: httpx.AsyncClient,
    cfg: VerifyConfig,
    keys: ApiKeys,
    qualifier: str | None,
    lockstep: Lockstep,
) -> tuple[list[CheckResult], dict[str, EngineFacts]]:
    # A name that stops early (its load could not run, a check crashed) leaves the lockstep,
    # so it never holds the other names back.
    async with lockstep.party() as party:
        checks, facts = await _smoke_and_load(client, cfg, keys, qualifier, party)
        # The prefix probes wait for every name's load to end: a cache-aware router routes by
        # load while the fleet is imbalanced, not by prefix.
        await party.reach("prefix probes")
        return checks + await _prefix_probes(client, cfg, keys, qualifier), facts


async def _smoke_and_load(
    client: httpx.AsyncClient,
    cfg: VerifyConfig,
    keys: ApiKeys,
    qualifier: str | None,
    party: Party,
) -> tuple[list[CheckResult], dict[str, EngineFacts]]:
    smoked = await asyncio.gather(*(_smoke(client, e, keys, cfg) for e in cfg.engines))
    checks = [result for result, _ in smoked]
    facts = {e.label: f for e, (_, f) in zip(cfg.engines, smoked, strict=True)}
    if cfg.router is not None:
        router_smoke = smoke_router(client, cfg.router.url, keys.client, cfg)
        name = _named("smoke router", qualifier)
        checks.append(_renamed(await _guarded(name, router_smoke), name))
        for member in cfg.router.members:
            member_smoke = smoke_router(client, member, keys.client, cfg)
            name = _named(f"smoke router {urlsplit(member).hostname}", qualifier)
            checks.append(_renamed(await _guarded(name, member_smoke), name))
    name = _named("crosstalk", qualifier)
    checks.append(_renamed(await _guarded(name, run_crosstalk(cfg, keys, party)), name))
    return checks, facts


async def _prefix_probes(
    client: httpx.AsyncClient, cfg: VerifyConfig, keys: ApiKeys, qualifier: str | None
) -> list[CheckResult]:
    checks: list[CheckResult] = []
    for engine in cfg.engines:
        if engine.enable_prefix_caching:
            probe = probe_engine(client, engine, keys, cfg)
            checks.append(await _guarded(f"prefix_cache {engine.label}", probe))
    if cfg.router is not None and cfg.router.policy == "cache_aware":
        probe = probe_router(client, cfg.router.url, keys, cfg)
        name = _named("prefix_cache router", qualifier)
        checks.append(_renamed(await _guarded(name, probe), name))
    return checks


def _renamed(result: CheckResult, name: str) -> CheckResult:
    return result if result.name == name else dataclasses.replace(result, name=name)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = load_config(Path(args.config))
        keys = keys_from_env(cfg)
        cfg.tls_verify()  # the fleet CA readable before any request
    except (OSError, ValidationError, MissingKeyError, TrustError) as err:
        print(f"verify: {err}", file=sys.stderr)
        return 2
    started_at = datetime.now(UTC)
    start = time.perf_counter()
    checks, facts = asyncio.run(run_checks(cfg, keys))
    report = build_report(
        cfg, fleet_rows(cfg, facts), checks, started_at, time.perf_counter() - start
    )
    json_path, md_path = write_report(report, Path(args.out))
    if args.metrics_file:
        write_metrics(report, Path(args.metrics_file))
    print("\n".join(summary_lines(report)))
    print(f"report: {json_path}, {md_path}")
    return 0 if report["verdict"] == "pass" else 1
