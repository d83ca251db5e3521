"""The shipped Grafana dashboard: its structure, and every query parsed by the real promtool.

promtool (Prometheus 2.42, the version the monitoring role installs) parses each rendered
query as a recording rule, so a query that would not run in Prometheus fails here.
"""

from __future__ import annotations

import json
import re
import subprocess
from itertools import combinations
from pathlib import Path
from typing import Any

import pytest

from vllm_fleet.monitoring.dashboard import (
    DASHBOARD_PATH,
    MACROS,
    UnsupportedVariable,
    iter_panels,
    load_dashboard,
    panel_queries,
    referenced_variables,
    render_query,
    variable_names,
)

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
ROWS = ["Fleet overview", "Per engine"]
ONE_ENGINE = {"host": "gpu-01", "group": "g0"}
NO_DATA_PANELS = {"row", "text", "news", "dashlist"}

ENGINE_JOB = "vllm-engine"
ROUTER_JOB = "vllm-fleet-router"
WATCHDOG_JOB = "vllm-fleet-watchdog"
# The metrics contract: what each job exports that the dashboard may use.
JOB_METRICS = {
    ENGINE_JOB: [
        "vllm:kv_cache_usage_perc",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:num_preemptions_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:request_queue_time_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "up",
    ],
    ROUTER_JOB: [
        "smg_http_responses_total",
        "smg_worker_health",
        "smg_worker_cb_state",
        "smg_worker_requests_active",
        "smg_router_request_duration_seconds_bucket",
        "up",
    ],
    WATCHDOG_JOB: [
        "vllm_fleet_watchdog_state",
        "vllm_fleet_watchdog_restarts_total",
        "vllm_fleet_watchdog_probe_seconds_bucket",
        "vllm_fleet_watchdog_registered",
        "up",
    ],
}
CONTRACT = {
    metric: {job for job, metrics in JOB_METRICS.items() if metric in metrics}
    for metrics in JOB_METRICS.values()
    for metric in metrics
}
_SELECTOR = re.compile(r"(?P<metric>[A-Za-z_:][\w:]*)\{(?P<matchers>[^}]*)\}")
_JOB = re.compile(r'\bjob="([^"]*)"')
_LABEL_VALUES = re.compile(r"label_values\((?P<selector>.+),\s*(?P<label>\w+)\)")


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return load_dashboard()


def data_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for _, p in iter_panels(dashboard) if p.get("type") not in NO_DATA_PANELS]


def query_variables(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [v for v in dashboard["templating"]["list"] if v["type"] == "query"]


def check_rules(promtool: Path, tmp_path: Path, exprs: list[str]) -> subprocess.CompletedProcess:
    """promtool check rules over the exprs as recording rules (JSON is YAML to promtool)."""
    rules = [{"record": f"dashboard:q{i}", "expr": expr} for i, expr in enumerate(exprs)]
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}, indent=2))
    return subprocess.run(
        [str(promtool), "check", "rules", str(path)], capture_output=True, text=True, check=False
    )


# --- structure ---------------------------------------------------------------------------


def test_dashboard_identity(dashboard):
    assert DASHBOARD_PATH.is_file()
    assert dashboard["uid"] == "vllm-fleet"
    assert dashboard["title"]
    assert dashboard["schemaVersion"] == 39


def test_rows_hold_every_panel(dashboard):
    rows = [p["title"] for _, p in iter_panels(dashboard) if p["type"] == "row"]
    assert rows == ROWS
    assert {row for row, _ in iter_panels(dashboard)} == set(ROWS)


def test_panel_ids_are_unique_integers(dashboard):
    ids = [p["id"] for _, p in iter_panels(dashboard)]
    assert all(isinstance(i, int) and i > 0 for i in ids)
    assert len(ids) == len(set(ids))


def test_every_panel_is_titled_and_described(dashboard):
    for panel in data_panels(dashboard):
        assert panel.get("title", "").strip(), panel["id"]
        assert panel.get("description", "").strip(), panel["title"]


def test_every_data_panel_has_a_query(dashboard):
    for panel in data_panels(dashboard):
        targets = panel.get("targets", [])
        assert any(str(t.get("expr", "")).strip() for t in targets), panel["title"]
        ref_ids = [t["refId"] for t in targets]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]


def test_panel_queries_cover_every_target(dashboard):
    queries = panel_queries(dashboard)
    assert len(queries) == sum(len(p.get("targets", [])) for p in data_panels(dashboard))
    assert [q.title for q in queries if q.instant] == ["Watchdog state per group"]


def test_layout_fits_and_panels_do_not_overlap(dashboard):
    boxes = []
    for _, panel in iter_panels(dashboard):
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        boxes.append((panel["title"], pos))
    for (a, p), (b, q) in combinations(boxes, 2):
        apart_x = p["x"] + p["w"] <= q["x"] or q["x"] + q["w"] <= p["x"]
        apart_y = p["y"] + p["h"] <= q["y"] or q["y"] + q["h"] <= p["y"]
        assert apart_x or apart_y, f"{a!r} overlaps {b!r}"


def test_datasource_is_one_template_variable(dashboard):
    text = DASHBOARD_PATH.read_text()
    assert "__inputs" not in dashboard
    assert "DS_PROMETHEUS" not in text
    (source,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert (source["name"], source["query"]) == ("datasource", "prometheus")
    for panel in data_panels(dashboard):
        assert panel["datasource"] == DATASOURCE, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, (panel["title"], target["refId"])
    for variable in query_variables(dashboard):
        assert variable["datasource"] == DATASOURCE, variable["name"]


def test_engine_variables(dashboard):
    queries = {v["name"]: v["definition"] for v in query_variables(dashboard)}
    assert queries == {
        "host": 'label_values(up{job="vllm-engine"}, fleet_host)',
        "group": 'label_values(up{job="vllm-engine", fleet_host="$host"}, fleet_group)',
    }
    for variable in query_variables(dashboard):
        assert variable["query"]["query"] == variable["definition"]
        # Single values: render_query and the dashboard's ="$var" matchers assume that.
        assert not variable["multi"] and not variable["includeAll"], variable["name"]


def test_every_variable_used_is_defined(dashboard):
    defined = set(variable_names(dashboard))
    for query in panel_queries(dashboard):
        assert referenced_variables(query.expr) - MACROS <= defined, (query.title, query.ref_id)
    # A variable's own query may only use the variables before it (Grafana resolves in order).
    seen: set[str] = set()
    for variable in dashboard["templating"]["list"]:
        assert referenced_variables(variable.get("definition", "")) <= seen, variable["name"]
        seen.add(variable["name"])


def test_fleet_row_is_fleet_wide_and_engine_row_is_one_engine(dashboard):
    for query in panel_queries(dashboard):
        used = referenced_variables(query.expr) - MACROS
        expected = set() if query.row == "Fleet overview" else {"host", "group"}
        assert used == expected, (query.row, query.title, query.ref_id)


def test_queries_use_only_contract_metrics_of_their_job(dashboard):
    for query in panel_queries(dashboard):
        selectors = list(_SELECTOR.finditer(query.expr))
        assert selectors, query.title
        for selector in selectors:
            metric = selector["metric"]
            assert metric in CONTRACT, (query.title, metric)
            jobs = _JOB.findall(selector["matchers"])
            assert len(jobs) == 1 and jobs[0] in CONTRACT[metric], (query.title, selector[0])


# --- promtool ----------------------------------------------------------------------------


def test_every_rendered_query_is_valid_promql(dashboard, promtool, tmp_path):
    exprs = [render_query(q.expr, ONE_ENGINE) for q in panel_queries(dashboard)]
    result = check_rules(promtool, tmp_path, exprs)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in result.stdout


def test_variable_selectors_are_valid_promql(dashboard, promtool, tmp_path):
    selectors = []
    for variable in query_variables(dashboard):
        match = _LABEL_VALUES.fullmatch(variable["definition"])
        assert match, variable["definition"]
        selectors.append(render_query(match["selector"], ONE_ENGINE))
    result = check_rules(promtool, tmp_path, selectors)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    "expr",
    [
        'sum(rate(up{job="vllm-engine"}[5m])',  # unbalanced parenthesis
        'rate(up{job="vllm-engine"}[$__rate_interval])',  # Grafana's macro, unrendered
        "histogram_quantile(0.99, sum by (le) (rate(x_bucket[1m]))",
    ],
)
def test_promtool_check_fails_on_invalid_promql(promtool, tmp_path, expr):
    result = check_rules(promtool, tmp_path, ["up", expr])
    assert result.returncode != 0
    assert '"dashboard:q1": could not parse expression' in result.stderr


# --- render_query ------------------------------------------------------------------------


def test_render_substitutes_dashboard_variables_in_both_syntaxes():
    expr = 'up{fleet_host="$host", fleet_group="${group}"}'
    rendered = render_query(expr, ONE_ENGINE)
    assert rendered == 'up{fleet_host="gpu-01", fleet_group="g0"}'


@pytest.mark.parametrize(
    ("interval", "scrape", "expected"),
    [
        ("1m", "15s", "75s"),  # interval + scrape
        ("15s", "15s", "1m"),  # four scrapes
        ("5m", "30s", "330s"),
        ("500ms", "1s", "4s"),
        ("1h", "15s", "3615s"),
    ],
)
def test_rate_interval_follows_grafana(interval, scrape, expected):
    rendered = render_query("rate(x[$__rate_interval])", {}, interval, scrape_interval=scrape)
    assert rendered == f"rate(x[{expected}])"


def test_interval_and_range_macros():
    expr = "$__interval $__interval_ms ${__range} $__range_s $__range_ms"
    rendered = render_query(expr, {}, "30s", time_range="6h")
    assert rendered == "30s 30000 6h 21600 21600000"
    assert render_query("$__range", {}, time_range="1h30m") == "90m"


def test_values_are_inserted_once_not_rendered_again():
    assert render_query('x{a="$host"}', {"host": "$group"}) == 'x{a="$group"}'


def test_a_dollar_that_is_no_variable_stays():
    expr = 'up{fleet_host=~"gpu-.*$"}'
    assert render_query(expr, {}) == expr


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ('up{fleet_host="$hots"}', "unknown variable 'hots'"),
        ("rate(x[$__from])", "unknown variable '__from'"),
        ('label_replace(up, "a", "$1", "b", "(.*)")', "unknown variable '1'"),
        ('up{fleet_host=~"${host:regex}"}', "only $name and ${name}"),
        ('up{fleet_host="${}"}', "only $name and ${name}"),
        ('up{fleet_host="[[host]]"}', "deprecated [[name]]"),
    ],
)
def test_unsupported_variables_raise(expr, message):
    with pytest.raises(UnsupportedVariable, match=re.escape(message)):
        render_query(expr, ONE_ENGINE)


@pytest.mark.parametrize(
    "variables",
    [{"host": 'a"b'}, {"host": "a\\b"}, {"host": "a\nb"}, {"__interval": "5m"}],
)
def test_values_that_would_break_the_query_are_refused(variables):
    with pytest.raises(ValueError):
        render_query("up", variables)


@pytest.mark.parametrize("duration", ["", "1", "1x", "0s", "1m ", "-1m", "1.5m"])
def test_invalid_durations_are_refused(duration):
    with pytest.raises(ValueError, match="duration"):
        render_query("up", {}, duration)


# --- walking panels ----------------------------------------------------------------------


def test_panel_queries_walk_expanded_and_collapsed_rows():
    def panel(pid, title, *targets):
        return {"id": pid, "type": "timeseries", "title": title, "targets": list(targets)}

    synthetic = {
        "panels": [
            panel(1, "top", {"refId": "A", "expr": "up"}),
            {"id": 2, "type": "row", "title": "open", "collapsed": False, "panels": []},
            panel(
                3,
                "in open",
                {"refId": "A", "expr": " sum(up) "},
                {"refId": "B", "expr": "up", "hide": True},
                {"refId": "C", "expr": ""},
            ),
            {
                "id": 4,
                "type": "row",
                "title": "closed",
                "collapsed": True,
                "panels": [panel(5, "in closed", {"refId": "A", "expr": "x", "instant": True})],
            },
        ]
    }
    got = [
        (q.row, q.panel_id, q.title, q.ref_id, q.expr, q.instant) for q in panel_queries(synthetic)
    ]
    assert got == [
        (None, 1, "top", "A", "up", False),
        ("open", 3, "in open", "A", "sum(up)", False),
        ("closed", 5, "in closed", "A", "x", True),
    ]


def test_load_dashboard_refuses_other_json(tmp_path):
    path = tmp_path / "not.json"
    path.write_text('{"title": "no panels"}')
    with pytest.raises(ValueError, match="no panels"):
        load_dashboard(path)
