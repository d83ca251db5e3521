"""What the lab's fault tests share: the router's view, the units, the watchdog's metrics."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import yaml

from tests.support.lab import ROOT, in_host
from vllm_fleet.lab.client_load import ClientLoad, LoadStats
from vllm_fleet.lab.paths import LAB_ROUTER_URL
from vllm_fleet.router.control_keys import host_control_key

ROUTER = LAB_ROUTER_URL
ROUTERS = ("router01", "router02")
# Their own addresses (lab/lab_vars.yml): the controller reaches the lab bridge, but cannot
# resolve the lab's host names.
ROUTER_ADDRESSES = {"router01": "10.89.0.10", "router02": "10.89.0.11"}
VIP = "10.89.0.100"  # inventories/lab fleet_router.vip
# Routers list engines by address (the inventory's fleet_address), never by name.
ENGINE_ADDRESSES = {"engine01": "10.89.0.21", "engine02": "10.89.0.22"}
ENGINE_URLS = {host: f"http://{address}:8100" for host, address in ENGINE_ADDRESSES.items()}
# A host on the lab network that is none of the fleet's (the ``rogue`` fixture).
ROGUE = "vf-rogue"
ROGUE_ADDRESS = "10.89.0.66"
DIRECT = {"engine01": "http://127.0.0.1:8101", "engine02": "http://127.0.0.1:8102"}
UNIT = "vllm-engine@g0.service"
MODEL = "smollm2"
# The bracket keeps pkill from matching the shell that runs it.
KILL_VLLM = "pkill -KILL -f 'bin/[v]llm serve'; pkill -KILL '^VLLM::'"
_WATCHDOG = yaml.safe_load((ROOT / "inventories/lab/group_vars/all/fleet.yml").read_text())[
    "fleet_watchdog"
]
INTERVAL = float(_WATCHDOG["interval_seconds"])
PROBE_TIMEOUT = float(_WATCHDOG["probe_timeout_seconds"])
THRESHOLD = int(_WATCHDOG["failure_threshold"])
BUDGET = int(_WATCHDOG["restart_budget"])
# Each failed observation: the probe's timeout, then 2 s for the engine's progress counters.
DETECTION_BOUND = THRESHOLD * (INTERVAL + PROBE_TIMEOUT + 2) + 10
START_BOUND = 300


def secret(name: str) -> str:
    return (ROOT / ".lab/secrets" / name).read_text().strip()


def control_generation(host: str) -> int:
    """The engine host's control-key generation in the lab (inventories/lab/group_vars/engines.yml)."""
    path = ROOT / ".lab/secrets" / f"control_key_generation_{host}"
    return int(path.read_text().strip()) if path.exists() else 0


def control_key_of(host: str) -> str:
    """The control key the engine host holds (vllm_fleet.router.control_keys)."""
    return host_control_key(secret("router_control_key"), host, control_generation(host))


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
    # Empty while the watchdog is down (restarting): no samples, not an error.
    text = in_host(host, "python3", "-c", script, check=False).stdout
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


def vip_holder() -> str | None:
    """The router host whose interface carries the VIP now (None while none does); a copy on
    a draining router's loopback does not count (that router does not answer ARP for it)."""
    for host in ROUTERS:
        shown = in_host(host, "ip", "-o", "-4", "addr", "show", "to", f"{VIP}/32", check=False)
        if any(line.split()[1] != "lo" for line in shown.stdout.splitlines() if line.strip()):
            return host
    return None


def both_in_rotation() -> bool:
    seen = workers()
    return all(seen.get(url) is True for url in ENGINE_URLS.values())


def load() -> ClientLoad:
    return ClientLoad(ROUTER, secret("router_client_key"), MODEL, plain=3, streams=1)


def report(fault: str, stats: LoadStats, **timings: float) -> None:
    spent = ", ".join(f"{k} {v:.1f} s" for k, v in timings.items())
    print(f"\n[{fault}] {spent}; {stats.line()}")
