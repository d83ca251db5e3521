"""The router and the watchdog in the lab: traffic, keys, and four faults under client load.

Each fault runs with a bounded client load through the router (3 non-streaming clients,
1 streaming). Non-streaming requests must all succeed during (a) and (b): the router
retries them on the other engine. Streams cut on a killed engine are counted and printed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.lab.conftest import ROOT, in_host
from vllm_fleet.lab.client_load import ClientLoad, LoadStats

ROUTER = "http://127.0.0.1:30000"
ENGINE_URLS = {"engine01": "http://engine01:8100", "engine02": "http://engine02:8100"}
DIRECT = {"engine01": "http://127.0.0.1:8101", "engine02": "http://127.0.0.1:8102"}
UNIT = "vllm-engine@g0.service"
MODEL = "smollm2"
# The bracket keeps pkill from matching the shell that runs it.
KILL_VLLM = "pkill -KILL -f 'bin/[v]llm serve'; pkill -KILL '^VLLM::'"
# inventories/lab/group_vars/all/fleet.yml: fleet_watchdog
INTERVAL, PROBE_TIMEOUT, THRESHOLD, BUDGET = 2, 10, 3, 3
# Each failed observation: the probe's timeout, then 2 s for the engine's progress counters.
DETECTION_BOUND = THRESHOLD * (INTERVAL + PROBE_TIMEOUT + 2) + 10
START_BOUND = 300


def secret(name: str) -> str:
    return (ROOT / ".lab/secrets" / name).read_text().strip()


def workers() -> dict[str, bool]:
    """Worker URL -> healthy, as the router sees them."""
    headers = {"Authorization": f"Bearer {secret('router_control_key')}"}
    try:
        response = httpx.get(f"{ROUTER}/workers", headers=headers, timeout=3)
        return {w["url"]: bool(w["is_healthy"]) for w in response.json()["workers"]}
    except (httpx.HTTPError, ValueError, KeyError):
        return {}


def wait_until(check: Callable[[], bool], timeout: float, what: str, poll: float = 0.25) -> float:
    """Seconds until ``check`` held; fails the test after ``timeout``."""
    started = time.monotonic()
    while not check():
        elapsed = time.monotonic() - started
        assert elapsed < timeout, f"not within {timeout:.0f} s: {what}"
        time.sleep(poll)
    return time.monotonic() - started


def unit_show(host: str, *props: str) -> dict[str, str]:
    out = in_host(host, "systemctl", "show", UNIT, *(f"--property={p}" for p in props)).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def watchdog_metrics(host: str) -> dict[str, float]:
    """The watchdog's samples for g0 (it listens on the host's own address)."""
    script = (
        "import socket, urllib.request;"
        "a = socket.gethostbyname(socket.gethostname());"
        "print(urllib.request.urlopen(f'http://{a}:9410/metrics', timeout=5).read().decode())"
    )
    text = in_host(host, "python3", "-c", script).stdout
    samples = {}
    for line in text.splitlines():
        if line.startswith("vllm_fleet_watchdog_") and 'group="g0"' in line:
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def watchdog_state(host: str) -> str:
    for name, value in watchdog_metrics(host).items():
        if name.startswith("vllm_fleet_watchdog_state{") and value == 1.0:
            return name.split('state="', 1)[1].split('"', 1)[0]
    return "unknown"


def restarts(host: str) -> float:
    return watchdog_metrics(host).get('vllm_fleet_watchdog_restarts_total{group="g0"}', 0.0)


def both_in_rotation() -> bool:
    seen = workers()
    return all(seen.get(url) is True for url in ENGINE_URLS.values())


def load() -> ClientLoad:
    return ClientLoad(ROUTER, secret("router_client_key"), MODEL, plain=3, streams=1)


def report(fault: str, stats: LoadStats, **timings: float) -> None:
    spent = ", ".join(f"{k} {v:.1f} s" for k, v in timings.items())
    print(f"\n[{fault}] {spent}; {stats.line()}")


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


def test_a_killed_engine_is_ejected_restarted_and_readmitted(lab):
    host, url = "engine01", ENGINE_URLS["engine01"]
    before = int(unit_show(host, "NRestarts")["NRestarts"])
    with load() as clients:
        time.sleep(3)
        # vLLM's processes die (an OOM kill, a segfault); the agent that supervises them
        # exits non-zero and systemd restarts the unit. (Killing the agent too would leave
        # systemd waiting 60 s for a cgroup-empty event it never gets in a cgroup-v1
        # container; on a host with cgroup v2 that case restarts as fast.)
        in_host(host, "sh", "-c", KILL_VLLM)
        ejected = wait_until(lambda: workers().get(url) is not True, 30, "router ejects it")
        restarted = wait_until(
            lambda: int(unit_show(host, "NRestarts")["NRestarts"]) > before,
            60,
            "systemd restarts the unit",
        )
        readmitted = wait_until(
            lambda: workers().get(url) is True, START_BOUND, "back in the router's rotation"
        )
        time.sleep(3)
    stats = clients.stats
    report("kill -9", stats, ejected=ejected, restart_scheduled=restarted, readmitted=readmitted)
    assert stats.plain_failed == 0, stats.failures[:5]
    assert stats.plain_ok > 0


def test_a_hung_engine_is_restarted_by_the_watchdog(lab):
    host, url = "engine01", ENGINE_URLS["engine01"]
    show = unit_show(host, "MainPID", "InvocationID")
    vllm_pid = in_host(host, "ps", "--ppid", show["MainPID"], "-o", "pid=").stdout.split()[0]
    restarts_before = restarts(host)
    with load() as clients:
        time.sleep(3)
        in_host(host, "kill", "-STOP", vllm_pid)
        detected = wait_until(
            lambda: restarts(host) > restarts_before, DETECTION_BOUND, "the watchdog restarts it"
        )
        relaunched = wait_until(
            lambda: unit_show(host, "InvocationID")["InvocationID"] != show["InvocationID"],
            60,
            "a new invocation of the unit",
        )
        back = wait_until(
            lambda: workers().get(url) is True, START_BOUND, "back in the router's rotation"
        )
        time.sleep(3)
    stats = clients.stats
    report("SIGSTOP", stats, restart_ordered=detected, relaunched=relaunched, serving=back)
    assert restarts(host) == restarts_before + 1
    assert stats.plain_failed == 0, stats.failures[:5]
    assert stats.plain_ok > 0


def test_a_restarted_router_has_every_engine_back_within_10_s(lab):
    with load() as clients:
        time.sleep(2)
        in_host("router01", "systemctl", "restart", "vllm-fleet-router.service")
        back = wait_until(both_in_rotation, 10, "both engines registered again")
        time.sleep(2)
    stats = clients.stats
    report("router restart", stats, both_back=back)


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
