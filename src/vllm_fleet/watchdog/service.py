"""The watchdog loop: observe every group, step its state machine, act, report.

One pass: re-read each group's settings (a new served name, port or key is followed, not
probed under the old ones); probe all groups at once (threads, so one hung engine cannot
hold up the others past WatchdogSec) and read their units; step each group's machine;
reconcile the routers (one GET per router, joins and leaves only where they differ from
what the machines want); carry out restarts; update metrics; tell systemd (WATCHDOG=1,
STATUS=...).

Only the groups' own settings are followed: a change to watchdog.json itself (groups,
routers, policy, metrics address) restarts the service (roles/engine_watchdog does), as
do the router control key in its environment and a new agent build.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
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

from vllm_fleet.router import hold
from vllm_fleet.router.client import RouterClient, RouterError, RouterTarget, router_client
from vllm_fleet.sd_notify import notify
from vllm_fleet.watchdog import journal
from vllm_fleet.watchdog.config import WatchdogConfig
from vllm_fleet.watchdog.groups import GroupConfigError, GroupSpec, load_group, probe_client
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
    spec: GroupSpec | None = None  # the settings it was made with


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
    inflight_spec: GroupSpec | None = None  # the settings the observation in flight uses
    # Clients replaced by a settings change (another scheme or CA), closed once no probe uses them.
    stale_clients: list[httpx.Client] = field(default_factory=list)
    # Tokens the engine had processed at the end of the previous observation.
    progress: float | None = None
    held: bool = False  # an upgrade holds it out of the routers (vllm_fleet.router.hold)
    settings_error: str | None = None  # why its settings cannot be read; logged once
    # Its settings file is gone: the group left the inventory (vllm_engine removes the file
    # after stopping it). Watched no more until the file is back: never restarted, never joined.
    removed: bool = False
    # Advertise URL -> routers still to take it off: registrations made with settings the
    # group no longer has (another URL, served name or key).
    retired: dict[str, set[str]] = field(default_factory=dict)


@dataclass
class RouterView:
    target: RouterTarget
    client: RouterClient
    down: bool = False  # the last listing failed
    last_error: str | None = None  # logged once, not every interval
    # This router's reconciliation, run beside the other routers': one that hangs holds up
    # neither the others nor the probes (it is skipped until its calls time out).
    inflight: Future[None] | None = None


# What a router's registration carries: a change to any of these replaces it.
REGISTRATION_FIELDS = ("advertise_url", "served_name", "api_key")


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
            GroupView(spec, GroupMachine(policy, now), probe_client(spec, _probe_timeout(config)))
            for spec in specs
        ]
        self.routers = [RouterView(target, client) for target, client in routers]
        self._pool = ThreadPoolExecutor(max_workers=max(2, len(specs)), thread_name_prefix="probe")
        self._router_pool = ThreadPoolExecutor(
            max_workers=max(1, len(self.routers)), thread_name_prefix="router"
        )
        self._emitting = threading.Lock()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._router_pool.shutdown(wait=False, cancel_futures=True)
        for view in self.groups:
            view.http.close()
        for router in self.routers:
            router.client.close()

    # -- one pass ---------------------------------------------------------------------

    def run_pass(self) -> None:
        self._reload_settings()
        observations = self._observe()
        now = self.clock()
        restarts: list[GroupView] = []
        for view in self.groups:
            seen = observations[view.spec.group]
            if seen.unit_error and seen.unit_error != view.unit_error:
                self._emit("warning", "unit_unknown", seen.unit_error, view)
            view.unit_error = seen.unit_error
            view.unit = seen.unit or view.unit or UnitStatus("unknown")
            if view.removed:
                continue
            if seen.spec != view.spec:
                # Made with settings replaced since (a probe that hung across the change):
                # evidence neither way, like the failures settings_changed dropped.
                continue
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
            self.metrics.hold_age.labels(group=view.spec.group).set(_hold_age(view.spec.group))

    def _observe(self) -> dict[str, Observation]:
        submitted: dict[str, Future[Observation]] = {}
        for view in self.groups:
            if view.inflight is None or view.inflight.done():
                while view.stale_clients:
                    view.stale_clients.pop().close()
                view.inflight_spec = view.spec
                view.inflight = self._pool.submit(self._observe_group, view, view.spec, view.http)
                submitted[view.spec.group] = view.inflight
        wait(submitted.values(), timeout=2 * self.config.probe_timeout_seconds + 1)
        observations = {}
        for view in self.groups:
            future, spec = submitted.get(view.spec.group), view.inflight_spec
            if future is not None and future.done() and future.exception() is not None:
                crashed = ProbeResult.failed(f"observing crashed: {future.exception()!r}")
                observations[view.spec.group] = Observation(None, None, crashed, False, spec)
            elif future is not None and future.done():
                observations[view.spec.group] = future.result()
            else:
                # Counted as a failure; no second probe while the first hangs.
                failed = ProbeResult.failed("the previous probe has not returned")
                observations[view.spec.group] = Observation(None, None, failed, False, spec)
        return observations

    def _observe_group(self, view: GroupView, spec: GroupSpec, http: httpx.Client) -> Observation:
        """Observe with ``spec`` and its client, current when it began (they may change)."""
        unit, unit_error = None, None
        try:
            unit = self.units.status(spec.unit)
        except UnitError as err:
            unit_error = str(err)
        probe = probe_completion(
            http,
            spec.probe_url,
            api_key=spec.api_key,
            served_name=spec.served_name,
            prompt=self.config.probe_prompt,
            max_tokens=self.config.probe_max_tokens,
        )
        # Progress since the previous observation tells a busy engine from a hung one; a
        # short timeout, so a hung API server delays detection by seconds, not a probe.
        before, view.progress = view.progress, engine_progress(http, spec.probe_url, 2.0)
        if not probe.ok:
            probe = judge_timeout(probe, before, view.progress)
        return Observation(unit, unit_error, probe, spec=spec)

    # -- settings ---------------------------------------------------------------------

    def _reload_settings(self) -> None:
        """Follow each group's settings files, so a new model, port or key is probed as such.

        Read every pass rather than on an mtime change: two small files, and no edit within
        one timestamp tick can slip by. A file that cannot be read keeps the last good
        settings (the engine, started on readable ones, still runs them).
        """
        for view in self.groups:
            present = (self.config.engine_config_dir / f"{view.spec.group}.json").exists()
            if present == view.removed:
                view.removed = not present
                if view.removed:
                    message = "its settings file is gone (left the inventory): not watched"
                    self._emit("info", "removed", message, view)
                else:
                    self._emit("info", "settings_back", "its settings file is back", view)
            if view.removed:
                continue
            try:
                spec = load_group(self.config, view.spec.group)
            except GroupConfigError as err:
                if str(err) != view.settings_error:
                    view.settings_error = str(err)
                    message = f"{err}; still probing with the last settings read"
                    self._emit("warning", "settings_unreadable", message, view)
                continue
            if view.settings_error is not None:
                view.settings_error = None
                if spec == view.spec:
                    self._emit("info", "settings_ok", "settings readable again, unchanged", view)
            if spec != view.spec:
                self._adopt(view, spec)

    def _adopt(self, view: GroupView, spec: GroupSpec) -> None:
        old, view.spec = view.spec, spec
        changed = [
            f.name
            for f in dataclasses.fields(spec)
            if getattr(old, f.name) != getattr(spec, f.name)
        ]
        # Old and new values for the journal, but not for the key (a field kept out of repr).
        shown = {
            f.name: {"old": getattr(old, f.name), "new": getattr(spec, f.name)}
            for f in dataclasses.fields(spec)
            if f.name in changed and f.repr
        }
        # Another process, perhaps on another port: its token count is not comparable.
        view.progress = None
        if (old.probe_url, old.ca_file, old.ca_sha256) != (
            spec.probe_url,
            spec.ca_file,
            spec.ca_sha256,
        ):
            # HTTP to HTTPS, or another CA: a new client; a probe in flight keeps the old one,
            # closed before the next probe starts.
            view.stale_clients.append(view.http)
            view.http = probe_client(spec, _probe_timeout(self.config))
        if any(name in changed for name in REGISTRATION_FIELDS):
            # Leave the old registration (the old URL, or this URL with the old served name
            # or key); the group joins again with the new settings once it answers on them.
            view.retired[old.advertise_url] = {router.target.url for router in self.routers}
        for action in view.machine.settings_changed(self.clock(), changed):
            if isinstance(action, Event):
                self._emit(
                    action.level, action.name, action.message, view, **action.fields, **shown
                )

    def _reconcile(self) -> None:
        """Every router at once, each in its own thread; the pass waits for them up to one
        interval (a restart below must follow the leaves before it), and a router still busy
        from an earlier pass (hung, until its calls time out) is skipped."""
        wanted = {view.spec.group: self._wants_registered(view) for view in self.groups}
        started = []
        for router in self.routers:
            if router.inflight is not None and not router.inflight.done():
                continue
            router.inflight = self._router_pool.submit(self._reconcile_router, router, wanted)
            started.append((router, router.inflight))
        wait([future for _, future in started], timeout=max(1.0, self.config.interval_seconds))
        for router, future in started:
            if future.done() and future.exception() is not None:
                message = f"reconciling router {router.target.url} failed: {future.exception()!r}"
                self._emit("error", "router_reconcile_failed", message, router=router.target.url)

    def _reconcile_router(self, router: RouterView, wanted: dict[str, bool]) -> None:
        name = router.target.url
        try:
            listed = set(router.client.workers())
        except RouterError as err:
            router.down = True
            self._router_failed(router, err)
            return
        if router.down:
            router.down, router.last_error = False, None
            self._emit("info", "router_ok", f"router {name} answers again", router=name)
        for view in self.groups:
            self._retire(router, view, listed)
            present = view.spec.advertise_url in listed
            wants = wanted.get(view.spec.group, False)
            if self.act and present != wants:
                try:
                    present = self._converge(router, view, wants)
                except RouterError as err:
                    self._router_failed(router, err, view)
            view.registered[name] = present
            self.metrics.registered.labels(group=view.spec.group, router=name).set(present)

    def _retire(self, router: RouterView, view: GroupView, listed: set[str]) -> None:
        """Take the group's registrations under its previous settings off this router."""
        name = router.target.url
        for url, pending in list(view.retired.items()):
            if name not in pending or not self.act:
                continue
            if url in listed:
                try:
                    router.client.leave(url)
                except RouterError as err:
                    self._router_failed(router, err, view)
                    continue  # tried again next pass
                # Unlisted now, so a URL the group keeps is joined again with its new settings.
                listed.discard(url)
                message = f"registration under previous settings ({url}) removed from router {name}"
                self._emit("info", "left", message, view, router=name, url=url)
            pending.discard(name)
            if not pending:
                # Another router's thread may have emptied and removed it first.
                view.retired.pop(url, None)

    def _wants_registered(self, view: GroupView) -> bool:
        """The state machine's wish, unless an upgrade holds the group out of the routers."""
        held = hold.is_held(view.spec.group)
        if held != view.held:
            view.held = held
            message = "held out of the routers" if held else "hold lifted"
            self._emit("info", "held" if held else "unheld", message, view)
        return view.machine.should_register and not held and not view.removed

    def _converge(self, router: RouterView, view: GroupView, wants: bool) -> bool:
        """Join or leave as wanted; returns whether the group is now listed."""
        spec, name = view.spec, router.target.url
        if not wants:
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
        with self._emitting:  # the routers' threads emit too: one whole line at a time
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
                "settings_error": view.settings_error,
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


def _hold_age(group: str) -> float:
    """Seconds the group has been held out of the routers; 0 when it is not held."""
    since = hold.held_since(group)
    # An mtime ahead of the clock (the clock was stepped back) reads as 0, not negative.
    return 0.0 if since is None else max(0.0, time.time() - since)


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
