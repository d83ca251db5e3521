"""Smoke checks against one OpenAI-compatible endpoint (an engine, later the router)."""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx

SMOKE_PROMPT = "What is the capital of France? Answer in one word."


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class SmokeResult:
    base_url: str
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def add(self, name: str, ok: bool, detail: str) -> None:
        self.checks.append(Check(name, ok, detail))

    def summary(self) -> str:
        lines = [f"smoke {self.base_url}: {'PASS' if self.ok else 'FAIL'}"]
        lines += [f"  [{'ok' if c.ok else 'FAIL'}] {c.name}: {c.detail}" for c in self.checks]
        return "\n".join(lines)


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def run_smoke(base_url: str, api_key: str, served_name: str, timeout: float = 60.0) -> SmokeResult:
    result = SmokeResult(base_url)
    auth = {"Authorization": f"Bearer {api_key}"}
    with httpx.Client(base_url=base_url, timeout=timeout) as client:
        try:
            _check_models(client, auth, served_name, result)
            _check_chat(client, auth, served_name, result)
            _check_auth_enforced(client, result)
        except httpx.HTTPError as err:
            result.add("connection", False, f"{type(err).__name__}: {err}")
    return result


def _check_models(
    client: httpx.Client, auth: dict[str, str], served_name: str, result: SmokeResult
) -> None:
    response = client.get("/v1/models", headers=auth)
    if response.status_code != 200:
        result.add("models", False, f"HTTP {response.status_code}: {_short(response.text)}")
        return
    names = [m.get("id") for m in response.json().get("data", [])]
    result.add("models", served_name in names, f"served names {names}, expected {served_name!r}")


def _check_chat(
    client: httpx.Client, auth: dict[str, str], served_name: str, result: SmokeResult
) -> None:
    body = {
        "model": served_name,
        "messages": [{"role": "user", "content": SMOKE_PROMPT}],
        "max_tokens": 16,
        "temperature": 0,
        "seed": 0,
    }
    response = client.post("/v1/chat/completions", headers=auth, json=body)
    if response.status_code != 200:
        result.add("chat", False, f"HTTP {response.status_code}: {_short(response.text)}")
        return
    data = response.json()
    choices = data.get("choices") or [{}]
    content = (choices[0].get("message") or {}).get("content") or ""
    usage = data.get("usage") or {}
    completion_tokens = usage.get("completion_tokens", 0)
    ok = bool(content.strip()) and 0 < completion_tokens <= body["max_tokens"]
    result.add("chat", ok, f"{completion_tokens} tokens: {_short(content.strip(), 80)!r}")


def _check_auth_enforced(client: httpx.Client, result: SmokeResult) -> None:
    response = client.get("/v1/models")
    result.add(
        "auth",
        response.status_code == 401,
        f"without a key: HTTP {response.status_code} (expected 401)",
    )
