"""Malformed requests to the router and straight to the engines get a 4xx, never a crash:
afterwards every engine is healthy, was not restarted, and a real completion still works."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.lab import ENGINES, ROOT, engine_key, in_host
from vllm_fleet.lab.paths import LAB_ROUTER_URL

ROUTER = LAB_ROUTER_URL
DIRECT = {"engine01": "http://127.0.0.1:8101", "engine02": "http://127.0.0.1:8102"}
MODEL = "smollm2"
UNIT = "vllm-engine@g0.service"
MAX_MODEL_LEN = 2048  # inventories/lab/host_vars: max_model_len
ROUTER_MAX_BODY = 8 * 1024 * 1024  # router default max_payload_bytes


def client_key() -> str:
    return (ROOT / ".lab/secrets/router_client_key").read_text().strip()


def chat(**extra: object) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], **extra}


# name -> (raw body, content type): each is malformed in one way.
BAD_BODIES: dict[str, tuple[bytes, str]] = {
    "invalid JSON": (b'{"model": "smollm2", "messages": [', "application/json"),
    "not UTF-8": (b'{"model": "\xff\xfe"}', "application/json"),
    "a JSON array": (b"[1, 2, 3]", "application/json"),
    "no messages": (json.dumps({"model": MODEL}).encode(), "application/json"),
    "max_tokens a string": (json.dumps(chat(max_tokens="lots")).encode(), "application/json"),
    "max_tokens negative": (json.dumps(chat(max_tokens=-5)).encode(), "application/json"),
    "max_tokens beyond the context": (
        json.dumps(chat(max_tokens=MAX_MODEL_LEN * 100)).encode(),
        "application/json",
    ),
    "temperature a dict": (json.dumps(chat(temperature={"a": 1})).encode(), "application/json"),
    "a prompt longer than the context": (
        json.dumps(chat(messages=[{"role": "user", "content": "word " * 5000}])).encode(),
        "application/json",
    ),
}


def post(base: str, key: str, body: bytes, content_type: str) -> httpx.Response:
    return httpx.post(
        f"{base}/v1/chat/completions",
        content=body,
        headers={"Authorization": f"Bearer {key}", "Content-Type": content_type,
                 "Connection": "close"},
        timeout=60,
    )  # fmt: skip


@pytest.fixture(scope="module")
def engine_pids(fresh_lab) -> dict[str, str]:
    return {
        host: in_host(host, "systemctl", "show", "-p", "MainPID", "--value", UNIT).stdout.strip()
        for host in ENGINES
    }


@pytest.mark.parametrize("case", sorted(BAD_BODIES))
def test_a_malformed_request_gets_a_4xx(fresh_lab, engine_pids, case):
    body, content_type = BAD_BODIES[case]
    through_router = post(ROUTER, client_key(), body, content_type)
    direct = post(DIRECT["engine01"], engine_key(), body, content_type)
    print(f"\n{case}: router {through_router.status_code}, engine {direct.status_code}")
    assert 400 <= through_router.status_code < 500, (case, through_router.text[:300])
    assert 400 <= direct.status_code < 500, (case, direct.text[:300])


def test_an_oversized_body_is_refused_by_the_router(fresh_lab, engine_pids):
    body = json.dumps(chat(messages=[{"role": "user", "content": "x" * (ROUTER_MAX_BODY + 1)}]))
    response = post(ROUTER, client_key(), body.encode(), "application/json")
    print(f"\n{len(body)} byte body through the router: {response.status_code}")
    assert response.status_code == 413, response.text[:300]
    # Under the limit the body reaches an engine, which refuses the prompt as too long.
    body = json.dumps(chat(messages=[{"role": "user", "content": "x " * (ROUTER_MAX_BODY // 8)}]))
    response = post(ROUTER, client_key(), body.encode(), "application/json")
    print(f"{len(body)} byte body through the router: {response.status_code}")
    assert response.status_code == 400, response.text[:300]


def test_the_engines_stayed_up_and_still_answer(fresh_lab, engine_pids):
    for host in ENGINES:
        pid = in_host(host, "systemctl", "show", "-p", "MainPID", "--value", UNIT).stdout.strip()
        assert pid == engine_pids[host], f"{host}: the engine was restarted"
        assert httpx.get(f"{DIRECT[host]}/health", timeout=10).status_code == 200
    answer = httpx.post(
        f"{ROUTER}/v1/chat/completions",
        json=chat(max_tokens=8, temperature=0),
        headers={"Authorization": f"Bearer {client_key()}"},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text[:300]
    assert answer.json()["choices"][0]["message"]["content"]
