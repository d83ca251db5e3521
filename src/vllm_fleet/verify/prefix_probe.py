"""Prefix-cache probe: a long prompt sent twice must hit the cache the second time.

"Enabled" is not "working": the engine's own counters (vllm:prefix_cache_queries/hits, in
tokens) are read around each request. Through a cache-aware router, both sends must land on
the same engine, or the cache cannot help.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from dataclasses import dataclass

import httpx

from vllm_fleet.verify import engine_metrics
from vllm_fleet.verify.config import ApiKeys, EngineSpec, VerifyConfig
from vllm_fleet.verify.openai_calls import COMPLETIONS, Answer, Endpoint, completion_body, stream
from vllm_fleet.verify.results import CheckResult

FILLER_WORDS = (
    "river", "stone", "lantern", "harbor", "meadow", "copper", "window", "garden", "signal",
    "market", "winter", "canvas", "bridge", "orchard", "thunder", "pocket", "silver", "valley",
    "engine", "candle", "forest", "ladder", "mirror", "planet", "saddle", "tunnel", "whistle",
)  # fmt: skip
# The filler is common words, one token each: SmolLM2's tokenizer measured ~5.8 characters
# per token of it (600 approx tokens gave 411 at 4 characters per token).
CHARS_PER_TOKEN = 6
# Counters are exported slightly after the response ends: wait this long at least, and at
# least as long as the request itself took (a host slow enough to take many seconds for one
# request also lags that much in updating its stats).
COUNTER_WAIT_S = 5.0
POLL_S = 0.1


def build_prefix(tokens_approx: int, nonce: str) -> str:
    """Deterministic prose of about ``tokens_approx`` tokens, then a short question.

    The nonce leads the text so no earlier run (or other probe) has cached any of its blocks.
    """
    rng = random.Random(0)
    sentences = [f"Record {nonce}."]
    length = len(sentences[0])
    while length < tokens_approx * CHARS_PER_TOKEN:
        words = rng.choices(FILLER_WORDS, k=10)
        sentence = " ".join(words).capitalize() + "."
        sentences.append(sentence)
        length += len(sentence) + 1
    return " ".join(sentences) + "\nQuestion: which word comes first in the record? Answer:"


@dataclass(frozen=True)
class CacheCounters:
    queries: float
    hits: float


async def read_counters(client: httpx.AsyncClient, url: str) -> CacheCounters | None:
    try:
        families = await engine_metrics.fetch_families(client, url)
    except (httpx.HTTPError, ValueError):
        return None
    queries = engine_metrics.value(families, engine_metrics.PREFIX_QUERIES)
    hits = engine_metrics.value(families, engine_metrics.PREFIX_HITS)
    if queries is None or hits is None:
        return None
    return CacheCounters(queries, hits)


async def _read_all(
    client: httpx.AsyncClient, engines: dict[str, str]
) -> dict[str, CacheCounters | None]:
    values = await asyncio.gather(*(read_counters(client, url) for url in engines.values()))
    return dict(zip(engines, values, strict=True))


async def _after(
    client: httpx.AsyncClient,
    engines: dict[str, str],
    before: dict[str, CacheCounters | None],
    min_tokens: float = 1.0,
    wait_s: float = COUNTER_WAIT_S,
) -> dict[str, CacheCounters | None]:
    """Counters once some engine's queries grew (or the wait ran out)."""
    deadline = time.perf_counter() + wait_s
    while True:
        now = await _read_all(client, engines)
        if _grew(before, now, min_tokens) or time.perf_counter() > deadline:
            return now
        await asyncio.sleep(POLL_S)


def _grew(
    before: dict[str, CacheCounters | None],
    after: dict[str, CacheCounters | None],
    min_tokens: float = 1.0,
) -> list[str]:
    """Engines whose queried tokens grew by at least ``min_tokens``.

    Other traffic (a watchdog's few-token probes) also moves the counters; the probe's own
    request moves them by hundreds of tokens.
    """
    return [
        label
        for label, b in before.items()
        if b is not None
        and (a := after.get(label)) is not None
        and a.queries - b.queries >= min_tokens
    ]


def _delta(
    before: dict[str, CacheCounters | None], after: dict[str, CacheCounters | None], label: str
) -> dict[str, float] | None:
    b, a = before.get(label), after.get(label)
    if a is None or b is None:
        return None
    return {"queries": a.queries - b.queries, "hits": a.hits - b.hits}


def _send_summary(answer: Answer) -> dict[str, object]:
    return {
        "ok": answer.ok,
        "error": answer.error,
        "ttft_s": None if answer.ttft_s is None else round(answer.ttft_s, 4),
        "prompt_tokens": (answer.usage or {}).get("prompt_tokens"),
    }


async def _send_twice(
    client: httpx.AsyncClient,
    cfg: VerifyConfig,
    endpoint: Endpoint,
    engines: dict[str, str],
) -> tuple[list[Answer], list[dict[str, CacheCounters | None]]]:
    """Counters before, after the first and after the second send of one fresh prefix."""
    prompt = build_prefix(cfg.prefix_probe.prefix_tokens_approx, uuid.uuid4().hex[:12])
    body = completion_body(cfg.served_name, prompt, max_tokens=1, seed=0, stream=True)
    snapshots = [await _read_all(client, engines)]
    answers = []
    for _ in range(2):
        answers.append(await stream(client, endpoint, COMPLETIONS, body, cfg.retry))
        if not answers[-1].ok:
            break  # no counters will move; the caller reports the failed send
        wait_s = max(COUNTER_WAIT_S, answers[-1].elapsed_s)
        min_tokens = cfg.prefix_probe.prefix_tokens_approx / 2
        snapshots.append(await _after(client, engines, snapshots[-1], min_tokens, wait_s))
    return answers, snapshots


async def probe_engine(
    client: httpx.AsyncClient, engine: EngineSpec, keys: ApiKeys, cfg: VerifyConfig
) -> CheckResult:
    start = time.perf_counter()
    label = engine.label
    endpoint = Endpoint(label, engine.url, keys.engine)
    answers, snaps = await _send_twice(client, cfg, endpoint, {label: engine.url})
    details: dict[str, object] = {"url": engine.url, "sends": [_send_summary(a) for a in answers]}
    if len(snaps) < 3:
        return _failed_send(f"prefix_cache {label}", answers, details, start)
    first, second = _delta(snaps[0], snaps[1], label), _delta(snaps[1], snaps[2], label)
    details |= {"first": first, "second": second}
    if first is None or second is None:
        status, summary = "fail", "no prefix cache counters in /metrics"
    else:
        status = "pass" if second["hits"] > 0 else "fail"
        summary = (
            f"second send hit {second['hits']:g}/{second['queries']:g} tokens"
            f" (first {first['hits']:g}); TTFT {_ttft(answers[0])} -> {_ttft(answers[1])}"
        )
    return CheckResult(f"prefix_cache {label}", status, summary, details, _since(start))


async def probe_router(
    client: httpx.AsyncClient, router_url: str, keys: ApiKeys, cfg: VerifyConfig
) -> CheckResult:
    """A fresh prefix sent twice through a cache-aware router lands on one engine and hits."""
    start = time.perf_counter()
    engines = {e.label: e.url for e in cfg.engines}
    endpoint = Endpoint("router", router_url, keys.client)
    answers, snaps = await _send_twice(client, cfg, endpoint, engines)
    details: dict[str, object] = {"sends": [_send_summary(a) for a in answers]}
    if len(snaps) < 3:
        return _failed_send("prefix_cache router", answers, details, start)
    # The probe's prompt is hundreds of tokens; a landing moves an engine's counter by most.
    min_tokens = cfg.prefix_probe.prefix_tokens_approx / 2
    landed = [_grew(snaps[0], snaps[1], min_tokens), _grew(snaps[1], snaps[2], min_tokens)]
    details["landed_on"] = landed
    same = len(landed[0]) == 1 and landed[0] == landed[1]
    hits = _delta(snaps[1], snaps[2], landed[1][0]) if len(landed[1]) == 1 else None
    details["second"] = hits
    ok = same and hits is not None and hits["hits"] > 0
    summary = (
        f"sends landed on {landed[0]} then {landed[1]}; second hit "
        f"{hits['hits'] if hits else 0:g} tokens; TTFT {_ttft(answers[0])} -> {_ttft(answers[1])}"
    )
    return CheckResult(
        "prefix_cache router", "pass" if ok else "fail", summary, details, _since(start)
    )


def _failed_send(
    name: str, answers: list[Answer], details: dict[str, object], start: float
) -> CheckResult:
    errors = "; ".join(a.error or "" for a in answers if not a.ok)
    return CheckResult(name, "fail", f"probe request failed: {errors}", details, _since(start))


def _ttft(answer: Answer) -> str:
    return "n/a" if answer.ttft_s is None else f"{answer.ttft_s * 1000:.0f} ms"


def _since(start: float) -> float:
    return time.perf_counter() - start
