"""Taking one engine group out of rotation, and putting it back.

``drain``: hold the group (see ``hold``), remove it from every router, then wait until
the engine has no request running or waiting (or a timeout: the engine's own
``--shutdown-timeout`` covers the rest when it is stopped). ``release``: lift the hold,
add the group to every router and wait until each router lists it.

Run by an upgrade (``vllm-fleet traffic drain|release``) on the engine's host, as root:
the keys come from the group's root-only env file, never from the command line.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from vllm_fleet.engine.config import EngineConfig, advertise_url, engine_trust, probe_url
from vllm_fleet.router import hold
from vllm_fleet.router.client import RouterError, normalize_url, router_client
from vllm_fleet.verify.engine_metrics import parse_families, value

IN_FLIGHT = ("vllm:num_requests_running", "vllm:num_requests_waiting")
ROUTER_TIMEOUT = 5.0


class TrafficError(Exception):
    """The group could not be moved out of or into rotation; the message says where."""


@dataclass
class DrainResult:
    group: str
    left: list[str]  # routers that listed the group and no longer do
    seconds: float
    idle: bool  # nothing running or waiting when it returned
    in_flight: float | None  # at the last reading (None: /metrics did not answer)


def in_flight(client: httpx.Client, base_url: str) -> float | None:
    """Requests running plus waiting, from the engine's /metrics; None if unreadable."""
    try:
        response = client.get(f"{base_url}/metrics")
        response.raise_for_status()
    except httpx.HTTPError:
        return None
    families = parse_families(response.text)
    readings = [value(families, name) for name in IN_FLIGHT]
    if any(reading is None for reading in readings):
        return None
    return sum(r for r in readings if r is not None)


def drain(
    cfg: EngineConfig,
    control_key: str | None,
    timeout: float,
    reason: str,
    *,
    min_peers: int = 0,
    poll: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> DrainResult:
    """``min_peers``: other workers of the model every router must be serving first."""
    started = clock()
    url = advertise_url(cfg)
    # One client per router for the whole wait: sglang-router removes a worker
    # asynchronously (202), so the listing is polled until the worker is gone.
    clients = {t.url: router_client(t, control_key, ROUTER_TIMEOUT) for t in cfg.routers}
    left: list[str] = []
    try:
        for name, client in clients.items():
            peers = [u for u in client.serving(cfg.served_name) if u != normalize_url(url)]
            if len(peers) < min_peers:
                raise TrafficError(
                    f"not draining group {cfg.group}: router {name} serves {cfg.served_name} "
                    f"on {len(peers)} other engine(s) ({', '.join(peers) or 'none'}), "
                    f"and at least {min_peers} must keep serving"
                )
        hold.hold(cfg.group, reason)
        for name, client in clients.items():
            if client.leave(url):
                left.append(name)
        listing = set(clients)
        reading: float | None = None
        with httpx.Client(timeout=2.0, verify=engine_trust(cfg)) as http:
            while True:
                listing = {n for n, c in clients.items() if normalize_url(url) in c.workers()}
                reading = in_flight(http, probe_url(cfg))
                if not listing and reading == 0:
                    return DrainResult(cfg.group, left, clock() - started, True, 0.0)
                if clock() - started >= timeout:
                    break
                sleep(poll)
    except RouterError as err:
        raise TrafficError(f"group {cfg.group}: could not leave the routers: {err}") from None
    finally:
        for client in clients.values():
            client.close()
    if listing:
        raise TrafficError(
            f"group {cfg.group}: still listed by {', '.join(sorted(listing))} "
            f"{timeout:.0f} s after leaving"
        )
    return DrainResult(cfg.group, left, clock() - started, False, reading)


def release(
    cfg: EngineConfig,
    engine_key: str,
    control_key: str | None,
    timeout: float,
    *,
    poll: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Seconds until every router listed the group again."""
    started = clock()
    hold.release(cfg.group)
    url = advertise_url(cfg)
    # One client per router for the whole wait: sglang-router adds a worker asynchronously
    # and its client remembers the add it queued, so polling does not queue it again.
    clients = {t.url: router_client(t, control_key, ROUTER_TIMEOUT) for t in cfg.routers}
    pending = set(clients)
    try:
        while pending:
            for name in sorted(pending):
                try:
                    clients[name].join(url, engine_key, cfg.served_name)
                    if normalize_url(url) in clients[name].workers():
                        pending.discard(name)
                except RouterError as err:
                    if clock() - started >= timeout:
                        raise TrafficError(f"group {cfg.group}: could not rejoin: {err}") from None
            if pending and clock() - started >= timeout:
                raise TrafficError(
                    f"group {cfg.group}: not listed by {', '.join(sorted(pending))} "
                    f"within {timeout:.0f} s of rejoining"
                )
            if pending:
                sleep(poll)
    finally:
        for client in clients.values():
            client.close()
    return clock() - started
