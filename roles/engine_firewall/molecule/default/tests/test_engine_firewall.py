"""The engine port answers the router and the host itself, and drops the rogue host; the
metrics ports answer only the monitoring host and the host itself; a port that is no
engine's stays open to all; the rules are one table, loaded at boot by its unit."""

from __future__ import annotations

import json

import pytest
from tests.molecule_hosts import podman_host
from tests.support.reach import probe_command

ENGINE, ROUTER, ROGUE = "vf-firewall", "vf-firewall-router", "vf-firewall-rogue"
MONITOR = "vf-firewall-monitor"
ENGINE_DROP, METRICS_DROP = "not a router, monitoring host", "not a monitoring host"


@pytest.fixture(scope="module")
def engine():
    return podman_host(ENGINE)


@pytest.fixture(scope="module")
def address(engine):
    return engine.check_output("hostname -I").split()[0]


def reach(client: str, url: str) -> str:
    host = podman_host(client)
    return host.check_output(probe_command(url))


def test_the_router_and_the_host_itself_reach_the_engine_port(engine, address):
    assert reach(ROUTER, f"http://{address}:8100/") == "open"
    assert reach(ENGINE, f"http://{address}:8100/") == "open"
    assert reach(ENGINE, "http://127.0.0.1:8100/") == "open"


def test_a_rogue_host_is_dropped_at_the_engine_port_and_counted(engine, address):
    before = dropped(engine, ENGINE_DROP)
    assert reach(ROGUE, f"http://{address}:8100/") == "dropped"
    assert dropped(engine, ENGINE_DROP) > before


@pytest.mark.parametrize("port", [9410, 9100])
def test_the_metrics_ports_answer_only_the_monitoring_host_and_the_host_itself(
    engine, address, port
):
    """The watchdog's and node exporter's metrics carry no authentication: the router needs
    none of them, and a rogue host gets nothing."""
    before = dropped(engine, METRICS_DROP)
    assert reach(MONITOR, f"http://{address}:{port}/") == "open"
    assert reach(ENGINE, f"http://{address}:{port}/") == "open"
    assert reach(ROUTER, f"http://{address}:{port}/") == "dropped"
    assert reach(ROGUE, f"http://{address}:{port}/") == "dropped"
    assert dropped(engine, METRICS_DROP) >= before + 2


def test_a_port_that_is_no_engines_is_left_alone(address):
    assert reach(ROGUE, f"http://{address}:8200/") == "open"


def test_the_rules_are_one_table_with_the_routers_address(engine):
    table = rules(engine)
    sets = {s["name"]: s.get("elem", []) for s in table if "set" in s for s in [s["set"]]}
    assert sets["engine_ports"] == [8100]
    assert sorted(sets["metrics_ports"]) == [9100, 9410]
    monitor = podman_host(MONITOR).check_output("hostname -I").split()[0]
    assert sets["monitoring_ipv4"] == [monitor]
    router = podman_host(ROUTER).check_output("hostname -I").split()[0]
    rogue = podman_host(ROGUE).check_output("hostname -I").split()[0]
    assert router in sets["allowed_ipv4"] and rogue not in sets["allowed_ipv4"]


def test_its_unit_loads_them_at_boot_and_a_reload_keeps_one_table(engine):
    unit = engine.service("vllm-fleet-engine-firewall.service")
    assert unit.is_enabled and unit.is_running
    engine.check_output("systemctl reload vllm-fleet-engine-firewall.service")
    listing = engine.check_output("nft list tables")
    assert listing.count("inet vllm_fleet_engines") == 1


def rules(engine) -> list[dict]:
    out = engine.check_output("nft --json list table inet vllm_fleet_engines")
    return [item for item in json.loads(out)["nftables"] if "metainfo" not in item]


def dropped(engine, comment: str) -> int:
    """Packets counted by the drop rule whose comment starts with ``comment``."""
    for item in rules(engine):
        rule = item.get("rule", {})
        if not rule.get("comment", "").startswith(f"vllm-fleet: {comment}"):
            continue
        for expr in rule.get("expr", []):
            if "counter" in expr:
                return int(expr["counter"]["packets"])
    raise AssertionError(f"no drop counter for {comment!r} in the table")
