"""A real inference probe: one short completion, as a client would ask for it."""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    seconds: float
    detail: str  # why it failed, or what it got; never a key

    @classmethod
    def failed(cls, detail: str, seconds: float = 0.0) -> ProbeResult:
        return cls(False, seconds, detail)


def _short(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def _judge(response: httpx.Response) -> tuple[bool, str]:
    if response.status_code != 200:
        return False, f"HTTP {response.status_code}: {_short(response.text)}"
    try:
        data = response.json()
        choices = data.get("choices") or []
        tokens = int((data.get("usage") or {}).get("completion_tokens") or 0)
    except (ValueError, AttributeError, TypeError):
        return False, f"not an OpenAI completion: {_short(response.text)}"
    if not choices or tokens < 1:
        return False, f"{len(choices)} choices, {tokens} completion tokens"
    return True, f"{tokens} completion tokens"


def probe_completion(
    client: httpx.Client,
    base_url: str,
    *,
    api_key: str,
    served_name: str,
    prompt: str,
    max_tokens: int,
) -> ProbeResult:
    """POST /v1/completions; ``client`` carries the timeout."""
    body = {"model": served_name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    started = time.monotonic()
    try:
        response = client.post(
            f"{base_url}/v1/completions",
            json=body,
            headers={"Authorization": f"Bearer {api_key}"},
        )
    except httpx.HTTPError as err:
        detail = _short(f"{type(err).__name__}: {err}")
        return ProbeResult(False, time.monotonic() - started, detail)
    ok, detail = _judge(response)
    return ProbeResult(ok, time.monotonic() - started, detail)


# Counters that grow whenever the engine makes progress on any request.
PROGRESS_SAMPLES = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total")


def engine_progress(client: httpx.Client, base_url: str, timeout: float = 5.0) -> float | None:
    """Tokens the engine has processed so far (from /metrics); None if it cannot say."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        response = client.get(f"{base_url}/metrics", timeout=timeout)
        if response.status_code != 200:
            return None
        total = 0.0
        for family in text_string_to_metric_families(response.text):
            total += sum(s.value for s in family.samples if s.name in PROGRESS_SAMPLES)
    except (httpx.HTTPError, ValueError):
        return None
    return total


def judge_timeout(probe: ProbeResult, before: float | None, after: float | None) -> ProbeResult:
    """A probe that timed out while the engine kept producing tokens met a busy engine.

    Under a burst (seed 001: 120 concurrent requests) a 1-token probe can wait in the
    engine's queue past its timeout. Restarting a saturated engine would throw away every
    request it holds and push its load onto the others; a hung engine (its API server
    stopped, or its engine core stuck) makes no progress, and that is what fails.
    """
    if probe.ok or "Timeout" not in probe.detail or before is None or after is None:
        return probe
    if after > before:
        busy = f"busy: probe timed out, but {after - before:.0f} tokens were processed meanwhile"
        return ProbeResult(True, probe.seconds, busy)
    return probe
