"""Cross-talk check: under concurrency, does every request get its own answer?

Each of K prompts asks the model to echo a marker word no model writes unprompted. Each prompt
is first answered alone (the baseline), then C requests cycling through the prompts are sent at
once. An answer carrying another prompt's marker is cross-talk (the field failure: HTTP 200,
someone else's answer). An answer that merely differs from its baseline is a failure only in
float32, where greedy decoding is reproducible; other dtypes drift with batch shape.

C comes from a measurement, not a constant: one calibration wave (one request per sequence
slot) is timed first, and the burst fills every slot plus as many further waves as end well
inside the deadline (vllm_fleet.verify.sizing). A fleet too slow for even one wave inside its
deadline fails with the setting to change, instead of with the router's 503s.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

from vllm_fleet.verify.config import ApiKeys, VerifyConfig
from vllm_fleet.verify.lockstep import Party, alone
from vllm_fleet.verify.metrics_sampler import RunningPeaks, RunningSampler
from vllm_fleet.verify.openai_calls import CHAT, Answer, Endpoint, chat_body, complete
from vllm_fleet.verify.results import CheckResult, Status, short
from vllm_fleet.verify.sizing import Limits, Sizing, size, split

# Made-up, pronounceable, none inside another or inside an English word: a model only writes
# one when its own prompt asked for it.
MARKERS = (
    "Zorbleck", "Quindara", "Mavrotel", "Plenkish", "Drovanti", "Kestrume",
    "Vontraxa", "Glimbore", "Sartovik", "Frenzalo", "Tublinor", "Yaskovel",
    "Brimquot", "Nestarul", "Coldrevi", "Hompatex", "Juvrenka", "Lorquist",
    "Wembrago", "Pistravo", "Ruddomek", "Xantiplo", "Obrelund", "Trevaski",
)  # fmt: skip
# The marker leads: prompts differ from their first character, so a cache-aware router spreads
# them over engines instead of piling them on the one holding a shared "Repeat ..." prefix.
# SmolLM2-135M-Instruct echoes all 24 markers with this wording.
PROMPT_TEMPLATE = (
    '"{marker}": repeat this word exactly, then write one short sentence about {marker}.'
)
MAX_EXAMPLES = 5
# The phases of a load that other served names' loads go through with it (lockstep).
LOAD_PHASES = ("calibration", "burst")


@dataclass(frozen=True)
class Probe:
    index: int
    marker: str
    prompt: str


def build_probes(count: int, seed: int) -> list[Probe]:
    markers = random.Random(seed).sample(MARKERS, count)
    return [Probe(i, m, PROMPT_TEMPLATE.format(marker=m)) for i, m in enumerate(markers)]


def markers_in(text: str, markers: list[str]) -> set[str]:
    lowered = text.lower()
    return {m for m in markers if m.lower() in lowered}


def first_divergence(a: str, b: str) -> int | None:
    """Index of the first differing character; None when equal."""
    if a == b:
        return None
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


@dataclass
class PromptTally:
    index: int
    marker: str
    baseline_has_marker: bool = False
    requests: int = 0
    contaminated: int = 0
    diverged: int = 0
    errors: int = 0
    retries: int = 0
    foreign_markers: set[str] = field(default_factory=set)
    divergence_positions: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "index": self.index,
            "marker": self.marker,
            "baseline_has_marker": self.baseline_has_marker,
            "requests": self.requests,
            "contaminated": self.contaminated,
            "diverged": self.diverged,
            "errors": self.errors,
            "retries": self.retries,
            "foreign_markers": sorted(self.foreign_markers),
            "first_divergence": min(self.divergence_positions, default=None),
        }


@dataclass
class Judgement:
    tallies: list[PromptTally]
    status_codes: Counter[int] = field(default_factory=Counter)
    examples: list[dict[str, object]] = field(default_factory=list)

    def total(self, attr: str) -> int:
        return sum(getattr(t, attr) for t in self.tallies)


def judge(
    probes: list[Probe],
    baselines: dict[tuple[str, int], Answer],
    outcomes: list[tuple[Probe, str, Answer]],
) -> Judgement:
    """Compare each concurrent answer (probe, endpoint name, answer) with its baseline."""
    markers = [p.marker for p in probes]
    result = Judgement([PromptTally(p.index, p.marker) for p in probes])
    for tally in result.tallies:
        own = [b for (_, index), b in baselines.items() if index == tally.index]
        tally.baseline_has_marker = bool(own) and all(tally.marker in b.text for b in own)
    for probe, endpoint, answer in outcomes:
        tally = result.tallies[probe.index]
        tally.requests += 1
        tally.retries += answer.retries
        result.status_codes[answer.status] += 1
        base = baselines.get((endpoint, probe.index))
        if not answer.ok or base is None or not base.ok:
            tally.errors += 1
            continue
        foreign = markers_in(answer.text, markers) - markers_in(base.text, markers) - {probe.marker}
        if foreign:
            tally.contaminated += 1
            tally.foreign_markers |= foreign
            if len(result.examples) < MAX_EXAMPLES:
                result.examples.append(
                    {"marker": probe.marker, "found": sorted(foreign), "answer": short(answer.text)}
                )
        position = first_divergence(base.text, answer.text)
        if position is not None:
            tally.diverged += 1
            tally.divergence_positions.append(position)
    return result


def _target(cfg: VerifyConfig, keys: ApiKeys) -> tuple[list[Endpoint], list[int]]:
    """Where the load goes, and the sequence slots behind each endpoint (one wave)."""
    if cfg.router is not None:
        return [Endpoint("router", cfg.router.url, keys.client)], [cfg.fleet_max_num_seqs]
    endpoints = [Endpoint(e.label, e.url, keys.engine) for e in cfg.engines]
    return endpoints, [e.max_num_seqs for e in cfg.engines]


def _plan(
    endpoints: list[Endpoint], counts: list[int], probes: list[Probe]
) -> list[tuple[Probe, Endpoint]]:
    """``counts[i]`` requests to endpoint i, each endpoint cycling through every prompt."""
    return [
        (probes[j % len(probes)], endpoint)
        for endpoint, count in zip(endpoints, counts, strict=True)
        for j in range(count)
    ]


async def _baselines(
    client: httpx.AsyncClient, cfg: VerifyConfig, endpoints: list[Endpoint], probes: list[Probe]
) -> dict[tuple[str, int], Answer]:
    """Each prompt alone on each endpoint: endpoints in parallel, prompts one at a time."""

    async def one_endpoint(endpoint: Endpoint) -> list[Answer]:
        return [await _ask(client, cfg, endpoint, probe) for probe in probes]

    answers = await asyncio.gather(*(one_endpoint(e) for e in endpoints))
    return {
        (endpoint.name, probe.index): answer
        for endpoint, per_probe in zip(endpoints, answers, strict=True)
        for probe, answer in zip(probes, per_probe, strict=True)
    }


async def _ask(
    client: httpx.AsyncClient, cfg: VerifyConfig, endpoint: Endpoint, probe: Probe
) -> Answer:
    body = chat_body(cfg.served_name, probe.prompt, cfg.crosstalk.max_tokens, cfg.crosstalk.seed)
    return await complete(client, endpoint, CHAT, body, cfg.retry)


async def _send(
    client: httpx.AsyncClient, cfg: VerifyConfig, plan: list[tuple[Probe, Endpoint]]
) -> list[Answer]:
    return list(await asyncio.gather(*(_ask(client, cfg, e, p) for p, e in plan)))


@dataclass(frozen=True)
class Calibration:
    """One wave: exactly as many requests at once as there are sequence slots."""

    answers: list[Answer]

    @property
    def wave_seconds(self) -> float:
        # A request cut at a deadline counts with the time it took: the wave took at least that.
        return max((a.elapsed_s for a in self.answers), default=0.0)

    @property
    def failed(self) -> list[Answer]:
        return [a for a in self.answers if not a.ok]

    def as_dict(self) -> dict[str, object]:
        codes = Counter(a.status for a in self.answers)
        return {
            "requests": len(self.answers),
            "wave_seconds": round(self.wave_seconds, 3),
            "status_codes": {str(k): v for k, v in sorted(codes.items())},
            "errors": sorted({a.error or "" for a in self.failed})[:MAX_EXAMPLES],
        }


async def run_crosstalk(
    cfg: VerifyConfig, keys: ApiKeys, party: Party | None = None
) -> CheckResult:
    """``party``: this load's place in a lockstep with the other served names' loads (their
    calibration waves go together, then their bursts); alone when None."""
    if party is None:
        async with alone(LOAD_PHASES) as solo:
            return await _run_crosstalk(cfg, keys, solo)
    return await _run_crosstalk(cfg, keys, party)


async def _run_crosstalk(cfg: VerifyConfig, keys: ApiKeys, party: Party) -> CheckResult:
    start = time.perf_counter()
    settings = cfg.crosstalk
    probes = build_probes(settings.prompts, settings.seed)
    endpoints, slots = _target(cfg, keys)
    # One connection per request, whatever C the measurement picks: a pool limit would
    # serialise the load (and the wave's time would measure the pool, not the fleet).
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(cfg.timeout_seconds)
    verify = cfg.tls_verify()
    async with (
        httpx.AsyncClient(limits=limits, timeout=timeout, verify=verify) as client,
        httpx.AsyncClient(timeout=timeout, verify=verify) as sampler_client,
    ):
        baselines = await _baselines(client, cfg, endpoints, probes)
        baseline_s = time.perf_counter() - start
        await party.reach("calibration")
        phases = {"calibration": party.clock()}
        calibration = Calibration(await _send(client, cfg, _plan(endpoints, slots, probes)))
        sizing = size(
            slots,
            calibration.wave_seconds,
            Limits.of(cfg),
            settings.concurrency,
            max_tokens=settings.max_tokens,
            wanted_waves=settings.waves,
        )
        base = {
            "served_name": cfg.served_name,
            "concurrency": sizing.concurrency,
            "sizing": sizing.as_dict(),
            "calibration": calibration.as_dict(),
            "prompts": len(probes),
            "endpoints": [e.name for e in endpoints],
            "max_tokens": settings.max_tokens,
            "seed": settings.seed,
            "all_float32": cfg.all_float32,
            "baseline_duration_s": round(baseline_s, 3),
            # When each load phase began and the burst ended, on the clock the names verified
            # at once share (seconds from the verification's start).
            "phases_s": phases,
        }
        if sizing.problem is not None or calibration.failed:
            return _not_run(sizing, calibration, baselines, base, start)
        plan = _plan(endpoints, split(sizing.concurrency, slots), probes)
        engines = {e.label: e.url for e in cfg.engines}
        await party.reach("burst")
        phases["burst"] = party.clock()
        load_start = time.perf_counter()
        async with RunningSampler(sampler_client, engines, settings.sample_interval_seconds) as s:
            answers = await _send(client, cfg, plan)
        base["concurrent_duration_s"] = round(time.perf_counter() - load_start, 3)
        phases["burst_end"] = party.clock()
    outcomes = [(p, e.name, a) for (p, e), a in zip(plan, answers, strict=True)]
    judgement = judge(probes, baselines, outcomes)
    return _judged(
        cfg,
        sizing,
        baselines=baselines,
        judgement=judgement,
        peaks=s.peaks,
        details=base,
        start=start,
    )


def _not_run(
    sizing: Sizing,
    calibration: Calibration,
    baselines: dict[tuple[str, int], Answer],
    details: dict[str, object],
    start: float,
) -> CheckResult:
    """The burst would not fit the deadline, or one wave already failed: say why, send none."""
    failures = [f"{len(failed)} baseline requests failed"] if (failed := _failed(baselines)) else []
    if sizing.problem is not None:
        failures.append(sizing.problem)
    if calibration.failed:
        codes = calibration.as_dict()["status_codes"]
        failures.append(
            f"{len(calibration.failed)} of {len(calibration.answers)} requests of the "
            f"calibration wave failed (status codes {codes}): {calibration.failed[0].error}"
        )
    details["concurrency"] = 0  # no burst was sent (sizing shows what was asked)
    details["reasons"] = [f"FAIL: {m}" for m in failures]
    details["baseline_errors"] = {f"{n}#{i}": baselines[(n, i)].error for n, i in failed}
    summary = f"not run: {sizing.problem or failures[-1]}"
    return CheckResult("crosstalk", "fail", summary, details, time.perf_counter() - start)


def _failed(baselines: dict[tuple[str, int], Answer]) -> list[tuple[str, int]]:
    return [k for k, a in baselines.items() if not a.ok]


def _judged(
    cfg: VerifyConfig,
    sizing: Sizing,
    *,
    baselines: dict[tuple[str, int], Answer],
    judgement: Judgement,
    peaks: RunningPeaks,
    details: dict[str, object],
    start: float,
) -> CheckResult:
    concurrency = sizing.concurrency
    threshold = min(concurrency, cfg.fleet_max_num_seqs) * cfg.crosstalk.min_overlap_fraction
    status, reasons = _verdict(cfg, baselines, judgement, peaks.fleet_sum, threshold)
    totals = {
        "requests": sum(judgement.status_codes.values()),
        "contaminated": judgement.total("contaminated"),
        "diverged": judgement.total("diverged"),
        "errors": judgement.total("errors"),
        "retries": judgement.total("retries"),
        "baseline_retries": sum(a.retries for a in baselines.values()),
        "status_codes": {str(k): v for k, v in sorted(judgement.status_codes.items())},
    }
    details |= {
        "peak_running": peaks.as_dict(),
        "overlap_threshold": threshold,
        "totals": totals,
        "reasons": reasons,
        "per_prompt": [t.as_dict() for t in judgement.tallies],
        "baseline_errors": {f"{n}#{i}": baselines[(n, i)].error for n, i in _failed(baselines)},
        "contamination_examples": judgement.examples,
        "baselines": {f"{n}#{i}": short(a.text, 120) for (n, i), a in baselines.items()},
    }
    summary = (
        f"C={concurrency} ({sizing.waves} x {sizing.slots} slots, wave {sizing.wave_seconds:.1f} s, "
        f"{sizing.deadline} s): {totals['contaminated']} contaminated, {totals['diverged']} "
        f"diverged, {totals['errors']} errors, {totals['retries']} retries; peak running "
        f"{peaks.fleet_sum:g} (need >= {threshold:g})"
    )
    return CheckResult("crosstalk", status, summary, details, time.perf_counter() - start)


def _verdict(
    cfg: VerifyConfig,
    baselines: dict[tuple[str, int], Answer],
    judgement: Judgement,
    peak_sum: float,
    threshold: float,
) -> tuple[Status, list[str]]:
    failures: list[str] = []
    warnings: list[str] = []
    if failed := _failed(baselines):
        failures.append(f"{len(failed)} baseline requests failed")
    if contaminated := judgement.total("contaminated"):
        failures.append(f"{contaminated} answers carry another prompt's marker")
    if errors := judgement.total("errors"):
        failures.append(f"{errors} concurrent requests failed or had no baseline")
    if diverged := judgement.total("diverged"):
        message = f"{diverged} answers differ from their baseline"
        (failures if cfg.all_float32 else warnings).append(message)
    if peak_sum < threshold:
        failures.append(f"peak running {peak_sum:g} < {threshold:g}: the load did not overlap")
    if silent := [t.marker for t in judgement.tallies if not t.baseline_has_marker]:
        warnings.append(f"baselines without their marker (weaker probe): {silent}")
    reasons = [f"FAIL: {m}" for m in failures] + [f"WARN: {m}" for m in warnings]
    return ("fail" if failures else "warn" if warnings else "pass"), reasons
