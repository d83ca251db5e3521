"""Prometheus on the lab's monitoring host: every target scraped, the fleet's rules loaded,
a stopped engine fires the engine-down alert, and every dashboard query returns data.

Prometheus (Debian's package, installed by the monitoring role in site.yml) listens on
router01's address; the lab publishes it on 127.0.0.1:9090 (it scrapes both routers).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import yaml

from tests.lab.faults import ROUTERS, VIP, vip_holder
from tests.support.lab import ROOT, in_host
from vllm_fleet.lab.paths import LAB_ROUTER_URL
from vllm_fleet.monitoring.dashboard import load_dashboard, panel_queries, render_query

PROMETHEUS = "http://127.0.0.1:9090"
DRAIN = "/run/vllm-fleet/router-drain"  # router_drain_flag
ALERTS_FILE = ROOT / "roles/monitoring/files/vllm-fleet-alerts.rules.yml"
ENGINE_DOWN = "VllmEngineDown"
ROUTER = LAB_ROUTER_URL


def api(path: str, **params: str) -> Any:
    response = httpx.get(f"{PROMETHEUS}/api/v1/{path}", params=params, timeout=30)
    response.raise_for_status()
    body = response.json()
    assert body["status"] == "success", body
    return body["data"]


def wait_for(what: str, condition: Callable[[], Any], timeout: float, every: float = 2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(every)


def firing(alert: str, **labels: str) -> list[dict[str, Any]]:
    return [
        a
        for a in api("alerts")["alerts"]
        if a["labels"].get("alertname") == alert
        and a["state"] == "firing"
        and all(a["labels"].get(k) == v for k, v in labels.items())
    ]


def test_every_target_is_scraped(fresh_lab):
    targets = api("targets", state="active")["activeTargets"]
    jobs = {t["labels"]["job"] for t in targets}
    assert jobs == {"vllm-engine", "vllm-fleet-router", "vllm-fleet-watchdog", "node", "prometheus"}
    down = [(t["scrapeUrl"], t["lastError"]) for t in targets if t["health"] != "up"]
    assert not down
    engines = {t["labels"]["fleet_host"] for t in targets if t["labels"]["job"] == "vllm-engine"}
    assert engines == {"engine01", "engine02"}
    nodes = {t["labels"]["fleet_host"] for t in targets if t["labels"]["job"] == "node"}
    assert nodes == {"router01", "router02", "engine01", "engine02"}
    routers = {
        t["labels"]["fleet_host"] for t in targets if t["labels"]["job"] == "vllm-fleet-router"
    }
    assert routers == {"router01", "router02"}


def verify_metric(name: str) -> list[dict[str, Any]]:
    return api("query", query=name)["result"]


def test_site_yml_verification_reports_through_node_exporter(fresh_lab):
    (crosstalk,) = verify_metric('vllm_fleet_verify_check_ok{check="crosstalk"}')
    assert crosstalk["value"][1] == "1"
    assert crosstalk["metric"]["fleet_host"] == "router01"
    (passed,) = verify_metric("vllm_fleet_verify_passed")
    assert passed["value"][1] == "1"


# make test: the verification itself runs at the end of every site.yml and in verify.yml,
# and reports through node exporter (above); the scheduled unit's own run, make test-all.
@pytest.mark.full
def test_the_scheduled_verification_reports_through_node_exporter(fresh_lab):
    """site.yml's verification wrote its result for node exporter; the scheduled unit runs
    the same verification and moves the timestamp Prometheus sees."""
    (crosstalk,) = verify_metric('vllm_fleet_verify_check_ok{check="crosstalk"}')
    assert crosstalk["value"][1] == "1"
    assert crosstalk["metric"]["fleet_host"] == "router01"
    (before,) = verify_metric("vllm_fleet_verify_last_run_timestamp_seconds")

    # Type=oneshot: returns when the verification finished, non-zero when it failed.
    in_host("router01", "systemctl", "start", "vllm-fleet-verify.service")
    wait_for(
        "the scheduled run's timestamp in Prometheus",
        lambda: (
            float(verify_metric("vllm_fleet_verify_last_run_timestamp_seconds")[0]["value"][1])
            > float(before["value"][1])
        ),
        timeout=30,
    )
    (passed,) = verify_metric("vllm_fleet_verify_passed")
    assert passed["value"][1] == "1"


def test_the_fleets_rules_are_loaded_and_evaluate(fresh_lab):
    shipped = {
        rule["alert"]
        for group in yaml.safe_load(ALERTS_FILE.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    loaded = {
        rule["name"]: rule
        for group in api("rules")["groups"]
        for rule in group["rules"]
        if rule["type"] == "alerting"
    }
    assert shipped <= set(loaded)
    assert all(loaded[name]["health"] == "ok" for name in shipped), loaded
    # The inventory's facts are there to join against.
    workers = api("query", query="vllm_fleet:router_worker_info")["result"]
    assert {w["metric"]["worker"] for w in workers} == {
        "http://10.89.0.21:8100",
        "http://10.89.0.22:8100",
    }


def test_a_healthy_fleet_fires_no_critical_alert(fresh_lab):
    critical = [
        a["labels"]
        for a in api("alerts")["alerts"]
        if a["labels"].get("severity") == "critical" and a["state"] == "firing"
    ]
    assert not critical


def vip_held() -> dict[str, float]:
    """Router host -> whether it holds the VIP, as Prometheus last scraped it."""
    result = api("query", query="vllm_fleet_router_vip_held")["result"]
    return {r["metric"]["fleet_host"]: float(r["value"][1]) for r in result}


def test_each_router_records_whether_it_holds_the_vip(fresh_lab):
    """Every router host reports; exactly one holds the VIP, the one keepalived gave it to."""
    held = wait_for("every router's VIP metric", lambda: set(vip_held()) == set(ROUTERS), 60)
    held = vip_held()
    assert sorted(held.values()) == [0.0, 1.0], held
    holder = vip_holder()
    assert holder is not None and held[holder] == 1.0, (holder, held)


@pytest.fixture
def every_router_drained(fresh_lab):
    """Both routers drained at once (what a controller killed mid-restart on each leaves):
    keepalived's check fails on both and neither may hold the VIP."""
    for host in ROUTERS:
        in_host(host, "touch", DRAIN)
    try:
        yield
    finally:
        for host in ROUTERS:
            in_host(host, "rm", "-f", DRAIN)
        wait_for("the VIP answering again", vip_answers, 120)


def vip_answers() -> bool:
    try:
        return httpx.get(f"{ROUTER}/liveness", timeout=3).status_code == 200
    except httpx.HTTPError:
        return False


def test_no_router_holding_the_vip_fires_its_alert(every_router_drained):
    settings = prometheus_settings()
    # The rule's for: 30s, plus a scrape, an evaluation and the hosts' 5 s record, twice over.
    deadline = 2 * (30 + settings["scrape"] + settings["evaluation"] + 5)
    wait_for("the VIP to leave every router", lambda: not vip_answers(), 30, every=1)
    alerts = wait_for(
        "VllmFleetRouterVipNoHolder", lambda: firing("VllmFleetRouterVipNoHolder"), deadline
    )
    assert alerts[0]["labels"]["vip"] == VIP, alerts
    assert not firing("VllmFleetRouterVipSplit")


def prometheus_settings() -> dict[str, float]:
    """The scrape and rule evaluation intervals Prometheus runs with (seconds)."""
    config = yaml.safe_load(api("status/config")["yaml"])["global"]
    return {
        "scrape": seconds(config["scrape_interval"]),
        "evaluation": seconds(config["evaluation_interval"]),
    }


def seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for unit in ("ms", "s", "m", "h"):
        if duration.endswith(unit):
            return float(duration[: -len(unit)]) * units[unit]
    raise ValueError(duration)


@pytest.fixture
def engine02_stopped(fresh_lab):
    in_host("engine02", "systemctl", "stop", "vllm-engine@g0.service")
    try:
        yield
    finally:
        # Type=notify: returns once the group serves again and has joined the router.
        in_host("engine02", "systemctl", "start", "vllm-engine@g0.service")


# make test: promtool's rule tests (unit) fire EngineDown on a target that is down, and the
# monitoring scenario's real Prometheus sees its stopped exporter down.
@pytest.mark.full
def test_a_stopped_engine_fires_engine_down(engine02_stopped):
    alerts = wait_for(
        f"{ENGINE_DOWN} for engine02 to fire",
        lambda: firing(ENGINE_DOWN, fleet_host="engine02"),
        timeout=150,
        every=5,
    )
    assert alerts[0]["labels"]["fleet_group"] == "g0"
    assert alerts[0]["annotations"]["runbook"]
    assert not firing(ENGINE_DOWN, fleet_host="engine01")


def some_router_traffic() -> None:
    key = (ROOT / ".lab/secrets/router_client_key").read_text().strip()
    for n in range(6):
        response = httpx.post(
            f"{ROUTER}/v1/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={"model": "smollm2", "prompt": f"Count to {n}:", "max_tokens": 4},
            timeout=60,
        )
        assert response.status_code == 200, response.text


def test_every_dashboard_query_returns_data(fresh_lab):
    some_router_traffic()
    time.sleep(12)  # two scrapes at the lab's 5 s interval
    variables = {"host": "engine01", "group": "g0", "datasource": "prometheus"}
    empty = []
    queries = panel_queries(load_dashboard())
    for query in queries:
        promql = render_query(query.expr, variables, interval="1m", scrape_interval="5s")
        if not api("query", query=promql)["result"]:
            empty.append(f"{query.title} [{query.ref_id}]: {promql}")
    assert not empty, "\n".join(empty)
    print(f"\n{len(queries)} dashboard queries, each returned data")
