"""The fault matrix (``make chaos``): one fault at a time under a bounded client load.

Each case runs 3 non-streaming clients and 1 streaming client through the router, injects
its fault, measures how long the fleet took to notice (detected) and to serve fully again
(recovered) with no operator action, and adds a row to the matrix that the session prints
at its end (tests/lab/conftest.py): failed non-streaming requests, streams cut, and data
lost (the serving revision's files re-hashed against their manifest afterwards).

The router retries a non-streaming request on another engine, so engine faults must cost
no non-streaming request. A stream already running on an engine that dies cannot be
retried by the router (it has sent bytes): those are counted as cut. The routers share
a VIP: a router case kills the one holding it, runs clients that retry as the OpenAI SDK
does (2 retries, backoff from 0.5 s), and asserts that it cost at most the requests in
flight at that instant and nothing started once the VIP answered again.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.lab.faults import (
    DETECTION_BOUND,
    DIRECT,
    ENGINE_URLS,
    KILL_VLLM,
    MODEL,
    ROUTER,
    START_BOUND,
    UNIT,
    both_in_rotation,
    restarts,
    secret,
    unit_show,
    vip_holder,
    wait_until,
    watchdog_state,
    workers,
)
from tests.support.lab import (
    CACHE,
    CHAOS_MATRIX,
    ROOT,
    ChaosRow,
    TwoRuns,
    engine_key,
    in_host,
    pinned_revision,
    playbook,
)
from vllm_fleet.lab.client_load import ClientLoad, LoadStats
from vllm_fleet.lab.variants import LAB_MODEL, publish_revision, remove_revision

MODEL_DIR = f"/srv/models/{LAB_MODEL}"
WEIGHTS = f"{MODEL_DIR}/current"
MIRROR_UNIT = "vllm-fleet-lab-mirror.service"
MIRROR_URL = f"http://router01:8088/models/{LAB_MODEL}"
ROUTER_UNIT = "vllm-fleet-router.service"
WATCHDOG_UNIT = "vllm-fleet-watchdog.service"
# OpenAI's Python SDK retries a connection error or a 5xx twice by default.
SDK_RETRIES = 2


def clients(retries: int = 0) -> ClientLoad:
    return ClientLoad(
        ROUTER, secret("router_client_key"), MODEL, plain=3, streams=1, retries=retries
    )


def files_lost(*hosts: str) -> int:
    """Files of the serving revision missing or changed, re-hashed in full on each host."""
    lost = 0
    for host in hosts:
        result = in_host(host, "vllm-fleet", "weights", "verify", "--full", WEIGHTS, check=False)
        if result.returncode != 0:
            print(f"\n{host}: {result.stdout[-1500:]}{result.stderr[-1500:]}")
            lost += max(1, result.stdout.count("\n"))
    return lost


def a_completion_answers(timeout: float = 30) -> bool:
    body = {"model": MODEL, "prompt": "Say hi.", "max_tokens": 2}
    headers = {"Authorization": f"Bearer {secret('router_client_key')}"}
    try:
        response = httpx.post(
            f"{ROUTER}/v1/completions", json=body, headers=headers, timeout=timeout
        )
    except httpx.HTTPError:
        return False
    return response.status_code == 200


def record(
    fault: str,
    stats: LoadStats,
    detected: float | None,
    recovered: float,
    lost: int,
    note: str = "",
) -> ChaosRow:
    row = ChaosRow(fault, detected, recovered, stats, lost, note)
    CHAOS_MATRIX.append(row)
    print(f"\n{row.line()}")
    for failure in stats.failures[:3]:
        print(f"  a failed request: {failure}")
    return row


def assert_bound(
    row: ChaosRow, fault_at: float, exposed_until: float | None = None, also: str = ""
) -> None:
    """The bound of every fault that leaves a router serving: the load overlapped the fault
    (requests served before and after it), no non-streaming request failed (the router
    retries them elsewhere), no stream was refused, at most the streams that ran on the
    faulty engine while it was still in rotation (in flight from the fault until
    ``exposed_until``, by default the fault's instant) were cut (one already sending cannot
    be retried), and no file was lost. ``also``: what the case asserts besides (the report's
    "asserted" column)."""
    stats = row.stats
    until = fault_at if exposed_until is None else exposed_until
    exposed = sum(
        r.started <= until and r.ended > fault_at for r in stats.requests if r.kind == "stream"
    )
    row.asserted = (
        f"requests served before and after the fault; 0 failed; 0 streams refused; "
        f"cut <= {exposed} (streams on the faulty engine while in rotation); 0 files lost"
        + (f"; {also}" if also else "")
    )
    assert stats.served_before_and_after(fault_at), "the load did not overlap the fault"
    assert stats.plain_failed == 0, stats.failures[:5]
    assert stats.streams_refused == 0, stats.line()
    assert stats.streams_cut <= exposed, (exposed, stats.line())
    assert row.lost == 0


def container_pid(name: str) -> str:
    out = subprocess.run(
        ["podman", "inspect", "--format", "{{.State.Pid}}", name],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def container_address(name: str) -> str:
    return in_host(name, "hostname", "-I").stdout.split()[0]


def in_netns(name: str, *argv: str) -> None:
    """Run a host tool (ip) in the lab container's own network namespace, and only there."""
    subprocess.run(["nsenter", "-t", container_pid(name), "-n", *argv], check=True)


def unit_active_and_enabled(host: str, unit: str) -> bool:
    active = in_host(host, "systemctl", "is-active", unit, check=False).stdout.strip()
    enabled = in_host(host, "systemctl", "is-enabled", unit, check=False).stdout.strip()
    return (active, enabled) == ("active", "enabled")


@pytest.fixture
def chaos(fresh_lab) -> Iterator[None]:
    assert fresh_lab.returncode == 0, fresh_lab.output[-3000:]
    wait_until(both_in_rotation, START_BOUND, "both engines in the router's rotation")
    yield
    # Whatever a case did, the next one starts from a fleet that serves fully.
    wait_until(both_in_rotation, START_BOUND, "both engines back in rotation after the case")


def kill_and_rejoin(host: str, load: ClientLoad) -> tuple[float, float, float]:
    """Under ``load``: kill vLLM on ``host`` (a segfault, a kill -9: the agent that supervises
    it exits non-zero and systemd restarts the unit) and wait until the routers have it back.
    (when, seconds until ejected, seconds until back in rotation)."""
    url = ENGINE_URLS[host]
    before = int(unit_show(host, "NRestarts")["NRestarts"])
    time.sleep(3)
    started = time.monotonic()
    in_host(host, "sh", "-c", KILL_VLLM)
    ejected = wait_until(lambda: workers().get(url) is not True, 30, "router ejects it")
    back_in_rotation(host, before)
    recovered = time.monotonic() - started
    time.sleep(3)
    return started, ejected, recovered


def back_in_rotation(host: str, restarts_before: int) -> None:
    """Until systemd has restarted the engine unit and the router lists it healthy again."""
    wait_until(
        lambda: int(unit_show(host, "NRestarts")["NRestarts"]) > restarts_before,
        60,
        "systemd restarts the unit",
    )
    wait_until(lambda: workers().get(ENGINE_URLS[host]) is True, START_BOUND, "back in rotation")


# make test: the name-resolution row below kills engine01's vLLM the same way, under the same
# load, and waits for systemd's restart and the routers to take it back (with no name
# resolving besides).
@pytest.mark.full
def test_engine_sigkill(chaos):
    host = "engine01"
    with clients() as load:
        started, ejected, recovered = kill_and_rejoin(host, load)
    row = record("engine SIGKILL", load.stats, ejected, recovered, files_lost(host))
    assert_bound(row, started)


# Nothing listens on this loopback address: every lookup fails at once, as in a DNS outage
# that refuses rather than times out.
NO_DNS = "nameserver 127.0.0.9\n"
LAB_HOSTS = ("router01", "router02", "engine01", "engine02")


@contextlib.contextmanager
def name_resolution_gone(hosts: tuple[str, ...]) -> Iterator[None]:
    """Each host's resolver pointed at nothing; its own resolv.conf back afterwards."""
    saved = {host: in_host(host, "cat", "/etc/resolv.conf").stdout for host in hosts}
    try:
        for host in hosts:
            in_host(host, "sh", "-c", "cat > /etc/resolv.conf", stdin=NO_DNS)
        yield
    finally:
        for host, text in saved.items():
            in_host(host, "sh", "-c", "cat > /etc/resolv.conf", stdin=text)


def resolves(host: str, name: str) -> bool:
    return in_host(host, "getent", "hosts", name, check=False).returncode == 0


def test_name_resolution_gone_an_engine_restarts_and_rejoins_by_address(chaos):
    """No host can resolve a name (the lab's DNS gone on all four) and an engine dies: the
    routers reach the other engine and the restarted one, the engine and its watchdog reach
    the routers, all by the addresses the inventory gave (fleet_address), so it rejoins."""
    host = "engine01"
    assert resolves("router01", host), "the lab resolves names before the fault"
    with name_resolution_gone(LAB_HOSTS), clients() as load:
        assert not resolves("router01", host) and not resolves(host, "router01")
        started, ejected, recovered = kill_and_rejoin(host, load)
        # Still no name resolves: it rejoined by address.
        assert not resolves("router01", host) and not resolves(host, "router01")
    row = record(
        "name resolution gone, an engine restarted",
        load.stats,
        ejected,
        recovered,
        files_lost(host),
        "rejoined by address",
    )
    assert_bound(row, started, also="no name resolved on any host before the kill or after")


def engine_core_pid(host: str, api_server_pid: str) -> str:
    """vLLM's engine core: the API server's child that schedules and runs the model."""
    children = in_host(host, "ps", "--ppid", api_server_pid, "-o", "pid=,args=").stdout
    cores = [line.split()[0] for line in children.splitlines() if "VLLM::EngineCore" in line]
    assert len(cores) == 1, children
    return cores[0]


def engine_health(host: str) -> int:
    try:
        return httpx.get(f"{DIRECT[host]}/health", timeout=5).status_code
    except httpx.HTTPError:
        return 0


# make test: tests/unit/test_watchdog_service.py (a hanging engine is left and restarted while
# the others go on, by the real watchdog service).
@pytest.mark.full
def test_engine_core_stall_behind_a_healthy_api_server(chaos):
    """The case the inference probe exists for: the engine core stops making progress while
    the API server still answers /health 200, so the router keeps it in rotation. The
    watchdog's probe must find it, take it out of the routers and restart the group."""
    host, url = "engine01", ENGINE_URLS["engine01"]
    show = unit_show(host, "MainPID", "InvocationID")
    api_server = in_host(host, "ps", "--ppid", show["MainPID"], "-o", "pid=").stdout.split()[0]
    core = engine_core_pid(host, api_server)
    restarts_before = restarts(host)
    with clients() as load:
        time.sleep(3)
        started = time.monotonic()
        in_host(host, "kill", "-STOP", core)
        time.sleep(2)
        # What makes this fault hard: every liveness check still passes.
        assert engine_health(host) == 200, "the API server's /health no longer answers 200"
        assert workers().get(url) is True, "the router ejected it on /health alone"
        detected = wait_until(
            lambda: restarts(host) > restarts_before, DETECTION_BOUND, "the watchdog restarts it"
        )
        wait_until(
            lambda: unit_show(host, "InvocationID")["InvocationID"] != show["InvocationID"],
            60,
            "a new invocation of the unit",
        )
        wait_until(lambda: workers().get(url) is True, START_BOUND, "back in rotation")
        recovered = time.monotonic() - started
        time.sleep(3)
    row = record(
        "engine core stall (/health 200)",
        load.stats,
        detected,
        recovered,
        files_lost(host),
        "detected = the watchdog's restart",
    )
    assert restarts(host) == restarts_before + 1
    assert_bound(
        row,
        started,
        exposed_until=started + detected,
        also=f"/health 200 and in rotation while stalled; restarted by the watchdog within "
        f"{DETECTION_BOUND:.0f} s",
    )


def served_after(load: ClientLoad, at: float) -> bool:
    return any(r.ok and r.started > at for r in load.stats.requests)


def served_one(load: ClientLoad) -> bool:
    """A request of the load has been served: a fault from now on falls inside the load."""
    return any(r.ok for r in load.stats.requests)


def assert_router_failover_bound(row: ChaosRow, fault_at: float, serving_at: float) -> None:
    """Two routers behind the VIP: a router's death costs at most the requests in flight on
    it at that instant (the clients retry as the OpenAI SDK does: only a stream already
    started cannot be retried); every request started once the VIP answered again succeeded;
    the load overlapped the fault (requests served before and after it); no file lost."""
    stats = row.stats
    streams_in_flight = stats.in_flight(fault_at, "stream")
    row.asserted = (
        f"{stats.in_flight(fault_at)} requests in flight at the fault (> 0); 0 failed after "
        f"SDK retries; 0 streams refused; cut <= {streams_in_flight} (streams in flight); "
        "none started after the VIP answered failed; served before and after; 0 files lost"
    )
    assert stats.in_flight(fault_at) > 0, "no request was in flight when the router died"
    assert stats.plain_failed == 0, stats.failures[:5]
    assert stats.streams_refused == 0, stats.line()
    assert stats.streams_cut <= streams_in_flight, (streams_in_flight, stats.line())
    late = stats.failed_started_after(serving_at)
    assert late == [], f"{len(late)} requests started after the VIP answered again failed"
    assert stats.served_before_and_after(fault_at)
    assert row.lost == 0


def test_router_killed(chaos):
    holder = vip_holder()
    assert holder is not None, "no router holds the VIP"
    before = int(in_host(holder, "systemctl", "show", ROUTER_UNIT, "-P", "NRestarts").stdout)
    with clients(retries=SDK_RETRIES) as load:
        wait_until(lambda: load.stats.plain_ok >= 3, 60, "the load is served")
        fault_at = time.monotonic()
        in_host(holder, "systemctl", "kill", "--signal=SIGKILL", ROUTER_UNIT)
        detected = wait_until(a_completion_answers, 30, "a completion through the VIP")
        serving_at = time.monotonic()
        wait_until(lambda: served_after(load, serving_at), 60, "the load served again")
        wait_until(
            lambda: (
                int(in_host(holder, "systemctl", "show", ROUTER_UNIT, "-P", "NRestarts").stdout)
                > before
            ),
            30,
            "systemd restarts the killed router",
        )
        wait_until(both_in_rotation, 60, "both engines in the VIP holder's rotation")
        recovered = time.monotonic() - fault_at
        time.sleep(3)
    row = record(
        "router SIGKILL",
        load.stats,
        detected,
        recovered,
        files_lost("engine01", "engine02"),
        f"VIP {holder} -> {vip_holder()}; in flight at the kill: {load.stats.in_flight(fault_at)}",
    )
    assert_router_failover_bound(row, fault_at, serving_at)


# A router host's boot path (systemd, keepalived, the watchdogs' re-registration) while the
# other router holds the VIP: make test-all.
@pytest.mark.full
def test_router_host_restarted(chaos):
    holder = vip_holder()
    assert holder is not None, "no router holds the VIP"
    with clients(retries=SDK_RETRIES) as load:
        wait_until(lambda: load.stats.plain_ok >= 3, 60, "the load is served")
        fault_at = time.monotonic()
        subprocess.run(["podman", "restart", holder], check=True, capture_output=True)
        detected = wait_until(a_completion_answers, 120, "a completion through the VIP")
        serving_at = time.monotonic()
        # The requests in flight on the dead host wait for the clients' timeout (nothing
        # answers them, not even a reset), then are retried.
        wait_until(lambda: served_after(load, serving_at), 150, "the load served again")
        wait_until(lambda: unit_active_and_enabled(holder, ROUTER_UNIT), 120, "it boots")
        wait_until(both_in_rotation, 120, "both engines in the VIP holder's rotation")
        recovered = time.monotonic() - fault_at
        time.sleep(3)
    assert unit_active_and_enabled(holder, "keepalived.service")
    row = record(
        "router host restart",
        load.stats,
        detected,
        recovered,
        files_lost("engine01", "engine02"),
        f"VIP {holder} -> {vip_holder()}; in flight at the restart: "
        f"{load.stats.in_flight(fault_at)} (retried after the clients' 90 s timeout)",
    )
    assert_router_failover_bound(row, fault_at, serving_at)


# The router hung, not dead (make test-all): its port still accepts connections, so only
# keepalived's check (a 2 s /liveness deadline) can see it. The VIP must move, the engines
# stay in the new holder's rotation (the watchdogs' calls to the hung router time out without
# holding up the others), and once resumed it stays a backup (nopreempt: no second move).
@pytest.mark.full
def test_router_hung(chaos):
    holder = vip_holder()
    assert holder is not None, "no router holds the VIP"
    with clients(retries=SDK_RETRIES) as load:
        wait_until(lambda: load.stats.plain_ok >= 3, 60, "the load is served")
        fault_at = time.monotonic()
        in_host(holder, "systemctl", "kill", "--signal=SIGSTOP", ROUTER_UNIT)
        try:
            # A connection made before the VIP moved hangs on the stopped router: each try
            # gives up after 5 s.
            detected = wait_until(
                lambda: a_completion_answers(timeout=5), 60, "a completion through the VIP"
            )
            serving_at = time.monotonic()
            new_holder = vip_holder()
            assert new_holder not in (None, holder), new_holder
            # Each client's request in flight on the stopped router waits for its timeout
            # (90 s here), then is retried through the new holder.
            wait_until(lambda: served_after(load, serving_at), 150, "the load served again")
            wait_until(both_in_rotation, 30, "both engines in the new holder's rotation")
        finally:
            in_host(holder, "systemctl", "kill", "--signal=SIGCONT", ROUTER_UNIT)
        wait_until(lambda: router_answers(holder), 30, "the resumed router answers")
        recovered = time.monotonic() - fault_at
        time.sleep(3)
    # (Leaving the block waited for the requests the hung router held: the clients' 90 s
    # timeout, then their retry.)
    assert vip_holder() == new_holder, "the resumed router took the VIP back"
    row = record(
        "router SIGSTOP",
        load.stats,
        detected,
        recovered,
        files_lost("engine01", "engine02"),
        f"VIP {holder} -> {new_holder}; in flight at the stop: {load.stats.in_flight(fault_at)}",
    )
    assert_router_failover_bound(row, fault_at, serving_at)


def router_answers(host: str) -> bool:
    check = in_host(
        host, "curl", "-sf", "--max-time", "2", "http://127.0.0.1:30000/liveness", check=False
    )
    return check.returncode == 0


# make test: the vllm_engine scenario asserts the units are enabled (started at boot); the
# router host restart (also make test-all) is the same boot path.
@pytest.mark.full
def test_engine_host_restarted(chaos):
    host, url = "engine02", ENGINE_URLS["engine02"]
    address = container_address(host)
    with clients() as load:
        time.sleep(3)
        started = time.monotonic()
        subprocess.run(["podman", "restart", host], check=True, capture_output=True)
        ejected = wait_until(lambda: workers().get(url) is not True, 60, "router ejects it")
        wait_until(lambda: workers().get(url) is True, START_BOUND, "re-registered, serving")
        recovered = time.monotonic() - started
        time.sleep(3)
    assert container_address(host) == address, "the engine binds its deploy-time address"
    for unit in (UNIT, WATCHDOG_UNIT):
        assert unit_active_and_enabled(host, unit), unit
    row = record("engine host restart", load.stats, ejected, recovered, files_lost(host))
    assert_bound(row, started, also="the same address after the boot; engine, watchdog enabled")


def container_cgroup_file(name: str, v1_controller: str, name_v1: str, name_v2: str) -> Path:
    """A file of the container's own cgroup, on a cgroup v1 or v2 host."""
    out = subprocess.run(
        ["podman", "inspect", "--format", "{{.State.CgroupPath}}", name],
        capture_output=True,
        text=True,
        check=True,
    )
    relative = out.stdout.strip().lstrip("/")
    if Path("/sys/fs/cgroup/cgroup.controllers").exists():
        return Path("/sys/fs/cgroup") / relative / name_v2
    return Path("/sys/fs/cgroup") / v1_controller / relative / name_v1


@contextlib.contextmanager
def cpu_quota(name: str, cpus: float) -> Iterator[None]:
    """The container held to ``cpus`` CPUs by the kernel's CFS quota on its cgroup, then
    given back what it had (podman's own update leaves a stale quota behind on v1)."""
    quota = container_cgroup_file(name, "cpu", "cpu.cfs_quota_us", "cpu.max")
    before = quota.read_text().strip()
    if quota.name == "cpu.max":
        period = int(before.split()[1])
        quota.write_text(f"{int(period * cpus)} {period}")
    else:
        period = int((quota.parent / "cpu.cfs_period_us").read_text())
        quota.write_text(str(int(period * cpus)))
    try:
        yield
    finally:
        quota.write_text(before if quota.name == "cpu.cfs_quota_us" else before.split()[0])


def requests_served(host: str) -> float:
    """The engine's own count of finished requests (vLLM's /metrics needs no key)."""
    text = httpx.get(f"{DIRECT[host]}/metrics", timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "vllm:request_success"
        for sample in family.samples
        if sample.name.endswith("_total")
    )


def share_of(host: str, window: Callable[[], None]) -> float:
    """``host``'s share of the requests both engines finished while ``window`` ran."""
    before = {h: requests_served(h) for h in DIRECT}
    window()
    served = {h: requests_served(h) - before[h] for h in DIRECT}
    total = sum(served.values())
    assert total > 0, served
    return served[host] / total


@pytest.mark.full
def test_a_slow_engine_sheds_load_and_is_neither_ejected_nor_restarted(chaos):
    """engine01 held to a fifth of a CPU by the kernel's CFS quota: alive, answering its
    health checks and probes, four or more times slower. Under a load deep enough to queue
    (three times the routers' balance threshold), the router sends engine02 a larger share
    than before; the router never ejects engine01, its watchdog never restarts it, for
    longer than the watchdog's detection bound; no request fails, no stream is cut."""
    host, url = "engine01", ENGINE_URLS["engine01"]
    settings = json.loads(in_host("router01", "cat", "/etc/vllm-fleet/router.json").stdout)
    depth = 3 * int(settings["router_args"]["balance_abs_threshold"])
    nrestarts, watchdog_restarts = int(unit_show(host, "NRestarts")["NRestarts"]), restarts(host)
    rotation: list[bool] = []

    def watch(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            rotation.append(workers().get(url) is True)
            time.sleep(1)

    load = ClientLoad(ROUTER, secret("router_client_key"), MODEL, plain=depth, streams=1)
    with load:
        time.sleep(5)
        before = share_of("engine02", lambda: time.sleep(20))
        started = time.monotonic()
        with cpu_quota(host, 0.2):
            slowed = share_of("engine02", lambda: watch(DETECTION_BOUND + 10))
        recovered = wait_until(both_in_rotation, START_BOUND, "both engines in rotation")
        time.sleep(3)
    row = record(
        "engine slowed (0.2 CPU)",
        load.stats,
        None,
        recovered,
        files_lost(host),
        f"{depth} clients; engine02's share {before:.0%} -> {slowed:.0%}; "
        f"in rotation {sum(rotation)}/{len(rotation)} samples",
    )
    assert_bound(
        row,
        started,
        also="in rotation at every sample; no restart (systemd, watchdog); engine02's share grew",
    )
    assert all(rotation), "the router ejected the slow engine"
    assert int(unit_show(host, "NRestarts")["NRestarts"]) == nrestarts
    assert restarts(host) == watchdog_restarts
    assert slowed > before, (before, slowed)


ENGINE_STATE = "/var/lib/vllm-fleet/engines/g0"
JOURNAL = "/var/log/journal"


def in_mounts(pid: str, script: str, check: bool = True) -> None:
    """A shell script in that process's mount namespace (the container's own, or a unit's)."""
    subprocess.run(["nsenter", "-t", pid, "-m", "sh", "-c", script], check=check)


@contextlib.contextmanager
def full(host: str, paths: dict[str, str], staging: Path) -> Iterator[None]:
    """Each path (of the unit named beside it) on its own tmpfs, as a small partition would
    be: what it holds copied over, 2 MiB spare, then filled to the last byte. Mounted from the
    host in that unit's own mount namespace (a mount made in the container's would sit under
    a unit's own bind mount of the path, unseen); /proc/PID/root reaches the path as that
    process sees it. journald is rotated onto the full journal (it opens new files there).
    Undone lazily afterwards (open files may pin the tmpfs)."""
    owners = {path: host_pid(host, main_pid(host, unit)) for path, unit in paths.items()}
    mounted: list[tuple[str, str]] = []
    try:
        for index, (path, pid) in enumerate(owners.items()):
            seen = f"/proc/{pid}/root{path}"
            kept = staging / str(index)
            subprocess.run(["cp", "-a", f"{seen}/.", f"{kept}/"], check=True)
            used_kib = int(subprocess.run(["du", "-sk", str(kept)], capture_output=True,
                                          text=True, check=True).stdout.split()[0])  # fmt: skip
            in_mounts(pid, f"mount -t tmpfs -o size={used_kib + 2048}k chaos {path}")
            mounted.append((path, pid))
            subprocess.run(["cp", "-a", f"{kept}/.", f"{seen}/"], check=True)
            subprocess.run(
                ["sh", "-c", f"cat /dev/zero > {seen}/.chaos-filler 2>/dev/null"], check=False
            )
        in_host(host, "journalctl", "--rotate", check=False)
        yield
    finally:
        for path, pid in mounted:
            unmount(pid, path)
        in_host(host, "journalctl", "--rotate", check=False)


def unmount(pid: str, path: str) -> None:
    """Detach the top mount at path in that process's mount namespace (umount2 MNT_DETACH,
    by the container's python3: util-linux's umount, run through nsenter, fails to find it)."""
    detach = (
        "import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True);"
        "sys.exit(libc.umount2(sys.argv[1].encode(), 2) and ctypes.get_errno())"
    )
    subprocess.run(["nsenter", "-t", pid, "-m", "python3", "-c", detach, path], check=True)


def main_pid(host: str, unit: str) -> str:
    return in_host(host, "systemctl", "show", unit, "--property=MainPID", "--value").stdout.strip()


def host_pid(name: str, pid: str) -> str:
    """The host's pid of process ``pid`` of the container (nsenter needs the host's)."""
    namespace = Path(f"/proc/{container_pid(name)}/ns/pid").readlink()
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError):
            if (status.parent / "ns/pid").readlink() != namespace:
                continue
            for line in status.read_text().splitlines():
                if line.startswith("NSpid:") and line.split()[-1] == pid:
                    return status.parent.name
    pytest.fail(f"no process {pid} in {name}")


def free_bytes(pid: str, path: str) -> int:
    """Free bytes at path as the host's process pid sees it (its own mount namespace)."""
    out = subprocess.run(
        ["nsenter", "-t", pid, "-m", "df", "--output=avail", "-B1", path],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return int(out.stdout.split()[-1])


# make test: the disk-full fetch covers ENOSPC on the weights' disk; this one is serving's.
@pytest.mark.full
def test_the_journal_and_the_engines_state_directory_full_while_serving(chaos, tmp_path):
    """engine01's journal and its engine's state directory (TMPDIR, caches) on full
    filesystems for longer than the watchdog's detection bound: the engine keeps serving its
    share, nothing restarts it, no request fails, no stream is cut; once there is space again
    the journal takes new entries."""
    host = "engine01"
    engine_pid = unit_show(host, "MainPID")["MainPID"]
    nrestarts, watchdog_restarts = int(unit_show(host, "NRestarts")["NRestarts"]), restarts(host)
    states: list[str] = []
    with clients() as load:
        time.sleep(5)
        started = time.monotonic()
        with full(host, {JOURNAL: "systemd-journald.service", ENGINE_STATE: UNIT}, tmp_path):
            # The fault is what the engine and journald see, in their own namespaces.
            assert free_bytes(host_pid(host, engine_pid), ENGINE_STATE) == 0
            assert free_bytes(host_pid(host, main_pid(host, "systemd-journald")), JOURNAL) == 0
            served_before = requests_served(host)
            deadline = time.monotonic() + DETECTION_BOUND + 10
            while time.monotonic() < deadline:
                states.append(watchdog_state(host))
                time.sleep(2)
            served_while_full = requests_served(host) - served_before
        # It never stopped serving: this is only the wait for both engines in rotation.
        recovered = wait_until(both_in_rotation, START_BOUND, "both engines in rotation")
        time.sleep(3)
    marker = f"vllm-fleet chaos: space again {time.time():.0f}"
    in_host(host, "logger", "-t", "vllm-fleet-chaos", marker)
    wait_until(
        lambda: marker in in_host(host, "journalctl", "-t", "vllm-fleet-chaos", "-q").stdout,
        30,
        "the journal takes new entries",
    )
    row = record(
        "journal and state dir full",
        load.stats,
        None,
        recovered,
        files_lost(host),
        f"{DETECTION_BOUND + 10} s full; engine01 served {served_while_full:.0f} meanwhile; "
        f"watchdog {sorted(set(states))}",
    )
    assert_bound(
        row,
        started,
        also="0 streams cut; engine01 served meanwhile, not restarted; every "
        "watchdog probe healthy; the journal takes entries again",
    )
    assert load.stats.streams_cut == 0, load.stats.line()
    assert served_while_full > 0, "engine01 kept serving its share"
    assert unit_show(host, "MainPID")["MainPID"] == engine_pid, "the engine was not restarted"
    assert int(unit_show(host, "NRestarts")["NRestarts"]) == nrestarts
    assert restarts(host) == watchdog_restarts
    assert set(states) == {"healthy"}, "every probe of the watchdog passed while full"


def test_watchdog_killed(chaos):
    host = "engine01"
    engine_pid = unit_show(host, "MainPID")["MainPID"]
    before = int(in_host(host, "systemctl", "show", WATCHDOG_UNIT, "-P", "NRestarts").stdout)
    with clients() as load:
        time.sleep(3)
        started = time.monotonic()
        in_host(host, "systemctl", "kill", "--signal=SIGKILL", WATCHDOG_UNIT)
        detected = wait_until(
            lambda: (
                int(in_host(host, "systemctl", "show", WATCHDOG_UNIT, "-P", "NRestarts").stdout)
                > before
            ),
            30,
            "systemd restarts the watchdog",
        )
        wait_until(lambda: watchdog_state(host) == "healthy", 60, "the watchdog probes again")
        recovered = time.monotonic() - started
        time.sleep(3)
    # The engine it supervises was left alone.
    assert unit_show(host, "MainPID")["MainPID"] == engine_pid
    row = record("watchdog SIGKILL", load.stats, detected, recovered, files_lost(host))
    assert_bound(row, started, also="restarted by systemd; the engine kept its PID")


def test_partition_between_router_and_one_engine(chaos):
    host, url = "engine01", ENGINE_URLS["engine01"]
    target = f"{container_address(host)}/32"
    router = vip_holder()
    assert router is not None, "no router holds the VIP"
    with clients() as load:
        time.sleep(3)
        started = time.monotonic()
        # Packets from the serving router to engine01 vanish (a blackhole route in its own
        # network namespace): no reset, no refusal, as when a link or a switch port dies.
        in_netns(router, "ip", "route", "add", "blackhole", target)
        try:
            ejected = wait_until(lambda: workers().get(url) is not True, 60, "router ejects it")
            time.sleep(10)  # partitioned a while, serving on the other engine
        finally:
            in_netns(router, "ip", "route", "del", "blackhole", target)
        healed = time.monotonic()
        wait_until(lambda: workers().get(url) is True, 120, "readmitted after the partition")
        recovered = time.monotonic() - started
        readmitted = time.monotonic() - healed
        time.sleep(3)
    row = record(
        "partition router-engine01",
        load.stats,
        ejected,
        recovered,
        files_lost(host),
        f"{router}: 10 s partitioned; readmitted {readmitted:.1f} s after it healed",
    )
    assert_bound(row, started)


@pytest.mark.full
def test_an_engines_link_flaps(chaos):
    """engine01's link goes down and up five times in 30 s (3 s down, 3 s up), as a bad cable
    or a flapping switch port does. Each outage is shorter than the watchdog's detection
    bound, so the engine (healthy all along) is never restarted; the router retries elsewhere
    while it cannot reach it and takes it back after the last flap."""
    host, url = "engine01", ENGINE_URLS["engine01"]
    nrestarts, watchdog_restarts = int(unit_show(host, "NRestarts")["NRestarts"]), restarts(host)
    # Taking the link down drops its routes; the host's own address and subnet come back with
    # it, its default route does not (the lab has no network manager to restore it).
    default_route = in_host(host, "ip", "route", "show", "default").stdout.split()
    with clients() as load:
        time.sleep(3)
        started = time.monotonic()
        try:
            for _ in range(5):
                in_netns(host, "ip", "link", "set", "eth0", "down")
                time.sleep(3)
                in_netns(host, "ip", "link", "set", "eth0", "up")
                time.sleep(3)
        finally:
            in_netns(host, "ip", "link", "set", "eth0", "up")
            if default_route:
                in_netns(host, "ip", "route", "replace", *default_route)
        healed = time.monotonic()
        wait_until(lambda: workers().get(url) is True, START_BOUND, "back in rotation")
        recovered = time.monotonic() - started
        back = time.monotonic() - healed
        time.sleep(3)
    row = record(
        "engine01 link flaps (5 x 3 s)",
        load.stats,
        None,
        recovered,
        files_lost(host),
        f"in rotation {back:.1f} s after the last flap",
    )
    assert_bound(
        row, started, exposed_until=healed, also="no restart (systemd, watchdog); back in rotation"
    )
    assert int(unit_show(host, "NRestarts")["NRestarts"]) == nrestarts
    assert restarts(host) == watchdog_restarts


@pytest.fixture(scope="module")
def revision_b() -> Iterator[str]:
    """A second valid revision of the lab's model in the mirror, for the fetch faults."""
    revision = publish_revision(CACHE, "revision B of the fault matrix")
    yield revision
    remove_revision(CACHE, revision)


@contextlib.contextmanager
def mirror_throttled() -> Iterator[None]:
    """The mirror's host sends at 160 Mbit/s, so a fetch lasts long enough to be cut."""
    qdisc = ["dev", "eth0", "root"]
    in_netns("router01", "tc", "qdisc", "add", *qdisc, "tbf", "rate", "160mbit",
             "burst", "256kb", "latency", "400ms")  # fmt: skip
    try:
        yield
    finally:
        in_netns("router01", "tc", "qdisc", "del", *qdisc)


def fetch_argv(revision: str) -> list[str]:
    """The same fetch the model_weights role runs, started by hand on the host."""
    return ["vllm-fleet", "weights", "fetch", f"--name={LAB_MODEL}", f"--revision={revision}",
            f"--url={MIRROR_URL}", "--root=/srv/models"]  # fmt: skip


def start_fetch(host: str, revision: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["podman", "exec", host, *fetch_argv(revision)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def staged_bytes(host: str, revision: str) -> int:
    out = in_host(host, "du", "-sb", f"{MODEL_DIR}/.staging-{revision}", check=False).stdout
    return int(out.split()[0]) if out else 0


def current_revision(host: str) -> str:
    return in_host(host, "readlink", WEIGHTS).stdout.strip()


def pinned_to(revision: str, tmp_path: Path) -> Path:
    """Extra vars that pin the lab's model to ``revision`` (the inventory's models otherwise)."""
    models = yaml.safe_load((ROOT / "inventories/lab/group_vars/all/models.yml").read_text())
    models["fleet_models"][LAB_MODEL]["revision"] = revision
    override = tmp_path / f"pinned-{revision[:12]}.yml"
    override.write_text(yaml.safe_dump(models))
    return override


# make test: a download cut mid-file fails naming it and resumes from what was staged
# (tests/unit/test_weights_faults.py, a real HTTP server); a failed new revision leaving the
# previous one installed and current (tests/unit/test_weights.py); the disk filled under a
# fetch on the lab while its engine serves (below).
@pytest.mark.full
def test_mirror_unreachable_during_a_site_yml_fetch(chaos, revision_b, tmp_path):
    """site.yml's weights phase (the model_weights role) fetches revision B on engine02, and
    the mirror (the lab's source of weights, as a cache host is a fleet's) goes down in the
    middle of the download: the run fails naming it, keeps what it staged, and leaves the
    pinned revision current and its engine serving; once the mirror is back, the same run
    resumes from what was staged and completes."""
    host, serving = "engine02", pinned_revision()
    engine_pid = unit_show(host, "MainPID")["MainPID"]
    weights_run = ("site.yml", "--limit", host, "--tags", "weights",
                   "-e", f"@{pinned_to(revision_b, tmp_path)}")  # fmt: skip
    mirror = MIRROR_URL.split("/models", maxsplit=1)[0]
    with mirror_throttled(), clients() as load, ThreadPoolExecutor(1) as pool:
        run = pool.submit(playbook, *weights_run)
        # Preflight first (its length is the controller's), then the role's download.
        wait_until(
            lambda: run.done() or staged_bytes(host, revision_b) > 20e6,
            900,
            "the role's fetch under way",
        )
        assert not run.done(), f"the run ended first: {run.result().output[-3000:]}"
        wait_until(lambda: served_one(load), 60, "the load served a request")
        started = time.monotonic()
        in_host("router01", "systemctl", "stop", MIRROR_UNIT)
        try:
            failed = run.result()
            detected = time.monotonic() - started
            current_meanwhile = current_revision(host)
        finally:
            in_host("router01", "systemctl", "start", MIRROR_UNIT)
        kept = staged_bytes(host, revision_b)
        # The mirror is back: the same run again resumes from what was staged.
        resumed = playbook(*weights_run)
        recovered = time.monotonic() - started
    fetch_task = "Fetch and verify each model at its pinned revision"
    print(f"\nsite.yml with the mirror gone (exit {failed.returncode}, {failed.seconds:.0f} s):")
    print("\n".join(line for line in failed.output.splitlines() if mirror in line)[-1500:])
    print(f"{kept} bytes kept; the rerun: exit {resumed.returncode}, {resumed.seconds:.0f} s")
    try:
        assert failed.returncode != 0
        assert f"TASK [model_weights : {fetch_task}]" in failed.output
        assert mirror in failed.output, failed.output[-3000:]
        assert "Traceback" not in failed.output and "MODULE FAILURE" not in failed.output
        assert failed.recap()[host]["failed"] == 1, failed.recap()
        assert current_meanwhile == serving, "the pinned revision stays current"
        assert kept > 20e6, "what was fetched is kept for the next run"
        assert resumed.returncode == 0, resumed.output[-5000:]
        assert current_revision(host) == revision_b
        assert unit_show(host, "MainPID")["MainPID"] == engine_pid, "the engine kept serving"
    finally:
        # Back to the revision the inventory pins (installed: only the link moves).
        in_host(host, *fetch_argv(serving))
        in_host(
            host, "rm", "-rf", f"{MODEL_DIR}/{revision_b}", f"{MODEL_DIR}/.staging-{revision_b}"
        )
    assert current_revision(host) == serving
    row = record(
        "mirror down during site.yml's fetch",
        load.stats,
        detected,
        recovered,
        files_lost(host),
        f"the run fails naming {mirror}; {kept / 1e6:.0f} MB kept; the rerun resumed",
    )
    assert_bound(
        row,
        started,
        also="the run fails at the role's fetch naming the mirror, no traceback; "
        "the pinned revision current, its engine kept its PID; staged bytes kept; rerun passes",
    )


@contextlib.contextmanager
def small_model_disk(host: str) -> Iterator[None]:
    """/srv/models on a 1.8 GB tmpfs holding a copy of what is there (host-side mount in the
    container's own mount namespace: the container itself may not mount)."""
    script = (
        "mkdir -p /run/chaos-models && mount -t tmpfs -o size=1800m chaos /run/chaos-models"
        " && cp -dR --preserve=mode,ownership,timestamps /srv/models/. /run/chaos-models/"
        " && mount --bind /run/chaos-models /srv/models"
    )
    subprocess.run(
        ["nsenter", "-t", container_pid(host), "-m", "-p", "sh", "-c", script], check=True
    )
    try:
        yield
    finally:
        undo = "umount /srv/models; umount /run/chaos-models; rmdir /run/chaos-models"
        subprocess.run(
            ["nsenter", "-t", container_pid(host), "-m", "-p", "sh", "-c", undo], check=False
        )


def test_disk_full_during_a_fetch(chaos, revision_b):
    host, serving = "engine02", pinned_revision()
    engine_pid = unit_show(host, "MainPID")["MainPID"]
    with small_model_disk(host), mirror_throttled(), clients() as load:
        fetch = start_fetch(host, revision_b)
        wait_until(lambda: staged_bytes(host, revision_b) > 20e6, 60, "the fetch under way")
        # The fetch can get that far before the first completion ends (a fast controller):
        # the disk fills only once the load has served, so the fault falls inside it.
        wait_until(lambda: served_one(load), 60, "the load served a request")
        started = time.monotonic()
        # Something else (logs, a core dump) takes the rest of the disk mid-fetch.
        fill = "fallocate -l $(($(df -B1 --output=avail /srv/models | tail -1) - 1048576))"
        # cat stops at ENOSPC: the disk is then full to the last block.
        in_host(
            host,
            "sh",
            "-c",
            f"{fill} /srv/models/filler; cat /dev/zero > /srv/models/f2",
            check=False,
        )
        output, _ = fetch.communicate(timeout=300)
        detected = time.monotonic() - started
        staging_left = in_host(host, "ls", "-a", MODEL_DIR).stdout.split()
        current = current_revision(host)
        lost = files_lost(host)
        in_host(host, "rm", "-f", "/srv/models/filler", "/srv/models/f2")
        recovered = time.monotonic() - started
    print(f"\nfetch on a full disk (exit {fetch.returncode}): {output[-800:]}")
    assert fetch.returncode != 0
    assert "Traceback" not in output
    assert not [n for n in staging_left if n.startswith(".staging-")], staging_left
    assert current == serving
    assert unit_show(host, "MainPID")["MainPID"] == engine_pid, "the engine kept serving"
    row = record(
        "disk full during a fetch",
        load.stats,
        detected,
        recovered,
        lost,
        "the fetch fails naming the file; staging freed; the pinned revision serves",
    )
    assert_bound(
        row,
        started,
        also="the fetch failed, no traceback; no staging left; the pinned "
        "revision current; the engine kept its PID",
    )


def test_two_site_runs_at_once_the_second_is_refused(two_runs: TwoRuns):
    """A second operator (or a timer) starts site.yml while a run is under way: from the
    same checkout (the controller's lock refuses it) and from another (the lease does)."""
    refused, first = two_runs.second, two_runs.first
    print(f"\nthe refused run ({refused.seconds:.1f} s, exit {refused.returncode}):")
    print("\n".join(line for line in refused.output.splitlines() if "lock" in line)[-1500:])
    assert refused.returncode != 0
    assert f"ansible-playbook pid {two_runs.first_pid}" in refused.output
    assert ".deploy.lock" in refused.output
    assert "Traceback" not in refused.output
    # Refused before preflight's verdict: no host was touched, nothing changed.
    assert all(counts["changed"] == 0 for counts in refused.recap().values()), refused.recap()
    other = two_runs.other_checkout
    print(f"\nthe run from another checkout ({other.seconds:.1f} s, exit {other.returncode}):")
    print("\n".join(line for line in other.output.splitlines() if "lease" in line)[-1500:])
    assert other.returncode != 0
    assert "router01 holds the deploy lease of another run" in other.output
    assert f"ansible-playbook pid {two_runs.first_pid}" in other.output
    assert f"preflight_deploy_lease_break={two_runs.lease['id']}" in other.output
    assert all(counts["changed"] == 0 for counts in other.recap().values()), other.recap()
    assert first.returncode == 0, first.output[-3000:]
    assert all(counts["changed"] == 0 for counts in first.recap().values())
    assert two_runs.lease_after == {"router01": None, "router02": None}, "released at its end"
    row = record(
        "two site.yml runs at once",
        LoadStats(),
        refused.seconds,
        first.seconds,
        0,
        "the others (same checkout, another) are refused naming the first; it ends normally",
    )
    row.asserted = (
        "the same checkout's run refused by the lock, the other checkout's by the lease on "
        "both routers, each naming the first run (the lease's id to break it); neither changed "
        "anything; the first changed nothing and released the lease"
    )


def cgroup_v2() -> bool:
    return Path("/sys/fs/cgroup/cgroup.controllers").exists()


def memory_cgroup(name: str) -> Path:
    """The container's memory cgroup on this host (cgroup v1, podman's cgroupfs manager)."""
    for line in Path(f"/proc/{container_pid(name)}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return Path("/sys/fs/cgroup/memory") / path.lstrip("/")
    pytest.fail(f"{name}: no cgroup v1 memory controller on this host")


def v1_oom_kills(cgroup: Path) -> int:
    for line in (cgroup / "memory.oom_control").read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return 0


def unit_oom_kills(host: str) -> int:
    """The kernel's OOM kills in the engine unit's own cgroup (cgroup v2, as its systemd sees it)."""
    events = in_host(host, "cat", f"/sys/fs/cgroup/system.slice/{UNIT}/memory.events").stdout
    counts = dict(line.split() for line in events.splitlines())
    return int(counts.get("oom_kill", 0))


@contextlib.contextmanager
def memory_limited(host: str, comm: str, headroom: int) -> Iterator[Callable[[], int]]:
    """The engine under a memory limit ``headroom`` bytes above what it uses; yields a count
    of the OOM kills under that limit.

    On a cgroup v2 host (Debian 12's default) the container's systemd owns its cgroup tree:
    the limit is the engine unit's own ``MemoryMax=``, lowered at runtime and put back after,
    which is the bound the role sets from the plan. On cgroup v1 the memory controller is
    read-only inside the container, so the unit's ``MemoryMax=`` cannot be enforced there;
    the same kernel limit is set from the host on a child cgroup of the container's, holding
    the process named ``comm`` (the model worker).
    """
    if cgroup_v2():
        planned = unit_show(host, "MemoryMax")["MemoryMax"]
        usage = int(unit_show(host, "MemoryCurrent")["MemoryCurrent"])
        in_host(
            host, "systemctl", "set-property", "--runtime", UNIT, f"MemoryMax={usage + headroom}"
        )
        try:
            yield lambda: unit_oom_kills(host)
        finally:
            in_host(host, "systemctl", "set-property", "--runtime", UNIT, f"MemoryMax={planned}")
            # The runtime drop-in goes, so the unit's own drop-in from the role holds again.
            in_host(host, "rm", "-f", f"/run/systemd/system.control/{UNIT}.d/50-MemoryMax.conf")
            in_host(host, "systemctl", "daemon-reload")
            assert unit_show(host, "MemoryMax")["MemoryMax"] == planned
        return
    parent = memory_cgroup(host)
    child = parent / "vllm-fleet-chaos-oom"
    child.mkdir(exist_ok=True)
    worker = next(
        pid
        for pid in (parent / "cgroup.procs").read_text().split()
        if Path(f"/proc/{pid}/comm").read_text().strip() == comm
    )
    (child / "cgroup.procs").write_text(worker)
    # What it already holds may stay charged to the parent: the limit counts from here.
    usage = int((child / "memory.usage_in_bytes").read_text())
    (child / "memory.limit_in_bytes").write_text(str(usage + headroom))
    try:
        yield lambda: v1_oom_kills(child)
    finally:
        for pid in (child / "cgroup.procs").read_text().split():
            (parent / "cgroup.procs").write_text(pid)
        child.rmdir()


def long_prompts(stop: threading.Event) -> None:
    """Requests with long prompts straight to engine01: their activations need memory."""
    body = {"model": MODEL, "prompt": "word " * 1800, "max_tokens": 4}
    headers = {"Authorization": f"Bearer {engine_key()}"}
    while not stop.is_set():
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(
                f"{DIRECT['engine01']}/v1/completions", json=body, headers=headers, timeout=30
            )
        time.sleep(0.5)


# make test: an engine killed (SIGKILL above) takes the same restart and retry path.
@pytest.mark.full
def test_engine_oom_killed(chaos):
    host, url = "engine01", ENGINE_URLS["engine01"]
    before = int(unit_show(host, "NRestarts")["NRestarts"])
    stop = threading.Event()
    pressure = threading.Thread(target=long_prompts, args=(stop,), daemon=True)
    with clients() as load:
        time.sleep(3)
        with memory_limited(host, "VLLM::Worker", headroom=16 * 1024**2) as oom_kills:
            started = time.monotonic()
            pressure.start()
            try:
                wait_until(lambda: oom_kills() > 0, 60, "the kernel's OOM killer acts")
                killed = oom_kills()
            finally:
                stop.set()
                pressure.join(timeout=60)
        wait_until(lambda: workers().get(url) is not True, 30, "router ejects it")
        detected = time.monotonic() - started  # from the pressure's start: the kill is in it
        back_in_rotation(host, before)
        recovered = time.monotonic() - started
        time.sleep(3)
    row = record(
        "engine OOM-killed",
        load.stats,
        detected,
        recovered,
        files_lost(host),
        f"{killed} OOM kill(s) of the model worker; "
        + (
            "the unit's MemoryMax (cgroup v2)"
            if cgroup_v2()
            else "limit set from the host (cgroup v1)"
        ),
    )
    assert_bound(row, started, also="the kernel OOM-killed the worker; ejected, back in rotation")
