"""The watchdog's Prometheus metrics, in a registry of its own."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from vllm_fleet.watchdog.state import State

# Completions of one token: tens of milliseconds when healthy, seconds when overloaded.
PROBE_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class WatchdogMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.probe_seconds = Histogram(
            "vllm_fleet_watchdog_probe_seconds",
            "Time a probe completion took (failed ones included)",
            ["group"],
            buckets=PROBE_BUCKETS,
            registry=self.registry,
        )
        self.consecutive_failures = Gauge(
            "vllm_fleet_watchdog_consecutive_failures",
            "Probes failed in a row while the unit is active",
            ["group"],
            registry=self.registry,
        )
        self.restarts = Counter(
            "vllm_fleet_watchdog_restarts",
            "Group restarts the watchdog ordered",
            ["group"],
            registry=self.registry,
        )
        self.state = Gauge(
            "vllm_fleet_watchdog_state",
            "1 for the group's current watchdog state, 0 for the others",
            ["group", "state"],
            registry=self.registry,
        )
        self.router_errors = Counter(
            "vllm_fleet_watchdog_router_errors",
            "Failed router operations (list, add, remove)",
            ["router"],
            registry=self.registry,
        )
        # 0 rather than absent when not held: every watched group has the series, so a
        # missing one means a missing scrape, and "> threshold" alone finds stale holds.
        self.hold_age = Gauge(
            "vllm_fleet_watchdog_hold_age_seconds",
            "Seconds since the group was held out of the routers (vllm_fleet.router.hold, by its "
            "file's mtime); 0 when it is not held",
            ["group"],
            registry=self.registry,
        )
        self.registered = Gauge(
            "vllm_fleet_watchdog_registered",
            "1 when the router lists the group as a worker",
            ["group", "router"],
            registry=self.registry,
        )

    def set_state(self, group: str, current: State, failures: int) -> None:
        # A labelled counter exists only once touched: create it at 0, so increase() over a
        # window counts a group's first restarts too (the restart alerts rely on it).
        self.restarts.labels(group=group)
        for state in State:
            self.state.labels(group=group, state=state.value).set(int(state == current))
        self.consecutive_failures.labels(group=group).set(failures)

    def serve(self, host: str, port: int) -> Callable[[], None]:
        """Serve /metrics on host:port; returns what stops it."""
        server, thread = start_http_server(port, addr=host, registry=self.registry)

        def stop() -> None:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)

        return stop
