"""The router and the watchdog in the lab: traffic, keys, admission, a restart budget.

The faults under client load (kill -9, hang, restarts, partition...) are the chaos matrix in
test_chaos_lab.py.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.lab.faults import (
    BUDGET,
    DIRECT,
    ENGINE_URLS,
    KILL_VLLM,
    MODEL,
    ROUTER,
    START_BOUND,
    UNIT,
    both_in_rotation,
    load,
    restarts,
    secret,
    unit_show,
    wait_until,
    watchdog_state,
    workers,
)
from tests.support.lab import in_host


@pytest.fixture
def lab(fresh_lab) -> Iterator[None]:
    assert fresh_lab.returncode == 0, fresh_lab.output[-3000:]
    wait_until(both_in_rotation, 120, "both engines in the router's rotation")
    yield
    # Whatever a test did, leave both engines serving for the next one.
    wait_until(both_in_rotation, START_BOUND, "both engines back in rotation after the test")


def test_traffic_spreads_over_both_engines_and_a_prefix_sticks(lab):
    key = {"Authorization": f"Bearer {secret('router_client_key')}"}

    def served() -> dict[str, float]:
        counts = {}
        for host, url in DIRECT.items():
            text = httpx.get(f"{url}/metrics", timeout=5).text
            counts[host] = sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("vllm:prefix_cache_queries_total")
            )
        return counts

    def send(prompt: str) -> None:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0}
        response = httpx.post(f"{ROUTER}/v1/completions", json=body, headers=key, timeout=60)
        assert response.status_code == 200, response.text

    # Several distinct long prompts at once: the router spreads them.
    before = served()
    prompts = [f"Topic {n}: " + " ".join(f"fact{n}-{i}" for i in range(120)) for n in range(8)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(send, prompts))
    spread = {h: served()[h] - before[h] for h in DIRECT}
    assert all(v > 0 for v in spread.values()), spread

    # One prefix, sent again and again: every request lands on the same engine.
    prefix = "Shared context: " + " ".join(f"clause{i}" for i in range(300))
    send(prefix + " Question 0?")
    before = served()
    for n in range(1, 6):
        send(prefix + f" Question {n}?")
    grown = {h: served()[h] - before[h] for h in DIRECT}
    landed = [h for h, v in grown.items() if v >= 300]
    print(f"\nspread over engines (queried tokens): {spread}; same prefix x5: {grown}")
    assert len(landed) == 1, grown


def test_the_router_refuses_requests_and_worker_changes_without_the_right_key(lab):
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    engine_key = secret("engine_api_key")
    for name, headers in {
        "no key": {},
        "engine key": {"Authorization": f"Bearer {engine_key}"},
        "wrong key": {"Authorization": "Bearer not-the-key"},
    }.items():
        response = httpx.post(f"{ROUTER}/v1/chat/completions", json=chat, headers=headers)
        assert response.status_code == 401, (name, response.status_code)
    add = {"url": "http://intruder:8100"}
    for name, headers in {
        "no key": {},
        "client key": {"Authorization": f"Bearer {secret('router_client_key')}"},
        "engine key": {"Authorization": f"Bearer {engine_key}"},
    }.items():
        response = httpx.post(f"{ROUTER}/workers", json=add, headers=headers)
        assert response.status_code == 401, (name, response.status_code)
        response = httpx.get(f"{ROUTER}/workers", headers=headers)
        assert response.status_code == 401, (name, response.status_code)
    assert "http://intruder:8100" not in workers()


def test_excess_load_is_refused_fast_with_429(lab):
    """The admission limit is 2 x the engines' max_num_seqs (2 x 16): 80 at once overflow it.

    Measured: sglang-router 0.3.2 answers the excess with 429, an empty body and no
    Retry-After header (clients must back off on their own).
    """
    key = {"Authorization": f"Bearer {secret('router_client_key')}"}

    async def burst() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(timeout=120, limits=limits, headers=key) as client:
            body = {"model": MODEL, "prompt": "Count slowly:", "max_tokens": 48}
            return await asyncio.gather(
                *(client.post(f"{ROUTER}/v1/completions", json=body) for _ in range(80))
            )

    started = time.monotonic()
    responses = asyncio.run(burst())
    codes = [r.status_code for r in responses]
    refused = [r for r in responses if r.status_code == 429]
    print(
        f"\n80 at once: {codes.count(200)} x 200, {len(refused)} x 429 "
        f"(Retry-After: {sorted({r.headers.get('retry-after') for r in refused}, key=str)}), "
        f"{time.monotonic() - started:.1f} s"
    )
    assert set(codes) <= {200, 429}
    assert codes.count(200) >= 32 and len(refused) >= 1


FAULT_DROPIN = "/run/systemd/system/vllm-engine@g0.service.d/50-fault.conf"


@pytest.fixture
def start_failure(lab) -> Iterator[str]:
    """engine02's group can no longer start (a drop-in whose ExecStartPre fails)."""
    host = "engine02"
    in_host(host, "mkdir", "-p", FAULT_DROPIN.rsplit("/", 1)[0])
    in_host(host, "sh", "-c", f"printf '[Service]\\nExecStartPre=/bin/false\\n' > {FAULT_DROPIN}")
    in_host(host, "systemctl", "daemon-reload")
    try:
        yield host
    finally:
        in_host(host, "rm", "-f", FAULT_DROPIN)
        in_host(host, "systemctl", "daemon-reload")
        in_host(host, "systemctl", "reset-failed", UNIT, check=False)
        in_host(host, "systemctl", "start", UNIT)


# make test: the budget's state machine in tests/unit/test_watchdog_state.py; here with the
# real watchdog and systemd (and in engine_watchdog's scenario), make test-all.
@pytest.mark.full
def test_the_restart_budget_stops_a_start_failure_loop(start_failure):
    host, url = start_failure, ENGINE_URLS["engine02"]
    before = restarts(host)
    with load() as clients:
        in_host(host, "sh", "-c", KILL_VLLM)
        gave_up = wait_until(
            lambda: watchdog_state(host) == "gave_up", 240, "the watchdog gives up"
        )
        spent = restarts(host) - before
        starts = int(unit_show(host, "NRestarts")["NRestarts"])
        # The storm is over: nothing restarts it any more, and it stays out of the router.
        time.sleep(20)
        assert restarts(host) - before == spent
        assert unit_show(host, "ActiveState")["ActiveState"] in ("failed", "inactive")
        assert url not in workers()
    stats = clients.stats
    journal = in_host(host, "journalctl", "-u", "vllm-fleet-watchdog", "-o", "cat", "--no-pager")
    events = [json.loads(line) for line in journal.stdout.splitlines() if line.startswith("{")]
    print(
        f"\n[start failure loop] gave up after {gave_up:.1f} s, {spent:.0f} watchdog restarts, "
        f"{starts} systemd restarts; {stats.line()}"
    )
    assert 1 <= spent <= BUDGET
    assert any(e["event"] == "gave_up" for e in events)
    assert stats.plain_failed == 0, stats.failures[:5]
