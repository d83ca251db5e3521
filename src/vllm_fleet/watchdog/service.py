"""The watchdog loop: observe every group, step its state machine, act, report.

One pass: probe all groups at once (threads, so one hung engine cannot hold up the others
past WatchdogSec) and read their units; step each group's machine; reconcile the routers
(one GET per router, joins and leaves only where they differ from what the machines
want); carry out restarts; update metrics; tell systemd (WATCHDOG=1, STATUS=...).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import httpx

from vllm_fleet import hold
from vllm_fleet.router_client import RouterClient, RouterError, RouterTarget, router_client
from vllm_fleet.sd_notify import notify
from vllm_fleet.watchdog import journal
from vllm_fleet.watchdog.config import WatchdogConfig
from vllm_fleet.watchdog.groups import GroupConfigError, GroupSpec, load_group
from vllm_fleet.watchdog.metrics import WatchdogMetrics
from vllm_fleet.watchdog.probe import (
    ProbeResult,
    engine_progress,
    judge_timeout,
    probe_completion,
)
from vllm_fleet.watchdog.state import Event, GroupMachine, Level, Policy, Restart, State
from vllm_fleet.watchdog.units import SystemctlUnits, UnitError, Units, UnitStatus

CONTROL_KEY_ENV = "VLLM_FLEET_ROUTER_CONTROL_KEY"
DEFAULT_CONFIG = Path("/etc/vllm-fleet/watchdog.json")


@dataclass
class Observation:
    unit: UnitStatus | None
    unit_error: str | None
    probe: ProbeResult
    measured: bool = True  # False: synthesized because the probe is still running


@dataclass
class GroupView:
    spec: GroupSpec
    machine: GroupMachine
    http: httpx.Client
    unit: UnitStatus | None = None
    unit_error: str | None = None  # logged when it changes, not every interval
    probe: ProbeResult | None = None
    registered: dict[str, bool] = field(default_factory=dict)
    inflight: Future[Observation] | None = None
    # Tokens the engine had processed at the end of the previous observation.
    progress: float | None = None
    held: bool = False  # an upgrade holds it out of the routers (vllm_fleet.hold)


@dataclass
class RouterView:
    target: RouterTarget
    client: RouterClient
    down: bool = False  # the last listing failed
    last_error: str | None = None  # logged once, not every interval


def policy_from(config: WatchdogConfig) -> Policy:
    return Policy(
        failure_threshold=config.failure_threshold,
        max_start_seconds=config.max_start_seconds,
        backoff_initial_seconds=config.backoff_initial_seconds,
        backoff_max_seconds=config.backoff_max_seconds,
        restart_budget=config.restart_budget,
        restart_window_seconds=config.restart_window_seconds,
    )


class Watchdog:
    def __init__(
        self,
        config: WatchdogConfig,
        specs: list[GroupSpec],
        units: Units,
        routers: list[tuple[RouterTarget, RouterClient]],
        metrics: WatchdogMetrics,
        *,
        clock: Callable[[], float] = time.monotonic,
        act: bool = True,
        out: TextIO | None = None,
    ) -> None:
        """``act=False`` observes only: no restarts, no router changes, no events."""
        self.config = config
        self.units = units
        self.metrics = metrics
        self.clock = clock
        self.act = act
        self.out = out
        policy = policy_from(config)
        now = clock()
        self.groups = [
            GroupView(spec, GroupMachine(policy, now), httpx.Client(timeout=_probe_timeout(config)))
            for spec in specs
        ]
        self.routers = [RouterView(target, client) for target, client in routers]
        self._pool = ThreadPoolExecutor(max_workers=max(2, len(specs)), thread_name_prefix="probe")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for view in self.groups:
            view.http.close()
        for router in self.routers:
            router.client.close()

    # -- one pass ---------------------------------------------------------------------

    def run_pass(self) -> None:
        observations = self._observe()
        now = self.clock()
        restarts: list[GroupView] = []
        for view in self.groups:
            seen = observations[view.spec.group]
            if seen.unit_error and seen.unit_error != view.unit_error:
                self._emit("warning", "unit_unknown", seen.unit_error, view)
            view.unit_error = seen.unit_error
            view.unit = seen.unit or view.unit or UnitStatus("unknown")
            view.probe = seen.probe
            if seen.measured:
                self.metrics.probe_seconds.labels(group=view.spec.group).observe(seen.probe.seconds)
            for action in view.machine.step(now, seen.probe, view.unit.active_state):
                if isinstance(action, Event):
                    self._emit(action.level, action.name, action.message, view, **action.fields)
                elif isinstance(action, Restart):
                    restarts.append(view)
            # Join and Leave need nothing here: the reconcile below follows should_register.
        self._reconcile()
        for view in restarts:
            self._restart(view)
        for view in self.groups:
            machine = view.machine
            self.metrics.set_state(view.spec.group, machine.state, machine.failures)

    def _observe(self) -> dict[str, Observation]:
        submitted: dict[str, Future[Observation]] = {}
        for view in self.groups:
            if view.inflight is None or view.inflight.done():
                view.inflight = self._pool.submit(self._observe_group, view)
                submitted[view.spec.group] = view.inflight
        wait(submitted.values(), timeout=2 * self.config.probe_timeout_seconds + 1)
        observations = {}
        for view in self.groups:
            future = submitted.get(view.spec.group)
            if future is not None and future.done() and future.exception() is not None:
                crashed = ProbeResult.failed(f"observing crashed: {future.exception()!r}")
                observations[view.spec.group] = Observation(None, None, crashed, measured=False)
            elif future is not None and future.done():
                observations[view.spec.group] = future.result()
            else:
                # Counted as a failure; no second probe while the first hangs.
                failed = ProbeResult.failed("the previous probe has not returned")
                observations[view.spec.group] = Observation(None, None, failed, measured=False)
        return observations

    def _observe_group(self, view: GroupView) -> Observation:
        unit, unit_error = None, None
        try:
            unit = self.units.status(view.spec.unit)
        except UnitError as err:
            unit_error = str(err)
        spec = view.spec
        probe = probe_completion(
            view.http,
            spec.probe_url,
            api_key=spec.api_key,
            served_name=spec.served_name,
            prompt=self.config.probe_prompt,
            max_tokens=self.config.probe_max_tokens,
        )
        # Progress since the previous observation tells a busy engine from a hung one; a
        # short timeout, so a hung API server delays detection by seconds, not a probe.
        before, view.progress = view.progress, engine_progress(view.http, spec.probe_url, 2.0)
        if not probe.ok:
            probe = judge_timeout(probe, before, view.progress)
        return Observation(unit, unit_error, probe)

    def _reconcile(self) -> None:
        for router in self.routers:
            name = router.target.url
            try:
                listed = set(router.client.workers())
            except RouterError as err:
                router.down = True
                self._router_failed(router, err)
                continue
            if router.down:
                router.down, router.last_error = False, None
                self._emit("info", "router_ok", f"router {name} answers again", router=name)
            for view in self.groups:
                present = view.spec.advertise_url in listed
                if self.act and present != self._wants_registered(view):
                    try:
                        present = self._converge(router, view)
                    except RouterError as err:
                        self._router_failed(router, err, view)
                view.registered[name] = present
                self.metrics.registered.labels(group=view.spec.group, router=name).set(present)

    def _wants_registered(self, view: GroupView) -> bool:
        """The state machine's wish, unless an upgrade holds the group out of the routers."""
        held = hold.is_held(view.spec.group)
        if held != view.held:
            view.held = held
            message = "held out of the routers" if held else "hold lifted"
            self._emit("info", "held" if held else "unheld", message, view)
        return view.machine.should_register and not held

    def _converge(self, router: RouterView, view: GroupView) -> bool:
        """Join or leave as wanted; returns whether the group is now listed."""
        spec, name = view.spec, router.target.url
        if not self._wants_registered(view):
            if router.client.leave(spec.advertise_url):
                self._emit("info", "left", f"removed from router {name}", view, router=name)
            return False
        # Checked again right before joining: a stopping engine has just left by itself.
        try:
            if self.units.status(spec.unit).active_state != "active":
                return False
        except UnitError:
            return False
        if router.client.join(spec.advertise_url, spec.api_key, spec.served_name):
            self._emit("info", "joined", f"added to router {name}", view, router=name)
        return True

    def _router_failed(
        self, router: RouterView, err: RouterError, view: GroupView | None = None
    ) -> None:
        self.metrics.router_errors.labels(router=router.target.url).inc()
        if str(err) != router.last_error:
            router.last_error = str(err)
            self._emit("warning", "router_error", str(err), view, router=router.target.url)

    def _restart(self, view: GroupView) -> None:
        if not self.act:
            return
        try:
            self.units.restart(view.spec.unit)
        except UnitError as err:
            self._emit("error", "restart_failed", str(err), view)
            return
        self.metrics.restarts.labels(group=view.spec.group).inc()

    def _emit(
        self, level: Level, event: str, message: str, view: GroupView | None = None, **fields: Any
    ) -> None:
        if not self.act:
            return
        group = view.spec.group if view else None
        state = view.machine.state.value if view else None
        journal.emit(level, event, message, group=group, state=state, out=self.out, **fields)

    # -- reporting and the loop ---------------------------------------------------------

    def all_healthy(self) -> bool:
        return all(view.machine.state == State.HEALTHY for view in self.groups)

    def snapshot(self) -> dict[str, Any]:
        groups = {}
        for view in self.groups:
            probe = view.probe
            groups[view.spec.group] = {
                "state": view.machine.state.value,
                "unit": view.unit.active_state if view.unit else None,
                "consecutive_failures": view.machine.failures,
                "probe": None
                if probe is None
                else {"ok": probe.ok, "seconds": round(probe.seconds, 3), "detail": probe.detail},
                "registered": dict(view.registered),
                "held": view.held,
            }
        return {"groups": groups}

    def status_line(self) -> str:
        states = " ".join(f"{v.spec.group}={v.machine.state.value}" for v in self.groups)
        down = sum(1 for r in self.routers if r.down)
        routers = f"routers {len(self.routers) - down}/{len(self.routers)} ok"
        return f"{states or 'no groups'}; {routers}"

    def run(self, stop: threading.Event, notify: Callable[[str], object] = notify) -> None:
        ready = "READY=1\n"
        while not stop.is_set():
            started = time.monotonic()
            self.run_pass()
            with contextlib.suppress(OSError):
                notify(f"{ready}WATCHDOG=1\nSTATUS={self.status_line()}")
            ready = ""
            stop.wait(max(0.0, self.config.interval_seconds - (time.monotonic() - started)))


def _probe_timeout(config: WatchdogConfig) -> httpx.Timeout:
    return httpx.Timeout(config.probe_timeout_seconds)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="vllm-fleet watchdog",
        description="Probe this host's engine groups, restart hung ones, keep routers in step.",
    )
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument(
        "--once",
        action="store_true",
        help="one read-only pass (no restarts, no router changes): print each group's "
        "state as JSON; exit 0 if every group is healthy",
    )
    args = parser.parse_args(argv)
    try:
        config = WatchdogConfig.model_validate_json(args.config.read_text())
        specs = [load_group(config, group) for group in config.groups]
    except (OSError, ValueError, GroupConfigError) as err:
        print(f"watchdog: {args.config}: {err}", file=sys.stderr)
        return 2
    control_key = os.environ.get(CONTROL_KEY_ENV) or None
    routers = [(target, router_client(target, control_key)) for target in config.routers]
    metrics = WatchdogMetrics()
    watchdog = Watchdog(config, specs, SystemctlUnits(), routers, metrics, act=not args.once)
    try:
        if args.once:
            watchdog.run_pass()
            print(json.dumps(watchdog.snapshot(), indent=2, sort_keys=True))
            return 0 if watchdog.all_healthy() else 1
        stop_metrics = metrics.serve(config.metrics_host, config.metrics_port)
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda _signum, _frame: stop.set())
        try:
            watchdog.run(stop)
        finally:
            stop_metrics()
        return 0
    finally:
        watchdog.close()
