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


def listeners(host, port):
    return [s for s in host.socket.get_listening_sockets() if s.endswith(f":{port}")]


def test_both_listen_only_on_the_hosts_address(host, address):
    assert host.service("prometheus").is_running
    assert host.service("prometheus").is_enabled
    assert host.service("prometheus-node-exporter").is_running
    assert listeners(host, 9090) == [f"tcp://{address}:9090"]
    assert listeners(host, 9100) == [f"tcp://{address}:9100"]


def test_every_target_is_up(host, address):
    targets = api(host, address, "targets", state="active")["activeTargets"]
    assert {t["labels"]["job"] for t in targets} == {"prometheus", "node"}
    assert all(t["health"] == "up" for t in targets), targets
    (node,) = [t for t in targets if t["labels"]["job"] == "node"]
    assert node["labels"]["fleet_host"] == HOST


def test_every_shipped_alert_is_loaded_and_evaluates(host, address):
    shipped = {
        r["alert"]
        for g in yaml.safe_load(ALERTS.read_text())["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    time.sleep(3)  # at least one evaluation after the last (re)load
    loaded = {
        r["name"]: r
        for g in api(host, address, "rules")["groups"]
        for r in g["rules"]
        if r["type"] == "alerting"
    }
    assert shipped == set(loaded)
    broken = {name: r.get("lastError") for name, r in loaded.items() if r["health"] != "ok"}
    assert not broken


def test_a_stopped_exporter_is_seen_down_and_back(host, address):
    def node_up() -> list[str]:
        result = api(host, address, "query", query='up{job="node"}')["result"]
        return [r["value"][1] for r in result]

    host.check_output("systemctl stop prometheus-node-exporter")
    try:
        deadline = time.monotonic() + 30
        while node_up() != ["0"]:
            assert time.monotonic() < deadline, "Prometheus never saw the exporter down"
            time.sleep(1)
    finally:
        host.check_output("systemctl start prometheus-node-exporter")
    deadline = time.monotonic() + 30
    while node_up() != ["1"]:
        assert time.monotonic() < deadline, "Prometheus never saw the exporter back"
        time.sleep(1)


def test_the_deploy_record_is_local_facts(host):
    record = json.loads(host.file("/etc/vllm-fleet/deployed.json").content_string)
    assert set(record) == {"applied_at", "commit", "dirty", "models", "settings_sha256", "stack"}
    assert len(record["commit"]) == 40 or record["commit"] == "unknown"
    fact = host.file("/etc/ansible/facts.d/vllm_fleet.fact")
    assert fact.is_symlink
    assert fact.linked_to == "/etc/vllm-fleet/deployed.json"
