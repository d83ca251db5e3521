"""OpenAI-compatible requests (plain and SSE streaming), with bounded Retry-After retries."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
from httpx_sse import EventSource, aconnect_sse

from vllm_fleet.verify.config import RetrySettings
from vllm_fleet.verify.results import short

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
# A router sheds load with these; an engine never sends Retry-After, so retrying is harmless.
RETRYABLE_STATUSES = frozenset({429, 503})


@dataclass(frozen=True)
class Endpoint:
    """Where requests go (one engine, or the router) and the key it wants."""

    name: str
    url: str
    api_key: str

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}


@dataclass
class Answer:
    status: int  # of the last attempt; 0 when no HTTP answer came
    text: str = ""
    usage: dict[str, int] | None = None
    retries: int = 0
    error: str | None = None
    elapsed_s: float = 0.0
    ttft_s: float | None = None  # streaming: time to the first non-empty content
    usage_chunk: bool = False  # streaming: a final chunk carried usage and no choices

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None


def chat_body(
    model: str, prompt: str, max_tokens: int, seed: int, stream: bool = False
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": seed,
    }
    return _with_stream(body, stream)


def completion_body(
    model: str, prompt: str, max_tokens: int, seed: int, stream: bool = False
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": seed,
    }
    return _with_stream(body, stream)


def _with_stream(body: dict[str, Any], stream: bool) -> dict[str, Any]:
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait: Retry-After is delta-seconds or an HTTP date."""
    if value is None or not value.strip():
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _retry_delay(response: httpx.Response, retry: RetrySettings) -> float | None:
    if response.status_code not in RETRYABLE_STATUSES:
        return None
    delay = parse_retry_after(response.headers.get("retry-after"))
    return None if delay is None else min(delay, retry.max_delay_seconds)


def _message_text(path: str, choice: dict[str, Any], streaming: bool) -> str:
    if path == COMPLETIONS:
        return choice.get("text") or ""
    part = choice.get("delta" if streaming else "message") or {}
    return part.get("content") or ""


async def complete(
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    path: str,
    body: dict[str, Any],
    retry: RetrySettings,
) -> Answer:
    start = time.perf_counter()
    retries = 0
    try:
        while True:
            response = await client.post(endpoint.url + path, json=body, headers=endpoint.auth)
            delay = _retry_delay(response, retry)
            if delay is None or retries >= retry.max_retries:
                break
            retries += 1
            await asyncio.sleep(delay)
        elapsed = time.perf_counter() - start
        if response.status_code != 200:
            error = f"HTTP {response.status_code}: {short(response.text)}"
            return Answer(response.status_code, retries=retries, error=error, elapsed_s=elapsed)
        data = response.json()
    except (httpx.HTTPError, json.JSONDecodeError) as err:
        elapsed = time.perf_counter() - start
        return Answer(0, retries=retries, error=f"{type(err).__name__}: {err}", elapsed_s=elapsed)
    choices = data.get("choices") or [{}]
    return Answer(
        200,
        text=_message_text(path, choices[0], streaming=False),
        usage=data.get("usage"),
        retries=retries,
        elapsed_s=elapsed,
    )


async def stream(
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    path: str,
    body: dict[str, Any],
    retry: RetrySettings,
) -> Answer:
    start = time.perf_counter()
    retries = 0
    try:
        while True:
            async with aconnect_sse(
                client, "POST", endpoint.url + path, json=body, headers=endpoint.auth
            ) as events:
                response = events.response
                if response.status_code == 200:
                    answer = await _read_sse(events, path, start)
                    answer.retries = retries
                    return answer
                await response.aread()
            delay = _retry_delay(response, retry)
            if delay is None or retries >= retry.max_retries:
                error = f"HTTP {response.status_code}: {short(response.text)}"
                elapsed = time.perf_counter() - start
                return Answer(response.status_code, retries=retries, error=error, elapsed_s=elapsed)
            retries += 1
            await asyncio.sleep(delay)
    except (httpx.HTTPError, json.JSONDecodeError) as err:
        elapsed = time.perf_counter() - start
        return Answer(0, retries=retries, error=f"{type(err).__name__}: {err}", elapsed_s=elapsed)


async def _read_sse(events: EventSource, path: str, start: float) -> Answer:
    """The streamed answer, parsed by httpx-sse (an error event or a body that is not an
    event stream raises httpx.HTTPError or ValueError, which the caller reports)."""
    answer = Answer(200)
    parts: list[str] = []
    first_chunk_s: float | None = None
    async for event in events.aiter_sse():
        if event.data == "[DONE]":
            break
        chunk = json.loads(event.data)
        if "error" in chunk:
            answer.error = f"stream error: {short(json.dumps(chunk['error']))}"
            break
        choices = chunk.get("choices") or []
        if chunk.get("usage"):
            answer.usage = chunk["usage"]
            answer.usage_chunk = answer.usage_chunk or not choices
        for choice in choices:
            piece = _message_text(path, choice, streaming=True)
            now = time.perf_counter() - start
            first_chunk_s = now if first_chunk_s is None else first_chunk_s
            if piece and answer.ttft_s is None:
                answer.ttft_s = now
            parts.append(piece)
    # A single token may decode to nothing visible; the first chunk is then the best TTFT.
    answer.ttft_s = answer.ttft_s if answer.ttft_s is not None else first_chunk_s
    answer.text = "".join(parts)
    answer.elapsed_s = time.perf_counter() - start
    return answer


def usage_problems(answer: Answer, max_tokens: int) -> list[str]:
    """Why an answer's usage is inconsistent; empty when it is fine."""
    usage = answer.usage
    if not usage:
        return ["no usage"]
    prompt = usage.get("prompt_tokens", 0)
    completion = usage.get("completion_tokens", 0)
    total = usage.get("total_tokens", 0)
    problems = []
    if not 0 < completion <= max_tokens:
        problems.append(f"completion_tokens={completion} not in 1..{max_tokens}")
    if total != prompt + completion:
        problems.append(f"total_tokens={total} != {prompt}+{completion}")
    return problems
