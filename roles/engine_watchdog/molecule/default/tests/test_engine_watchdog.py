"""The watchdog over a real vLLM engine: it probes it, and restarts it when it hangs."""

from __future__ import annotations

import json
import re
import time

from tests.molecule_hosts import podman_hosts

testinfra_hosts = podman_hosts()

UNIT = "vllm-fleet-watchdog.service"
ENGINE_UNIT = "vllm-engine@g0.service"
KEY = "molecule-only-engine-key-0c5e77"
METRICS = "http://127.0.0.1:9410/metrics"
HEALTHY = 'vllm_fleet_watchdog_state{group="g0",state="healthy"}'
PROBES = 'vllm_fleet_watchdog_probe_seconds_count{group="g0"}'
RESTARTS = 'vllm_fleet_watchdog_restarts_total{group="g0"}'
# fleet_watchdog in molecule.yml.
INTERVAL, PROBE_TIMEOUT, FAILURE_THRESHOLD = 1, 3, 2
# A hung engine's probe does not return; the watchdog counts one still running after
# 2 x timeout + 1 s as failed. Measured: 7.7-11.2 s; the margin is for a loaded 2-core host.
DETECTION_LIMIT = FAILURE_THRESHOLD * (INTERVAL + PROBE_TIMEOUT) + 10
# The engine's own start (vLLM loading, warming up) on 2 shared CPU cores.
RECOVERY_LIMIT = 180
SAMPLE = re.compile(r"^(?P<name>[a-z_:]+(?:\{[^}]*\})?) (?P<value>\S+)$")


def metrics(host) -> dict[str, float]:
    text = host.check_output(f"curl -s -m 5 {METRICS}")
    found = (SAMPLE.match(line) for line in text.splitlines() if not line.startswith("#"))
    return {m["name"]: float(m["value"]) for m in found if m}


def unit_prop(host, unit, prop) -> str:
    return host.check_output(f"systemctl show -p {prop} --value {unit}")


def wait_for(what, predicate, timeout, step=0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return time.monotonic()
        time.sleep(step)
    raise AssertionError(f"{what}: not within {timeout} s")


def events(host) -> list[dict]:
    lines = host.check_output(f"journalctl -u {UNIT} --no-pager -o cat").splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def test_watchdog_is_active_and_reported_ready(host):
    assert host.service("vllm-fleet-watchdog").is_enabled
    assert unit_prop(host, UNIT, "Type") == "notify"
    # A Type=notify unit is "active" only after READY=1.
    assert unit_prop(host, UNIT, "ActiveState") == "active"
    assert unit_prop(host, UNIT, "SubState") == "running"
    assert "g0=healthy" in unit_prop(host, UNIT, "StatusText")


def test_metrics_listen_on_loopback_and_show_g0_healthy_and_probed(host):
    listeners = host.check_output("ss -Hltn | awk '{print $4}'").split()
    assert [sock for sock in listeners if sock.endswith(":9410")] == ["127.0.0.1:9410"]
    before = metrics(host)
    assert before[HEALTHY] == 1.0
    time.sleep(3 * INTERVAL + 1)
    after = metrics(host)
    assert after[PROBES] >= before[PROBES] + 2
    # A healthy engine is left alone. (The counter has no sample before a group's first
    # restart.)
    assert after.get(RESTARTS, 0.0) == before.get(RESTARTS, 0.0)


def test_a_hung_engine_is_restarted_and_recovers(host):
    invocation = unit_prop(host, ENGINE_UNIT, "InvocationID")
    main = unit_prop(host, ENGINE_UNIT, "MainPID")
    assert "engine-run" in host.check_output(f"tr '\\0' ' ' < /proc/{main}/cmdline")
    # The main process is `vllm-fleet engine-run`; its child is vLLM's API server.
    children = host.check_output(f"cat /proc/{main}/task/*/children").split()
    assert len(children) == 1, children
    server = children[0]
    assert " serve " in host.check_output(f"tr '\\0' ' ' < /proc/{server}/cmdline")

    restarts = metrics(host).get(RESTARTS, 0.0)
    stopped = time.monotonic()
    host.check_output(f"kill -STOP {server}")
    detected = wait_for(
        "the watchdog orders a restart",
        lambda: metrics(host).get(RESTARTS, 0.0) == restarts + 1,
        DETECTION_LIMIT,
    )
    restarted = wait_for(
        "the engine unit is started again",
        lambda: unit_prop(host, ENGINE_UNIT, "InvocationID") not in ("", invocation),
        60,
    )
    recovered = wait_for(
        "g0 is healthy again",
        lambda: (
            metrics(host).get(HEALTHY) == 1.0
            and unit_prop(host, ENGINE_UNIT, "ActiveState") == "active"
        ),
        RECOVERY_LIMIT,
        step=1,
    )
    print(
        f"\nwatchdog: hung engine detected (restart ordered) after {detected - stopped:.1f} s "
        f"(limit {DETECTION_LIMIT} s), new engine process after {restarted - stopped:.1f} s, "
        f"healthy again after {recovered - stopped:.1f} s"
    )
    assert metrics(host)[RESTARTS] == restarts + 1
    assert host.run(f"test -d /proc/{server}").rc != 0, "the hung process is still there"
    # It answers a real completion again.
    body = json.dumps({"model": "smollm2", "prompt": "Hello", "max_tokens": 2})
    address = json.loads(host.file("/etc/vllm-fleet/engines/g0.json").content_string)["host"]
    status = host.check_output(
        f"curl -s -o /dev/null -w '%{{http_code}}' http://{address}:8100/v1/completions "
        f"-H 'Authorization: Bearer {KEY}' -H 'Content-Type: application/json' -d '{body}'"
    )
    assert status == "200"


def test_journal_has_the_restart_and_recovery_events_and_no_key(host):
    seen = events(host)
    names = [event["event"] for event in seen]
    assert "restart" in names, names
    last = len(names) - 1 - names[::-1].index("restart")
    assert {"healthy", "recovered"} & set(names[last + 1 :]), names
    restart = seen[last]
    assert restart["group"] == "g0"
    assert "probes failed" in restart["message"]
    journal = host.check_output(f"journalctl -u {UNIT} --no-pager -o cat")
    assert KEY not in journal
