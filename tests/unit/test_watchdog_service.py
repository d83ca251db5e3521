"""The watchdog loop over real HTTP: a fake engine, a real sglang-router, real /metrics.

systemctl is the one test double (``units`` fixture); time for the state machines is a
fake clock, while probes and router calls really go over loopback.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import threading
import time

import httpx
import pytest
from pydantic import ValidationError

from tests.support.tls import host_certificate
from tests.unit.router_fixtures import (
    CONTROL_KEY,
    ENGINE_KEY,
    FakeEngine,
    free_port,
    running_engine,
    running_router,
    sglang_listing,
    start_router,
    wait_until,
)
from vllm_fleet.router import hold
from vllm_fleet.router.client import RouterError, RouterTarget, router_client
from vllm_fleet.tls.ca import CA_CERT, init_ca, load_ca
from vllm_fleet.watchdog import journal
from vllm_fleet.watchdog.config import WatchdogConfig
from vllm_fleet.watchdog.groups import GroupConfigError, load_group
from vllm_fleet.watchdog.metrics import WatchdogMetrics
from vllm_fleet.watchdog.probe import probe_completion
from vllm_fleet.watchdog.service import Watchdog, main
from vllm_fleet.watchdog.state import State
from vllm_fleet.watchdog.units import SystemctlUnits, UnitError, UnitStatus


class FakeUnits:
    """systemctl as the watchdog sees it: unit states to report, restarts ordered."""

    def __init__(self) -> None:
        self.states: dict[str, str] = {}
        self.restarted: list[str] = []

    def status(self, unit: str) -> UnitStatus:
        return UnitStatus(self.states.get(unit, "active"), "running")

    def restart(self, unit: str) -> None:
        self.restarted.append(unit)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def units():
    return FakeUnits()


@pytest.fixture(scope="module")
def sglang_router(tmp_path_factory):
    log = tmp_path_factory.mktemp("sglang") / "router.log"
    with running_router("sglang", log) as router:
        yield router


@pytest.fixture
def engine():
    with running_engine() as served:
        yield served


def engine_config(
    group: str, engine: FakeEngine, tls: dict[str, str] | None = None
) -> dict[str, object]:
    port = int(engine.url.rsplit(":", 1)[1])
    return {
        "group": group,
        "accelerator": "cpu",
        "stack": "s",
        "stack_dir": "/opt/vllm-fleet/stacks/s",
        "model_path": "/srv/models/m/r",
        "served_name": engine.served_name,
        "host": "0.0.0.0",
        "port": port,
        "devices": [0],
        "max_model_len": 128,
        "max_num_seqs": 2,
        "kv_cache_bytes": 1 << 20,
        "advertise_url": engine.url + "/",
        **({"tls": tls} if tls else {}),
    }


def write_group(
    tmp_path, group: str, served: FakeEngine, tls: dict[str, str] | None = None
) -> None:
    """The group's settings and secrets, as Ansible renders them, for ``served``."""
    engines_dir = tmp_path / "engines"
    engines_dir.mkdir(exist_ok=True)
    (engines_dir / f"{group}.json").write_text(json.dumps(engine_config(group, served, tls)))
    (engines_dir / f"{group}.env").write_text(f"VLLM_API_KEY='{served.api_key}'\n")


def write_setup(tmp_path, engines: dict[str, FakeEngine], routers, **settings):
    engines_dir = tmp_path / "engines"
    for group, served in engines.items():
        write_group(tmp_path, group, served)
    raw = {
        "interval_seconds": 0.05,
        "probe_timeout_seconds": 0.3,
        "failure_threshold": 2,
        "metrics_host": "127.0.0.1",
        "metrics_port": free_port(),
        "engine_config_dir": str(engines_dir),
        "groups": list(engines),
        "routers": [{"impl": "sglang", "url": r.url} for r in routers],
        **settings,
    }
    path = tmp_path / "watchdog.json"
    path.write_text(json.dumps(raw))
    return path, WatchdogConfig.model_validate(raw)


def make_watchdog(config, units, clock=None):
    specs = [load_group(config, group) for group in config.groups]
    routers = [(t, router_client(t, CONTROL_KEY, timeout=2)) for t in config.routers]
    return Watchdog(config, specs, units, routers, WatchdogMetrics(), clock=clock or FakeClock())


def events_of(out: str) -> list[tuple[str, dict]]:
    lines = [line for line in out.splitlines() if line.startswith("<")]
    return [(line[:3], json.loads(line[3:])) for line in lines]


def listed(router) -> list[str]:
    return [str(w["url"]) for w in sglang_listing(router.url)]


def metric_lines(config) -> list[str]:
    url = f"http://{config.metrics_host}:{config.metrics_port}/metrics"
    return httpx.get(url, timeout=5).text.splitlines()


def test_a_healthy_group_is_joined_and_metrics_are_served(
    tmp_path, sglang_router, engine, units, capsys
):
    _, config = write_setup(tmp_path, {"g0": engine}, [sglang_router])
    watchdog = make_watchdog(config, units)
    stop_metrics = watchdog.metrics.serve(config.metrics_host, config.metrics_port)
    try:
        watchdog.run_pass()
        wait_until(lambda: engine.url in listed(sglang_router), what="the join")
        lines = metric_lines(config)
    finally:
        stop_metrics()
        watchdog.close()
    assert 'vllm_fleet_watchdog_state{group="g0",state="healthy"} 1.0' in lines
    assert 'vllm_fleet_watchdog_state{group="g0",state="starting"} 0.0' in lines
    assert 'vllm_fleet_watchdog_probe_seconds_count{group="g0"} 1.0' in lines
    router = sglang_router.url
    assert f'vllm_fleet_watchdog_registered{{group="g0",router="{router}"}} 1.0' in lines
    assert 'vllm_fleet_watchdog_consecutive_failures{group="g0"} 0.0' in lines
    # Present before the first restart, so a window's increase() counts that restart.
    assert 'vllm_fleet_watchdog_restarts_total{group="g0"} 0.0' in lines
    assert engine.completions == [f"Bearer {ENGINE_KEY}"]
    events = events_of(capsys.readouterr().out)
    assert [e["event"] for _, e in events] == ["healthy", "joined"]
    assert events[1] == ("<6>", events[1][1])
    assert events[1][1]["group"] == "g0"
    assert events[1][1]["state"] == "healthy"


def test_a_hanging_engine_is_left_and_restarted_while_others_go_on(
    tmp_path, sglang_router, units, capsys
):
    with running_engine() as hung, running_engine() as fine:
        _, config = write_setup(tmp_path, {"g0": hung, "g1": fine}, [sglang_router])
        watchdog = make_watchdog(config, units)
        try:
            watchdog.run_pass()
            wait_until(
                lambda: {hung.url, fine.url} <= set(listed(sglang_router)), what="both joins"
            )
            hung.mode = "hang"
            started = time.monotonic()
            watchdog.run_pass()
            assert time.monotonic() - started < 2  # bounded by the probe timeout
            assert watchdog.groups[0].machine.state == State.FAILING
            assert hung.url in listed(sglang_router)  # one failure is not a verdict
            assert units.restarted == []
            watchdog.run_pass()
            assert units.restarted == ["vllm-engine@g0.service"]
            wait_until(lambda: hung.url not in listed(sglang_router), what="the leave")
            assert fine.url in listed(sglang_router)
            states = {g: s["state"] for g, s in watchdog.snapshot()["groups"].items()}
            assert states == {"g0": "restarting", "g1": "healthy"}
            assert "ReadTimeout" in watchdog.snapshot()["groups"]["g0"]["probe"]["detail"]
        finally:
            watchdog.close()
    out = capsys.readouterr().out
    g0 = [(prefix, e["event"]) for prefix, e in events_of(out) if e["group"] == "g0"]
    # The decision, then what carries it out: leave first, then the restart.
    assert g0[-3:] == [("<4>", "probe_failed"), ("<4>", "restart"), ("<6>", "left")]
    assert ENGINE_KEY not in out
    assert CONTROL_KEY not in out


def test_a_restarted_router_gets_its_workers_back(tmp_path, engine, units, capsys):
    router = start_router("sglang", tmp_path / "router.log")
    port = int(router.url.rsplit(":", 1)[1])
    _, config = write_setup(tmp_path, {"g0": engine}, [router])
    watchdog = make_watchdog(config, units)
    try:
        watchdog.run_pass()
        wait_until(lambda: engine.url in listed(router), what="the join")
        router.stop()
        watchdog.run_pass()  # must not raise
        errors = watchdog.metrics.router_errors.labels(router=router.url)._value.get()
        assert errors == 1
        assert watchdog.status_line() == "g0=healthy; routers 0/1 ok"
        router = start_router("sglang", tmp_path / "router.log", port=port)
        assert listed(router) == []
        watchdog.run_pass()
        wait_until(lambda: engine.url in listed(router), what="the join after the restart")
        assert watchdog.status_line() == "g0=healthy; routers 1/1 ok"
    finally:
        router.stop()
        watchdog.close()
    events = [e["event"] for _, e in events_of(capsys.readouterr().out)]
    assert events == ["healthy", "joined", "router_error", "router_ok", "joined"]


def test_a_unit_that_is_stopping_is_not_rejoined(tmp_path, sglang_router, engine, units):
    _, config = write_setup(tmp_path, {"g0": engine}, [sglang_router])
    units.states["vllm-engine@g0.service"] = "deactivating"
    watchdog = make_watchdog(config, units)
    try:
        watchdog.run_pass()
        watchdog.run_pass()
    finally:
        watchdog.close()
    assert engine.url not in listed(sglang_router)
    assert watchdog.snapshot()["groups"]["g0"]["registered"] == {sglang_router.url: False}


def test_a_held_group_is_kept_out_of_the_routers_until_released(
    tmp_path, sglang_router, engine, units, monkeypatch, capsys
):
    monkeypatch.setenv(hold.HOLD_DIR_ENV, str(tmp_path / "hold"))
    _, config = write_setup(tmp_path, {"g0": engine}, [sglang_router])
    watchdog = make_watchdog(config, units)
    try:
        watchdog.run_pass()
        wait_until(lambda: engine.url in listed(sglang_router), what="the join")
        hold.hold("g0", "upgrade")
        watchdog.run_pass()
        assert engine.url not in listed(sglang_router)
        watchdog.run_pass()  # a healthy, held group stays out
        assert engine.url not in listed(sglang_router)
        assert watchdog.snapshot()["groups"]["g0"]["held"] is True
        hold.release("g0")
        watchdog.run_pass()
        wait_until(lambda: engine.url in listed(sglang_router), what="the rejoin")
    finally:
        watchdog.close()
    events = [e["event"] for _, e in events_of(capsys.readouterr().out)]
    assert events == ["healthy", "joined", "held", "left", "unheld", "joined"]


def test_a_group_removed_from_the_inventory_is_left_alone_not_restarted(
    tmp_path, sglang_router, engine, units, capsys
):
    """vllm_engine stops a group that left the inventory, then deletes its settings; the
    watchdog still lists it until its own settings are re-rendered. It must not bring the
    group back: no restart, no registration, while the settings file is gone."""
    _, config = write_setup(tmp_path, {"g0": engine}, [sglang_router])
    watchdog = make_watchdog(config, units)
    try:
        watchdog.run_pass()
        wait_until(lambda: engine.url in listed(sglang_router), what="the join")
        units.states["vllm-engine@g0.service"] = "inactive"
        for name in ("g0.json", "g0.env"):
            (tmp_path / "engines" / name).unlink()
        for _ in range(config.failure_threshold + 3):
            watchdog.run_pass()
        wait_until(lambda: engine.url not in listed(sglang_router), what="the leave")
        assert units.restarted == []
    finally:
        watchdog.close()
    events = [e["event"] for _, e in events_of(capsys.readouterr().out)]
    assert "removed" in events
    assert "restart" not in events


def registered_model(router, url: str) -> str | None:
    """The served name the router has ``url`` registered with (None: not listed)."""
    models = [w.get("model_id") for w in sglang_listing(router.url) if str(w["url"]) == url]
    return str(models[0]) if models else None


def passes_until(watchdog, condition, what: str) -> None:
    """Run passes until ``condition`` holds (the router applies adds and removes async)."""
    wait_until(lambda: (watchdog.run_pass(), condition())[1], what=what)


def test_a_new_served_name_is_probed_and_registered_without_a_restart(
    tmp_path, sglang_router, engine, units, capsys
):
    _, config = write_setup(tmp_path, {"g0": engine}, [sglang_router])
    watchdog = make_watchdog(config, units)
    try:
        watchdog.run_pass()
        wait_until(lambda: engine.url in listed(sglang_router), what="the join")
        # The operator switched the group's model: Ansible rendered it and restarted it.
        engine.served_name = "new-model"
        write_group(tmp_path, "g0", engine)
        probed = len(engine.models)
        for _ in range(3):  # past failure_threshold (2)
            watchdog.run_pass()
        assert engine.models[probed:] == ["new-model"] * 3
        assert units.restarted == []
        assert watchdog.snapshot()["groups"]["g0"]["state"] == "healthy"
        # The registration made with the old name is replaced by one with the new.
        passes_until(
            watchdog,
            lambda: registered_model(sglang_router, engine.url) == "new-model",
            "the registration with the new name",
        )
        assert units.restarted == []
    finally:
        watchdog.close()
    out = capsys.readouterr().out
    changes = [e for _, e in events_of(out) if e["event"] == "settings_changed"]
    assert len(changes) == 1
    assert changes[0]["changed"] == ["served_name"]
    assert changes[0]["served_name"] == {"old": "fake-model", "new": "new-model"}
    assert not [e for _, e in events_of(out) if e["event"] in ("probe_failed", "restart")]


def test_a_group_moved_to_another_port_and_key_is_followed_there(
    tmp_path, sglang_router, units, capsys
):
    moved = FakeEngine(api_key="rotated-engine-key-for-tests")
    # The old port keeps answering here, so only the watchdog can take it off the router.
    with running_engine() as before, running_engine(moved) as after:
        _, config = write_setup(tmp_path, {"g0": before}, [sglang_router])
        watchdog = make_watchdog(config, units)
        try:
            watchdog.run_pass()
            wait_until(lambda: before.url in listed(sglang_router), what="the join")
            probed = len(before.completions)
            write_group(tmp_path, "g0", after)
            passes_until(
                watchdog,
                lambda: (
                    after.url in listed(sglang_router) and before.url not in listed(sglang_router)
                ),
                "the old URL left and the new one joined",
            )
            assert len(before.completions) == probed
            assert after.completions
            assert set(after.completions) == {f"Bearer {moved.api_key}"}
            assert units.restarted == []
        finally:
            watchdog.close()
    out = capsys.readouterr().out
    events = [e for _, e in events_of(out)]
    (change,) = [e for e in events if e["event"] == "settings_changed"]
    assert change["changed"] == ["probe_url", "advertise_url", "api_key"]
    assert change["advertise_url"] == {"old": before.url, "new": after.url}
    assert "api_key" not in change  # named as changed, its values never
    assert [e["url"] for e in events if e["event"] == "left"] == [before.url]
    assert [e["event"] for e in events].count("joined") == 2
    assert ENGINE_KEY not in out
    assert moved.api_key not in out


def test_a_group_moved_to_https_is_probed_there_trusting_the_fleet_ca_alone(
    tmp_path, units, capsys
):
    """The fleet gains a CA: the group's settings name HTTPS, its certificate and the CA. The
    watchdog's probe follows with a client that trusts that CA alone; the same move with a
    certificate from another CA fails its probes instead of trusting the system's CAs."""
    init_ca(tmp_path / "fleet-ca")
    init_ca(tmp_path / "rogue-ca", name="another CA")
    tls = {
        "cert": "engine-tls.crt",
        "key": "engine-tls.key",
        "ca_cert": str(tmp_path / "fleet-ca" / CA_CERT),
        "cert_sha256": "ab" * 32,
        "ca_sha256": "cd" * 32,
    }
    good = host_certificate(load_ca(tmp_path / "fleet-ca"), tmp_path / "good", ["e"], ["127.0.0.1"])
    bad = host_certificate(load_ca(tmp_path / "rogue-ca"), tmp_path / "bad", ["e"], ["127.0.0.1"])
    with (
        running_engine() as before,
        running_engine(tls=good) as after,
        running_engine(tls=bad) as rogue,
    ):
        _, config = write_setup(tmp_path, {"g0": before}, [])
        watchdog = make_watchdog(config, units)
        try:
            watchdog.run_pass()
            assert before.completions
            write_group(tmp_path, "g0", after, tls)
            passes_until(watchdog, lambda: bool(after.completions), "a probe over HTTPS")
            watchdog.run_pass()
            assert watchdog.groups[0].probe is not None and watchdog.groups[0].probe.ok
            write_group(tmp_path, "g0", rogue, tls)
            passes_until(
                watchdog,
                lambda: watchdog.groups[0].probe is not None and not watchdog.groups[0].probe.ok,
                "the probe of an engine from another CA to fail",
            )
            assert rogue.completions == []
        finally:
            watchdog.close()
    changes = [e for _, e in events_of(capsys.readouterr().out) if e["event"] == "settings_changed"]
    assert changes[0]["probe_url"]["new"].startswith("https://")


def test_settings_rendered_before_the_restart_wait_for_it(
    tmp_path, sglang_router, engine, units, capsys
):
    _, config = write_setup(tmp_path, {"g0": engine}, [sglang_router])
    watchdog = make_watchdog(config, units)
    try:
        watchdog.run_pass()
        wait_until(lambda: engine.url in listed(sglang_router), what="the join")
        # Rendered while the engine still runs the old name: an upgrade drains it first.
        write_group(tmp_path, "g0", FakeEngine(served_name="new-model", url=engine.url))
        for _ in range(4):  # twice failure_threshold
            watchdog.run_pass()
        assert engine.models[-1] == "new-model"  # answered 404 by the old process
        assert units.restarted == []
        assert watchdog.snapshot()["groups"]["g0"]["state"] == "reconfiguring"
        passes_until(
            watchdog, lambda: engine.url not in listed(sglang_router), "the old registration left"
        )
        engine.served_name = "new-model"  # the restart onto them
        passes_until(
            watchdog,
            lambda: registered_model(sglang_router, engine.url) == "new-model",
            "the registration with the new name",
        )
        assert watchdog.snapshot()["groups"]["g0"]["state"] == "healthy"
        assert units.restarted == []
    finally:
        watchdog.close()
    events = [e["event"] for _, e in events_of(capsys.readouterr().out)]
    assert events[:4] == ["healthy", "joined", "settings_changed", "left"]
    assert "healthy" in events[4:]


def test_unreadable_settings_keep_the_last_ones_and_are_logged_once(
    tmp_path, engine, units, capsys
):
    _, config = write_setup(tmp_path, {"g0": engine}, [])
    watchdog = make_watchdog(config, units)
    settings, secrets = tmp_path / "engines" / "g0.json", tmp_path / "engines" / "g0.env"
    good = settings.read_text()
    try:
        watchdog.run_pass()
        settings.write_text(good[: len(good) // 2])  # caught mid-write
        for _ in range(3):
            watchdog.run_pass()
        report = watchdog.snapshot()["groups"]["g0"]
        assert report["state"] == "healthy"
        assert "g0" in report["settings_error"]
        assert engine.completions == [f"Bearer {ENGINE_KEY}"] * 4  # the last good settings
        # Another error is logged (once) too; then readable again.
        settings.write_text(good)
        secrets.write_text("OTHER=1\n")
        for _ in range(3):
            watchdog.run_pass()
        assert "VLLM_API_KEY" in watchdog.snapshot()["groups"]["g0"]["settings_error"]
        write_group(tmp_path, "g0", engine)
        watchdog.run_pass()
        assert watchdog.snapshot()["groups"]["g0"]["settings_error"] is None
        assert units.restarted == []
    finally:
        watchdog.close()
    events = events_of(capsys.readouterr().out)
    names = [e["event"] for _, e in events]
    assert names == ["healthy", "settings_unreadable", "settings_unreadable", "settings_ok"]
    assert events[1][0] == "<4>"
    assert "last settings" in events[1][1]["message"]


def test_the_hold_age_is_exported_per_group(tmp_path, engine, units, monkeypatch):
    monkeypatch.setenv(hold.HOLD_DIR_ENV, str(tmp_path / "hold"))
    _, config = write_setup(tmp_path, {"g0": engine}, [])
    watchdog = make_watchdog(config, units)

    def age() -> float | None:
        name = "vllm_fleet_watchdog_hold_age_seconds"
        return watchdog.metrics.registry.get_sample_value(name, {"group": "g0"})

    try:
        watchdog.run_pass()
        assert age() == 0.0  # present, at 0, when not held
        # As the upgrade role writes a new group's hold: no "since", the file's time counts.
        path = hold.hold_path("g0")
        path.parent.mkdir()
        path.write_text('{"reason": "upgrade 20250101T000000Z: new group"}')
        placed = time.time() - 1200
        os.utime(path, (placed, placed))
        watchdog.run_pass()
        assert 1200 <= age() < 1260
        hold.release("g0")
        watchdog.run_pass()
        assert age() == 0.0
    finally:
        watchdog.close()


def test_the_loop_tells_systemd_ready_then_pings(tmp_path, engine, units):
    _, config = write_setup(tmp_path, {"g0": engine}, [])
    watchdog = make_watchdog(config, units)
    stop = threading.Event()
    sent: list[str] = []

    def notify(message: str) -> bool:
        sent.append(message)
        if len(sent) == 3:
            stop.set()
        return True

    try:
        watchdog.run(stop, notify)
    finally:
        watchdog.close()
    assert sent[0] == "READY=1\nWATCHDOG=1\nSTATUS=g0=healthy; routers 0/0 ok"
    assert sent[1:] == ["WATCHDOG=1\nSTATUS=g0=healthy; routers 0/0 ok"] * 2


def test_groups_are_observed_concurrently(tmp_path, units):
    # Each unit lookup waits for the other group's: only concurrent observing gets through.
    barrier = threading.Barrier(2, timeout=5)
    seen = []

    class WaitingUnits(FakeUnits):
        def status(self, unit: str) -> UnitStatus:
            barrier.wait()
            seen.append(unit)
            return super().status(unit)

    with running_engine() as first, running_engine() as second:
        _, config = write_setup(tmp_path, {"g0": first, "g1": second}, [])
        watchdog = make_watchdog(config, WaitingUnits())
        try:
            watchdog.run_pass()
        finally:
            watchdog.close()
    assert sorted(seen) == ["vllm-engine@g0.service", "vllm-engine@g1.service"]
    assert watchdog.all_healthy()


def test_a_crashing_observation_is_a_failed_probe_not_a_crash(tmp_path, engine):
    class BrokenUnits(FakeUnits):
        def status(self, unit: str) -> UnitStatus:
            raise RuntimeError("dbus went away")

    _, config = write_setup(tmp_path, {"g0": engine}, [])
    watchdog = make_watchdog(config, BrokenUnits())
    try:
        watchdog.run_pass()
    finally:
        watchdog.close()
    report = watchdog.snapshot()["groups"]["g0"]
    assert report["state"] == "starting"
    assert report["unit"] == "unknown"
    assert "dbus went away" in report["probe"]["detail"]


def test_the_loop_speaks_sd_notify_over_the_socket(tmp_path, engine, units, monkeypatch):
    name = f"vllm-fleet-watchdog-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind("\0" + name)
        listener.settimeout(10)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        _, config = write_setup(tmp_path, {"g0": engine}, [])
        watchdog = make_watchdog(config, units)
        stop = threading.Event()
        loop = threading.Thread(target=watchdog.run, args=(stop,))
        loop.start()
        try:
            first = listener.recv(4096).decode()
            second = listener.recv(4096).decode()
        finally:
            stop.set()
            loop.join(timeout=10)
            watchdog.close()
    assert first.startswith("READY=1\nWATCHDOG=1\nSTATUS=g0=healthy")
    assert second.startswith("WATCHDOG=1\n")


FAKE_SYSTEMCTL = """#!/bin/sh
echo "$@" >> "{log}"
if [ "$1" = show ]; then printf 'SubState=running\\nActiveState=active\\n'; fi
"""


def test_once_reports_states_and_changes_nothing(tmp_path, sglang_router, monkeypatch, capsys):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    systemctl = bin_dir / "systemctl"
    systemctl.write_text(FAKE_SYSTEMCTL.format(log=tmp_path / "systemctl.log"))
    systemctl.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("VLLM_FLEET_ROUTER_CONTROL_KEY", CONTROL_KEY)
    with running_engine() as good, running_engine(FakeEngine(mode="error")) as bad:
        path, _ = write_setup(tmp_path, {"g0": good}, [sglang_router])
        assert main(["--config", str(path), "--once"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["groups"]["g0"]["state"] == "healthy"
        assert report["groups"]["g0"]["registered"] == {sglang_router.url: False}
        path, _ = write_setup(tmp_path, {"g0": good, "g1": bad}, [sglang_router])
        assert main(["--config", str(path), "--once"]) == 1
        report = json.loads(capsys.readouterr().out)
        assert report["groups"]["g1"]["state"] == "failing"
        assert report["groups"]["g1"]["probe"]["detail"].startswith("HTTP 500")
    assert good.url not in listed(sglang_router)
    calls = (tmp_path / "systemctl.log").read_text().splitlines()
    assert set(calls) == {
        "show --property=ActiveState,SubState -- vllm-engine@g0.service",
        "show --property=ActiveState,SubState -- vllm-engine@g1.service",
    }


def test_a_broken_config_is_refused_with_a_message(tmp_path, capsys):
    path = tmp_path / "watchdog.json"
    path.write_text(json.dumps({"groups": ["g0"], "engine_config_dir": str(tmp_path)}))
    assert main(["--config", str(path), "--once"]) == 2
    assert "g0" in capsys.readouterr().err


def test_systemctl_argv_and_errors():
    calls = []

    def run(argv, **kwargs):
        calls.append(argv)
        assert kwargs["timeout"] == 10.0
        if argv[1] == "show":
            return subprocess.CompletedProcess(argv, 0, "ActiveState=failed\nSubState=failed\n")
        if argv[1] in ("kill", "reset-failed"):
            return subprocess.CompletedProcess(argv, 1, "", "not running / not failed")
        return subprocess.CompletedProcess(argv, 5, "", "Unit x.service not found.")

    units = SystemctlUnits(run=run)
    assert units.status("x.service") == UnitStatus("failed", "failed")
    with pytest.raises(UnitError, match=r"exit 5: Unit x\.service not found"):
        units.restart("x.service")
    assert calls[1:] == [
        ["systemctl", "kill", "--kill-whom=main", "--signal=SIGUSR1", "--", "x.service"],
        ["systemctl", "reset-failed", "--", "x.service"],
        ["systemctl", "restart", "--no-block", "--", "x.service"],
    ]


def test_probe_judges_completions(engine):
    def probe(api_key=ENGINE_KEY):
        with httpx.Client(timeout=2) as client:
            return probe_completion(
                client,
                engine.url,
                api_key=api_key,
                served_name=engine.served_name,
                prompt="The capital of France is",
                max_tokens=1,
            )

    assert probe().ok
    assert probe().detail == "1 completion tokens"
    refused = probe(api_key="wrong")
    assert not refused.ok
    assert refused.detail.startswith("HTTP 401")
    engine.mode = "error"
    assert probe().detail.startswith("HTTP 500")


def test_group_spec_probes_loopback_and_advertises_the_configured_url(tmp_path, engine):
    _, config = write_setup(tmp_path, {"g0": engine}, [])
    spec = load_group(config, "g0")
    assert spec.probe_url == engine.url  # 0.0.0.0 is probed on 127.0.0.1
    assert spec.advertise_url == engine.url
    assert spec.unit == "vllm-engine@g0.service"
    assert ENGINE_KEY not in repr(spec)
    (tmp_path / "engines" / "g0.env").write_text("OTHER=1\n")
    with pytest.raises(GroupConfigError, match="no VLLM_API_KEY"):
        load_group(config, "g0")


BRIEF_EXAMPLE = {
    "interval_seconds": 2.0,
    "probe_timeout_seconds": 5.0,
    "failure_threshold": 3,
    "max_start_seconds": 600,
    "backoff_initial_seconds": 10,
    "backoff_max_seconds": 300,
    "restart_budget": 3,
    "restart_window_seconds": 1800,
    "metrics_host": "127.0.0.1",
    "metrics_port": 9410,
    "engine_config_dir": "/etc/vllm-fleet/engines",
    "groups": ["g0"],
    "unit_template": "vllm-engine@{group}.service",
    "routers": [{"impl": "sglang", "url": "http://router01:30000"}],
    "probe_prompt": "The capital of France is",
    "probe_max_tokens": 1,
}


def test_config_accepts_the_rendered_form_and_refuses_mistakes():
    config = WatchdogConfig.model_validate(BRIEF_EXAMPLE)
    assert config.unit("g0") == "vllm-engine@g0.service"
    assert config.routers == [RouterTarget(impl="sglang", url="http://router01:30000")]
    for broken in (
        {"typo_seconds": 1},
        {"unit_template": "vllm-engine.service"},
        {"backoff_max_seconds": 5},
        {"groups": ["g0", "g0"]},
        {"groups": ["../etc"]},
    ):
        with pytest.raises(ValidationError):
            WatchdogConfig.model_validate(BRIEF_EXAMPLE | broken)


def test_journal_lines_carry_the_syslog_priority():
    line = journal.format_event("error", "gave_up", "out", group="g0", state="gave_up", restarts=3)
    assert line.startswith("<3>{")
    assert json.loads(line[3:]) == {
        "event": "gave_up",
        "group": "g0",
        "state": "gave_up",
        "message": "out",
        "restarts": 3,
    }


def test_a_timed_out_probe_of_a_busy_engine_is_not_a_failure():
    from vllm_fleet.watchdog.probe import ProbeResult, judge_timeout

    timed_out = ProbeResult(False, 5.0, "ReadTimeout: timed out")
    busy = judge_timeout(timed_out, before=1000.0, after=1480.0)
    assert busy.ok and busy.detail.startswith("busy:") and "480 tokens" in busy.detail
    # No progress while the probe waited: hung, whatever the API server still answers.
    assert not judge_timeout(timed_out, before=1000.0, after=1000.0).ok
    # /metrics unreachable (an API server that is stopped): hung.
    assert not judge_timeout(timed_out, before=1000.0, after=None).ok
    # Only timeouts are excused; an error answer is a failure however busy the engine is.
    refused = ProbeResult(False, 0.1, "HTTP 500: boom")
    assert judge_timeout(refused, before=1.0, after=9.0) is refused


class HungRouter:
    """A router that accepts connections and never answers, until released."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.accepted: list[socket.socket] = []
        self.released = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while not self.released.is_set():
                connection, _ = self.listener.accept()
                self.accepted.append(connection)

    def release(self) -> None:
        self.released.set()
        for connection in self.accepted:
            connection.close()
        self.listener.close()


def test_a_hung_router_holds_up_neither_the_other_router_nor_the_next_pass(
    tmp_path, sglang_router, engine, units, capsys
):
    """The hung router comes first; its calls would wait 60 s. The group still joins the
    other router within the pass, and the next pass does not call the hung one again while
    its call is outstanding."""
    hung = HungRouter()
    _, config = write_setup(tmp_path, {"g0": engine}, [hung, sglang_router])
    specs = [load_group(config, group) for group in config.groups]
    routers = [
        (config.routers[0], router_client(config.routers[0], CONTROL_KEY, timeout=60)),
        (config.routers[1], router_client(config.routers[1], CONTROL_KEY, timeout=2)),
    ]
    watchdog = Watchdog(config, specs, units, routers, WatchdogMetrics(), clock=FakeClock())
    try:
        watchdog.run_pass()
        wait_until(
            lambda: engine.url in listed(sglang_router), what="the join beside a hung router"
        )
        assert not hung.released.is_set()
        watchdog.run_pass()
        assert len(hung.accepted) == 1, "the hung router was called again while still waited on"
    finally:
        hung.release()
        watchdog.close()
        with contextlib.suppress(RouterError):
            router_client(RouterTarget(impl="sglang", url=sglang_router.url), CONTROL_KEY).leave(
                engine.url
            )
