"""A request in flight on an engine that dies is retried on another engine.

Real sglang-router with the router role's shipped retry and circuit-breaker settings, one
healthy fake engine and one that resets every request's connection (what a killed engine
does to the requests it was serving). Under cache_aware routing a retry goes back to the
engine the prompt's prefix points at, so it only reaches the healthy engine once that
engine's circuit breaker has opened: the retries must outnumber the breaker's threshold.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml

from tests.unit.router_fixtures import (
    CLIENT_KEY,
    CONTROL_KEY,
    ENGINE_KEY,
    running_engine,
    running_router,
    sglang_listing,
    wait_until,
)

DEFAULTS = Path(__file__).parents[2] / "roles/router/defaults/main.yml"
# role setting -> sglang-router's RouterArgs field (roles/router/templates/router.json.j2)
FIELDS = {
    "policy": "policy",
    "cb_failure_threshold": "cb_failure_threshold",
    "cb_success_threshold": "cb_success_threshold",
    "cb_timeout_seconds": "cb_timeout_duration_secs",
    "retry_max_retries": "retry_max_retries",
    "retry_initial_backoff_ms": "retry_initial_backoff_ms",
    "retry_max_backoff_ms": "retry_max_backoff_ms",
    "health_failure_threshold": "health_failure_threshold",
}


def shipped_settings() -> dict[str, object]:
    defaults = yaml.safe_load(DEFAULTS.read_text())["router_setting_defaults"]
    return {field: defaults[name] for name, field in FIELDS.items()}


def complete(router_url: str, prompt: str) -> httpx.Response:
    return httpx.post(
        f"{router_url}/v1/completions",
        headers={"Authorization": f"Bearer {CLIENT_KEY}"},
        json={"model": "fake-model", "prompt": prompt, "max_tokens": 4},
        timeout=30,
    )


def route_with(tmp_path: Path, settings: dict[str, object]) -> tuple[int, int]:
    """Kill the engine a prompt's prefix lives on, send the prompt again: (the client's
    status, the attempts the dying engine took)."""
    prompt = "The capital of France is a city called"
    with (
        running_router("sglang", tmp_path / "router.log", extra=settings) as router,
        running_engine() as first,
        running_engine() as second,
    ):
        control = {"Authorization": f"Bearer {CONTROL_KEY}"}
        for engine in (first, second):
            body = {"url": engine.url, "api_key": ENGINE_KEY, "model_id": "fake-model"}
            httpx.post(f"{router.url}/workers", headers=control, json=body, timeout=5)
        wait_until(
            lambda: sum(bool(w["is_healthy"]) for w in sglang_listing(router.url)) == 2,
            timeout=15,
            what="both engines registered and healthy",
        )
        assert complete(router.url, prompt).status_code == 200
        dying = first if first.completions else second
        dying.mode = "reset"
        before = len(dying.completions)
        status = complete(router.url, prompt).status_code
        return status, len(dying.completions) - before


def test_the_shipped_settings_retry_past_a_dying_engine(tmp_path):
    settings = shipped_settings()
    assert settings["policy"] == "cache_aware"
    status, attempts_on_dying = route_with(tmp_path, settings)
    assert status == 200
    # The breaker opened after its threshold; the remaining retries went elsewhere.
    assert attempts_on_dying == settings["cb_failure_threshold"]


@pytest.mark.parametrize("retries", [2, 3])
def test_retries_that_do_not_outnumber_the_breaker_fail_the_client(tmp_path, retries):
    """Why the role refuses retry_max_retries <= cb_failure_threshold (the routers' defaults
    had 3 and 3): every attempt goes to the same dying engine and the client gets a 500."""
    settings = shipped_settings() | {"cb_failure_threshold": 3, "retry_max_retries": retries}
    status, attempts_on_dying = route_with(tmp_path, settings)
    assert status == 500
    assert attempts_on_dying == retries
