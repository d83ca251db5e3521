"""Prometheus (Debian's package) with the fleet's rules, scraping node exporter.

Both bound to the container's own address, never a wildcard; every target up; every
shipped alert rule loaded and evaluating; a stopped exporter is seen down; the deploy
record is there and readable as local facts.
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

import pytest
import yaml
from tests.molecule_hosts import podman_host

HOST = "vf-monitoring"
ALERTS = Path(__file__).resolve().parents[3] / "files/vllm-fleet-alerts.rules.yml"


@pytest.fixture(scope="module")
def host():
    return podman_host(HOST)


@pytest.fixture(scope="module")
def address(host):
    return host.check_output("hostname -I").split()[0]


def api(host, address, path, **params):
    encoded = " ".join(f"--data-urlencode {shlex.quote(f'{k}={v}')}" for k, v in params.items())
    out = host.check_output(f"curl -sfG http://{address}:9090/api/v1/{path} {encoded}")
    body = json.loads(out)
    assert body["status"] == "success", body
    return body["data"]


def eventually(probe, what: str, timeout: float = 60):
    """Poll ``probe`` (returns (done, last_seen)) until done; on timeout, say what was seen."""
    deadline = time.monotonic() + timeout
    while True:
        done, seen = probe()
        if done:
            return seen
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}; last seen {seen}"
        time.sleep(1)


def listeners(host, port):
    return [s for s in host.socket.get_listening_sockets() if s.endswith(f":{port}")]


def test_both_listen_only_on_the_hosts_address(host, address):
    assert host.service("prometheus").is_running
    assert host.service("prometheus").is_enabled
    assert host.service("prometheus-node-exporter").is_running

    # Both are Type=simple: "running" comes before the listener on a slow host.
    def bound():
        seen = (listeners(host, 9090), listeners(host, 9100))
        return all(seen), seen

    eventually(bound, "both listening")
    assert listeners(host, 9090) == [f"tcp://{address}:9090"]
    assert listeners(host, 9100) == [f"tcp://{address}:9100"]


def test_every_target_is_up(host, address):
    def probe():
        targets = api(host, address, "targets", state="active")["activeTargets"]
        seen = [(t["labels"]["job"], t["health"], t.get("lastError")) for t in targets]
        return all(t["health"] == "up" for t in targets), (targets, seen)

    targets, _ = eventually(probe, "every target up")
    assert {t["labels"]["job"] for t in targets} == {"prometheus", "node"}
    (node,) = [t for t in targets if t["labels"]["job"] == "node"]
    assert node["labels"]["fleet_host"] == HOST


def test_every_shipped_alert_is_loaded_and_evaluates(host, address):
    shipped = {
        r["alert"]
        for g in yaml.safe_load(ALERTS.read_text())["groups"]
        for r in g["rules"]
        if "alert" in r
    }

    def probe():
        loaded = {
            r["name"]: r
            for g in api(host, address, "rules")["groups"]
            for r in g["rules"]
            if r["type"] == "alerting"
        }
        # "unknown" until the rule's first evaluation after a (re)load; "err" is a failure.
        pending = {
            n: (r["health"], r.get("lastError")) for n, r in loaded.items() if r["health"] != "ok"
        }
        return not pending, (loaded, pending)

    loaded, _ = eventually(probe, "every alert rule evaluated without error")
    assert shipped == set(loaded)


def test_a_stopped_exporter_is_seen_down_and_back(host, address):
    # This host's target only: Debian's package starts Prometheus on its default config
    # (job "node" at localhost:9100) before the role's replaces it, and a restart leaves
    # that series visible for the 5 min lookback with no staleness marker.
    query = f'up{{job="node", fleet_host="{HOST}"}}'

    def node_is(value: str):
        def probe():
            result = api(host, address, "query", query=query)["result"]
            target = api(host, address, "targets", state="active")["activeTargets"]
            node = [
                (t["health"], t.get("lastError")) for t in target if t["labels"]["job"] == "node"
            ]
            return [r["value"][1] for r in result] == [value], (result, node)

        return probe

    host.check_output("systemctl stop prometheus-node-exporter")
    try:
        eventually(node_is("0"), "Prometheus sees the exporter down")
    finally:
        host.check_output("systemctl start prometheus-node-exporter")
    eventually(node_is("1"), "Prometheus sees the exporter back")


def test_the_deploy_record_is_local_facts(host):
    record = json.loads(host.file("/etc/vllm-fleet/deployed.json").content_string)
    assert set(record) == {"applied_at", "commit", "dirty", "models", "settings_sha256", "stack"}
    assert len(record["commit"]) == 40 or record["commit"] == "unknown"
    fact = host.file("/etc/ansible/facts.d/vllm_fleet.fact")
    assert fact.is_symlink
    assert fact.linked_to == "/etc/vllm-fleet/deployed.json"
