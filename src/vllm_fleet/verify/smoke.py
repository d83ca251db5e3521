"""Smoke check of one endpoint (an engine or the router): the API answers, usage adds up,
auth is enforced; for an engine also /health, the configured /metrics families and the
KV capacity it reports (for the fleet table). The one smoke: ``vllm-fleet verify`` and the
host's ``vllm-fleet smoke`` both run it."""

from __future__ import annotations

import ssl
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from vllm_fleet.verify import engine_metrics
from vllm_fleet.verify.config import EngineSpec, RetrySettings, VerifyConfig
from vllm_fleet.verify.openai_calls import (
    CHAT,
    COMPLETIONS,
    Answer,
    Endpoint,
    chat_body,
    complete,
    completion_body,
    stream,
    usage_problems,
)
from vllm_fleet.verify.results import CheckResult, Item, short, status_of

SMOKE_PROMPT = "What is the capital of France? Answer in one word."
SMOKE_MAX_TOKENS = 16
WRONG_KEY = "verify-deliberately-wrong-key"


@dataclass
class EngineFacts:
    health: str = "unknown"
    kv_capacity: engine_metrics.KvCapacity | None = None
    cache_config: dict[str, str] = field(default_factory=dict)


async def smoke_engine(
    client: httpx.AsyncClient, engine: EngineSpec, api_key: str, cfg: VerifyConfig
) -> tuple[CheckResult, EngineFacts]:
    start = time.perf_counter()
    endpoint = Endpoint(engine.label, engine.url, api_key)
    facts = EngineFacts()
    items = [await _health(client, engine.url, facts)]
    items += await _api_items(client, endpoint, engine.served_name, cfg.retry)
    items.append(await _metrics(client, engine.url, cfg.metrics_families, facts))
    details = {
        "url": engine.url,
        "items": [i.as_dict() for i in items],
        "kv_capacity": str(facts.kv_capacity) if facts.kv_capacity else None,
    }
    result = _result(f"smoke {engine.label}", items, details, start)
    return result, facts


async def smoke_router(
    client: httpx.AsyncClient, url: str, client_key: str, cfg: VerifyConfig
) -> CheckResult:
    start = time.perf_counter()
    items = [await _health(client, url, EngineFacts())]
    items += await _api_items(
        client, Endpoint("router", url, client_key), cfg.served_name, cfg.retry
    )
    return _result(
        "smoke router", items, {"url": url, "items": [i.as_dict() for i in items]}, start
    )


async def smoke_endpoint(
    url: str,
    api_key: str,
    served_name: str,
    timeout: float,
    retry: RetrySettings | None = None,
    *,
    verify: ssl.SSLContext | bool = True,
) -> CheckResult:
    """One endpoint alone (the host's ``vllm-fleet smoke`` of its engine group): /health, the
    API items and auth, as verify checks every engine and the router. ``verify``: the fleet CA
    alone for an engine on HTTPS."""
    start = time.perf_counter()
    async with httpx.AsyncClient(timeout=timeout, verify=verify) as client:
        items = [await _health(client, url, EngineFacts())]
        items += await _api_items(
            client, Endpoint(url, url, api_key), served_name, retry or RetrySettings()
        )
    return _result(
        f"smoke {url}", items, {"url": url, "items": [i.as_dict() for i in items]}, start
    )


def report_lines(result: CheckResult) -> list[str]:
    """A check as a status line and one line per item, for a terminal or a play's output."""
    lines = [f"{result.name}: {result.status.upper()} ({result.summary})"]
    for item in result.details.get("items", []):
        mark = "FAIL" if not item["ok"] else ("warn" if item["warning"] else "ok")
        lines.append(f"  [{mark}] {item['name']}: {item['detail']}")
    return lines


def _result(name: str, items: list[Item], details: dict[str, Any], start: float) -> CheckResult:
    failed = [f"{i.name} ({i.detail})" for i in items if not i.ok]
    warned = [i.name for i in items if i.ok and i.warning]
    summary = f"{len(items) - len(failed)}/{len(items)} ok"
    # The failing item's detail goes into the one line a CI log or a play shows.
    summary += f"; failed: {', '.join(failed)}" if failed else ""
    summary += f"; warnings: {', '.join(warned)}" if warned else ""
    return CheckResult(name, status_of(items), summary, details, time.perf_counter() - start)


async def _api_items(
    client: httpx.AsyncClient, endpoint: Endpoint, served_name: str, retry: RetrySettings
) -> list[Item]:
    items = [await _models(client, endpoint, served_name)]
    chat = chat_body(served_name, SMOKE_PROMPT, SMOKE_MAX_TOKENS, seed=0)
    items.append(_answer_item("chat", await complete(client, endpoint, CHAT, chat, retry)))
    prompt = completion_body(served_name, "The capital of France is", SMOKE_MAX_TOKENS, seed=0)
    answer = await complete(client, endpoint, COMPLETIONS, prompt, retry)
    items.append(_answer_item("completion", answer))
    streamed = chat_body(served_name, SMOKE_PROMPT, SMOKE_MAX_TOKENS, seed=0, stream=True)
    items.append(_answer_item("stream", await stream(client, endpoint, CHAT, streamed, retry)))
    items += await _auth(client, endpoint.url, served_name)
    return items


async def _health(client: httpx.AsyncClient, url: str, facts: EngineFacts) -> Item:
    try:
        response = await client.get(f"{url}/health")
    except httpx.HTTPError as err:
        facts.health = f"unreachable ({type(err).__name__})"
        return Item("health", False, facts.health)
    facts.health = "ok" if response.status_code == 200 else f"HTTP {response.status_code}"
    return Item("health", response.status_code == 200, f"/health: HTTP {response.status_code}")


async def _models(client: httpx.AsyncClient, endpoint: Endpoint, served_name: str) -> Item:
    try:
        response = await client.get(f"{endpoint.url}/v1/models", headers=endpoint.auth)
        if response.status_code != 200:
            return Item("models", False, f"HTTP {response.status_code}: {short(response.text)}")
        names = [m.get("id") for m in response.json().get("data", [])]
    except (httpx.HTTPError, ValueError) as err:
        return Item("models", False, f"{type(err).__name__}: {err}")
    return Item("models", served_name in names, f"served names {names}, expected {served_name!r}")


def _answer_item(name: str, answer: Answer) -> Item:
    if not answer.ok:
        return Item(name, False, answer.error or f"HTTP {answer.status}")
    problems = usage_problems(answer, SMOKE_MAX_TOKENS)
    if not answer.text.strip():
        problems.append("empty text")
    if name == "stream" and not answer.usage_chunk:
        problems.append("no final usage chunk")
    tokens = (answer.usage or {}).get("completion_tokens")
    detail = f"{tokens} tokens: {short(answer.text.strip(), 60)!r}"
    return Item(name, not problems, "; ".join([*problems, detail]))


async def _auth(client: httpx.AsyncClient, url: str, served_name: str) -> list[Item]:
    """Without a key and with a wrong one, inference must answer 401.

    vLLM also guards GET /v1/models; sglang-router leaves it open (a warning: it shows
    model names, not answers). Each probe asks for its own connection: sglang-router
    drops the connection after a 401 without saying so, and a pooled connection reused
    after that fails about once in a hundred probes with "Server disconnected".
    """
    body = chat_body(served_name, SMOKE_PROMPT, 1, seed=0)
    items = []
    for name, key_headers in (("auth: no key", {}), ("auth: wrong key", _bearer(WRONG_KEY))):
        headers = {**key_headers, "Connection": "close"}
        try:
            listed = await client.get(f"{url}/v1/models", headers=headers)
            posted = await client.post(f"{url}{CHAT}", headers=headers, json=body)
        except httpx.HTTPError as err:
            items.append(Item(name, False, f"{type(err).__name__}: {err}"))
            continue
        detail = f"POST {CHAT}: {posted.status_code}, GET /v1/models: {listed.status_code}"
        listing_open = listed.is_success
        if listing_open:
            detail += " (model listing open without a valid key)"
        items.append(Item(name, posted.status_code == 401, detail, warning=listing_open))
    return items


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def _metrics(
    client: httpx.AsyncClient, url: str, expected: list[str], facts: EngineFacts
) -> Item:
    try:
        families = await engine_metrics.fetch_families(client, url)
    except (httpx.HTTPError, ValueError) as err:
        return Item("metrics", False, f"/metrics: {type(err).__name__}: {err}")
    facts.kv_capacity = engine_metrics.kv_capacity(families)
    facts.cache_config = engine_metrics.cache_config_labels(families)
    missing = engine_metrics.missing_families(families, expected)
    detail = f"missing {missing}" if missing else f"all {len(expected)} families present"
    return Item("metrics", not missing, detail)
