"""How exposed the fleet's services are on the converged lab: systemd's own sandboxing score
for each unit, and every listening TCP socket on every host.

The scores are systemd-analyze's "overall exposure level" (0 = fully sandboxed, 10 = none);
the target for the engine, router and watchdog units is at most 4.0 ("OK").
"""

from __future__ import annotations

import ipaddress
import re

import httpx

from tests.lab.faults import (
    ENGINE_ADDRESSES,
    ENGINE_URLS,
    ROUTER_ADDRESSES,
    control_key_of,
    secret,
)
from tests.support.lab import ENGINES, in_host
from tests.support.reach import probe_command

ROUTER_HOST = "router01"
ROUTER_HOSTS = ("router01", "router02")
UNITS = {
    **{host: ["vllm-engine@g0.service", "vllm-fleet-watchdog.service"] for host in ENGINES},
    **{host: ["vllm-fleet-router.service"] for host in ROUTER_HOSTS},
}
# Behind the VIP the router's client port listens on every address of its host (the VIP
# comes and goes; the engine hosts reach each router at its own address): allowed only
# there, and only where every address of the host is private or loopback.
ROUTER_PORT = 30000
TARGET = 4.0
EXPOSURE = re.compile(r"Overall exposure level for \S+: (?P<score>\d+\.\d+) (?P<word>\w+)")
# Ports each engine host serves the fleet on: only on its private address, never loopback.
ENGINE_HOST_PORTS = {8100: "engine g0", 9410: "watchdog metrics", 9100: "node exporter"}


def exposure(host: str, unit: str) -> tuple[float, str]:
    out = in_host(host, "systemd-analyze", "security", "--no-pager", unit).stdout
    match = EXPOSURE.search(out)
    assert match, out[-500:]
    return float(match["score"]), match["word"]


def listeners(host: str) -> list[tuple[str, int, str]]:
    """(address, port, process name) of every listening TCP socket on host."""
    rows = []
    for line in in_host(host, "ss", "-ltnpH").stdout.splitlines():
        fields = line.split()
        address, _, port = fields[3].rpartition(":")
        process = re.search(r'users:\(\("([^"]+)"', line)
        rows.append((address.strip("[]"), int(port), process[1] if process else "?"))
    return rows


def host_addresses(host: str) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """Every address on every interface of host (a wildcard listener's reach)."""
    out = in_host(host, "ip", "-o", "addr", "show").stdout
    return [ipaddress.ip_interface(line.split()[3]).ip for line in out.splitlines()]


def private_address(host: str) -> str:
    route = in_host(host, "ip", "-4", "-o", "route", "get", "1.1.1.1").stdout
    match = re.search(r"\bsrc (\S+)", route)
    assert match, route
    return match[1]


def test_unit_sandboxing_scores_meet_the_target(fresh_lab):
    rows = [(host, unit, *exposure(host, unit)) for host, units in UNITS.items() for unit in units]
    print("\nsystemd-analyze security (overall exposure, 0-10, target <= 4.0):")
    for host, unit, score, word in rows:
        print(f"  {host:9} {unit:32} {score:4.1f} {word}")
    assert all(score <= TARGET for _h, _u, score, _w in rows), rows


def test_every_listener_is_private_or_loopback(fresh_lab):
    print("\nlistening TCP sockets:")
    for host in UNITS:
        private = private_address(host)
        assert ipaddress.ip_address(private).is_private, (host, private)
        found = listeners(host)
        for address, port, process in found:
            print(f"  {host:9} {address}:{port} {process}")
        wildcard = [row for row in found if row[0] in ("0.0.0.0", "::", "*")]
        if host in ROUTER_HOSTS:
            assert [port for _a, port, _p in wildcard] in ([], [ROUTER_PORT]), (host, wildcard)
            assert all(a.is_private for a in host_addresses(host)), (host, host_addresses(host))
            wildcard = []
        assert not wildcard, f"{host}: listening on every interface: {wildcard}"
        for address, port, process in found:
            if address in ("0.0.0.0", "::", "*"):
                continue
            assert address == private or ipaddress.ip_address(address).is_loopback, (
                host,
                address,
                port,
                process,
            )


def test_engines_listen_only_where_the_router_reaches_them(fresh_lab):
    router_sees = in_host(ROUTER_HOST, "getent", "ahostsv4", *ENGINES).stdout
    for host in ENGINES:
        private = private_address(host)
        assert re.search(rf"^{re.escape(private)}\s+STREAM {host}(\.\S+)?$", router_sees, re.M), (
            router_sees
        )
        ports = {port: address for address, port, _p in listeners(host)}
        for port, what in ENGINE_HOST_PORTS.items():
            assert ports.get(port) == private, (host, what, ports)


def test_the_router_runs_unprivileged_and_its_keys_stay_root_only(fresh_lab):
    """The router's own checks (its Molecule scenario runs in make test-all): every process
    of its unit runs as vllm-router, its keys live in a root-only file and reach no process
    environment of the unit, its settings file is readable by its group and holds no key."""
    unit = "vllm-fleet-router.service"
    keys = [secret(name) for name in ("router_client_key", "router_control_key")]
    rows = in_host(ROUTER_HOST, "ps", "-eo", "pid=,user:32=,unit:64=").stdout.splitlines()
    processes = [(pid, user) for pid, user, owner in map(str.split, rows) if owner == unit]
    main = in_host(ROUTER_HOST, "systemctl", "show", "-p", "MainPID", "--value", unit).stdout
    assert main.strip() in [pid for pid, _ in processes], processes
    assert {user for _, user in processes} == {"vllm-router"}, processes
    for pid, _ in processes:
        environ = in_host(ROUTER_HOST, "cat", f"/proc/{pid}/environ").stdout
        assert not any(key in environ for key in keys), f"a key in /proc/{pid}/environ"
    modes = {
        path: in_host(ROUTER_HOST, "stat", "-c", "%U %G %a", path).stdout.split()
        for path in (
            "/etc/vllm-fleet/router.env",
            "/etc/vllm-fleet/router-control-keys.json",
            "/etc/vllm-fleet/router.json",
        )
    }
    assert modes == {
        "/etc/vllm-fleet/router.env": ["root", "root", "600"],
        "/etc/vllm-fleet/router-control-keys.json": ["root", "root", "600"],
        "/etc/vllm-fleet/router.json": ["root", "vllm-router", "640"],
    }
    settings = in_host(ROUTER_HOST, "cat", "/etc/vllm-fleet/router.json").stdout
    assert settings and not any(key in settings for key in keys)


def test_the_engine_user_never_holds_the_routers_control_key(fresh_lab):
    """Whoever holds the control key can add a worker and receive every client's prompts.
    vLLM (and code a model ships) runs as the engine's user, as engine-run does: no process of
    the unit carries the key, the group's env file does not, and the root-only file that does
    is unreadable to that user. Joining and leaving the routers is root's (ExecStartPost=+,
    ExecStop=+); the engine is in both routers all the same."""
    for host in ENGINES:
        # The host's own key (vllm_fleet.router.control_keys); the fleet's never comes here.
        key = control_key_of(host)
        rows = in_host(host, "ps", "-eo", "pid=,user:32=,unit:64=").stdout.splitlines()
        engine = [(pid, user) for pid, user, unit in map(str.split, rows) if unit == UNITS[host][0]]
        assert len(engine) >= 2 and {user for _, user in engine} == {"vllm"}, (host, engine)
        for pid, _ in engine:
            environ = in_host(host, "cat", f"/proc/{pid}/environ", check=False).stdout
            assert key not in environ, f"{host}: the control key in /proc/{pid}/environ"
        assert key not in in_host(host, "cat", "/etc/vllm-fleet/engines/g0.env").stdout
        control = "/etc/vllm-fleet/router-control.env"
        assert in_host(host, "stat", "-c", "%U %G %a", control).stdout.split() == [
            "root", "root", "600",
        ]  # fmt: skip
        as_vllm = in_host(host, "runuser", "-u", "vllm", "--", "cat", control, check=False)
        assert as_vllm.returncode != 0 and "Permission denied" in as_vllm.stderr
        assert key in in_host(host, "cat", control).stdout
    assert all(ENGINE_URLS[h] in workers_of(r) for h in ENGINES for r in ROUTER_HOSTS)


def workers_of(router: str) -> list[str]:
    """The worker URLs one router lists (asked at its own address, with the control key)."""
    headers = {"Authorization": f"Bearer {secret('router_control_key')}"}
    url = f"http://{ROUTER_ADDRESSES[router]}:{ROUTER_PORT}/workers"
    return [w["url"] for w in httpx.get(url, headers=headers, timeout=5).json()["workers"]]


def test_the_kernel_kills_an_engine_before_what_restarts_it(fresh_lab):
    """Every process of an engine unit (engine-run, vLLM's API server, its engine core and
    workers) carries the unit's OOMScoreAdjust (vllm_engine_oom_score_adjust, 500), and the
    watchdog that restarts them keeps the default 0: under memory pressure the kernel picks
    an engine first."""
    for host in ENGINES:
        rows = in_host(host, "ps", "-eo", "pid=,oomadj=,unit:64=,comm=").stdout.splitlines()
        by_unit: dict[str, list[tuple[str, int]]] = {}
        for _pid, adjust, unit, command in (row.split(None, 3) for row in rows):
            by_unit.setdefault(unit, []).append((command, int(adjust)))
        engine = by_unit.get("vllm-engine@g0.service", [])
        assert len(engine) >= 2, (host, engine)  # engine-run and vLLM at least
        assert {adjust for _, adjust in engine} == {500}, (host, engine)
        watchdog = by_unit.get("vllm-fleet-watchdog.service", [])
        assert watchdog and {adjust for _, adjust in watchdog} == {0}, (host, watchdog)


def reach(host: str, url: str) -> str:
    return in_host(host, "sh", "-c", probe_command(url)).stdout.strip()


def test_engines_answer_the_routers_and_drop_any_other_host(fresh_lab, rogue):
    """vLLM's key guards /v1 only: /invocations (inference), /pause, /tokenize and /metrics
    answer whoever connects. The engine firewall lets in the routers, Prometheus and the host
    itself; a host on the same network that is none of those gets no answer at all. The
    metrics ports (watchdog, node exporter) answer Prometheus's host."""
    for host, address in ENGINE_ADDRESSES.items():
        for path in ("/health", "/invocations", "/pause", "/v1/models"):
            assert reach(rogue, f"http://{address}:8100{path}") == "dropped", (host, path)
        for router in ROUTER_HOSTS:
            assert reach(router, f"http://{address}:8100/health") == "open", (router, host)
        assert reach(host, f"http://{address}:8100/health") == "open"
        # The metrics ports answer the monitoring host (the attack matrix tries the others).
        for port in (9410, 9100):
            assert reach("router01", f"http://{address}:{port}/metrics") == "open", (host, port)
