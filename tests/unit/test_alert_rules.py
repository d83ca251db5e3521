"""The fleet's Prometheus alert rules, checked and unit-tested with the real promtool.

The promtool test files (tests/fixtures/alerts/*.test.yml) feed series to the rules and the
inventory's recording rules and say which alerts fire when, labels and annotations included.
Here: both rule files load, every test file passes, every alert is annotated and has a case
where it fires and one where it must not, and a rule made wrong makes its tests fail.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.paths import ROOT as REPO

ALERTS = REPO / "roles/monitoring/files/vllm-fleet-alerts.rules.yml"
FIXTURES = REPO / "tests/fixtures/alerts"
INVENTORY = FIXTURES / "inventory.rules.yml"
TEST_FILES = sorted(FIXTURES.glob("*.test.yml"))

SEVERITIES = {"critical", "warning"}
ANNOTATIONS = ("summary", "description", "runbook")
# Alerts about the fleet as a whole, whose series carry no host, group or model.
FLEET_WIDE = {"VllmFleetVerificationStale"}


def _load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), path
    return data


def _alert_rules() -> list[dict[str, Any]]:
    groups = _load(ALERTS)["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def _alert_cases() -> list[dict[str, Any]]:
    """Every alert_rule_test entry of every test file."""
    return [
        case
        for path in TEST_FILES
        for test in _load(path)["tests"]
        for case in test.get("alert_rule_test", [])
    ]


def _promtool(promtool: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool), *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_the_fixtures_exist() -> None:
    assert ALERTS.is_file()
    assert INVENTORY.is_file()
    assert len(TEST_FILES) >= 3, TEST_FILES


@pytest.mark.parametrize("rules", [ALERTS, INVENTORY], ids=lambda p: p.name)
def test_promtool_check_rules(promtool: Path, rules: Path) -> None:
    result = _promtool(promtool, "check", "rules", str(rules))
    assert result.returncode == 0, result.stdout + result.stderr
    count = sum(len(group["rules"]) for group in _load(rules)["groups"])
    assert f"SUCCESS: {count} rules found" in result.stdout


def test_the_inventory_sample_has_the_rendered_shape() -> None:
    (group,) = _load(INVENTORY)["groups"]
    assert group["name"] == "vllm-fleet-inventory"
    thresholds = [
        r for r in group["rules"] if r["record"] == "vllm_fleet:ttft_p99_threshold_seconds"
    ]
    workers = [r for r in group["rules"] if r["record"] == "vllm_fleet:router_worker_info"]
    assert len(thresholds) + len(workers) == len(group["rules"])
    assert all(set(r["labels"]) == {"model_name"} for r in thresholds)
    assert all(
        set(r["labels"]) == {"worker", "model_name", "fleet_host", "fleet_group"} for r in workers
    )
    # Every model that has workers has a threshold, and per-model behaviour needs two models.
    models = {r["labels"]["model_name"] for r in workers}
    assert models == {r["labels"]["model_name"] for r in thresholds}
    assert len(models) >= 2


@pytest.mark.parametrize("test_file", TEST_FILES, ids=lambda p: p.name)
def test_promtool_test_rules(promtool: Path, test_file: Path) -> None:
    result = _promtool(promtool, "test", "rules", str(test_file))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize("test_file", TEST_FILES, ids=lambda p: p.name)
def test_test_files_load_the_real_rules(test_file: Path) -> None:
    loaded = {(test_file.parent / name).resolve() for name in _load(test_file)["rule_files"]}
    assert loaded == {ALERTS, INVENTORY}


def test_every_alert_is_labelled_and_annotated() -> None:
    rules = _alert_rules()
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names)), "duplicate alert names"
    for rule in rules:
        name = rule["alert"]
        assert re.fullmatch(r"Vllm(Fleet)?[A-Z][A-Za-z0-9]+", name), name
        assert rule["labels"]["severity"] in SEVERITIES, name
        annotations = rule["annotations"]
        for key in ANNOTATIONS:
            assert isinstance(annotations.get(key), str), (name, key)
            assert annotations[key].strip(), (name, key)
            assert "\n" not in annotations[key], (name, key)
        # Summaries say where (host, group, model or router), unless the alert is fleet-wide.
        if name not in FLEET_WIDE:
            assert "{{ $labels." in annotations["summary"], name
        if "for" in rule:
            assert re.fullmatch(r"\d+[smh]", rule["for"]), (name, rule["for"])


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    names = {rule["alert"] for rule in _alert_rules()}
    cases = _alert_cases()
    tested = {case["alertname"] for case in cases}
    # promtool expects nothing of an alert it does not know: a misspelt name passes quietly.
    assert tested <= names, f"test cases for unknown alerts: {sorted(tested - names)}"
    fires = {case["alertname"] for case in cases if case.get("exp_alerts")}
    # Explicitly `exp_alerts: []`, not left out.
    quiet = {case["alertname"] for case in cases if case.get("exp_alerts", None) == []}
    assert not names - fires, f"alerts never expected to fire: {sorted(names - fires)}"
    assert not names - quiet, f"alerts never expected to stay quiet: {sorted(names - quiet)}"


def _with_rules(test_file: Path, rules: Path, dest: Path) -> Path:
    """A copy of test_file, in dest, that loads `rules` instead of the role's file."""
    data = _load(test_file)
    data["rule_files"] = [str(rules), str(INVENTORY)]
    copy = dest / test_file.name
    copy.write_text(yaml.safe_dump(data, sort_keys=False))
    return copy


def _mutated(alert: str, change: dict[str, str], dest: Path) -> Path:
    """The alert rules with one alert changed: another for:, or expr text replaced wherever
    it occurs (whitespace in `old` matches any whitespace)."""
    data = _load(ALERTS)
    (rule,) = [r for g in data["groups"] for r in g["rules"] if r.get("alert") == alert]
    if "for" in change:
        rule["for"] = change["for"]
    else:
        pattern = r"\s+".join(map(re.escape, change["old"].split()))
        rule["expr"], count = re.subn(pattern, lambda _: change["new"], rule["expr"])
        assert count, (alert, change["old"])
    path = dest / "mutated.rules.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# Rules made wrong on purpose, each with the test file that must catch it:
# (id, alert, change, test file); a change is {"for": ...} or {"old": ..., "new": ...}.
MUTATIONS: list[tuple[str, str, dict[str, str], str]] = [
    # A threshold: 95% full no longer counts.
    (
        "kv-threshold",
        "VllmKvCacheNearlyFull",
        {"old": "> 0.9", "new": "> 0.96"},
        "engine_load.test.yml",
    ),
    # A for: duration.
    ("kv-for", "VllmKvCacheNearlyFull", {"for": "5m"}, "engine_load.test.yml"),
    # The traffic guard: a trickle of slow requests would alert.
    (
        "ttft-guard",
        "VllmTtftP99High",
        {"old": ") > 0.1", "new": ") > 0.01"},
        "engine_load.test.yml",
    ),
    # The per-model threshold ignored: qwen3-8b (8s) would alert at smollm2's 2s.
    (
        "ttft-per-model",
        "VllmTtftP99High",
        {
            "old": "> on (model_name) group_left () vllm_fleet:ttft_p99_threshold_seconds",
            "new": "> 2",
        },
        "engine_load.test.yml",
    ),
    # "Open" instead of "not closed": a breaker cycling through half-open never stays open.
    ("cb-open", "VllmFleetRouterCircuitOpen", {"old": "!= 0", "new": "== 1"}, "router.test.yml"),
    # The restart count; counters born inside the window (increase() alone sees one restart
    # fewer); and the scrape-gap guard on those.
    (
        "restarts",
        "VllmFleetEngineRestarts",
        {"old": ") >= 2", "new": ") >= 3"},
        "watchdog.test.yml",
    ),
    (
        "first-restart",
        "VllmFleetEngineRestarts",
        {
            "old": 'unless vllm_fleet_watchdog_restarts_total{job="vllm-fleet-watchdog"} offset 30m',
            "new": 'unless vllm_fleet_watchdog_restarts_total{job="vllm-fleet-watchdog"}',
        },
        "watchdog.test.yml",
    ),
    (
        "gap",
        "VllmFleetEngineRestarts",
        {"old": 'and on (instance) (up{job="vllm-fleet-watchdog"} offset 30m == 1)', "new": ""},
        "watchdog.test.yml",
    ),
    # The hold-age threshold: an hour and a minute would not fire yet.
    (
        "hold-age",
        "VllmFleetHoldTooOld",
        {"old": "> 3600", "new": "> 3700"},
        "watchdog.test.yml",
    ),
    # A failed crosstalk check (errors, no overlap) taken for cross-talk; contamination paged
    # twice; and a verification failure seen only in the crosstalk check (smoke missed).
    (
        "crosstalk-any-failure",
        "VllmFleetCrosstalkDetected",
        {
            "old": ") > 0",
            "new": ') > 0 or min by (fleet_host) (vllm_fleet_verify_check_ok{check="crosstalk"}) == 0',
        },
        "verify.test.yml",
    ),
    (
        "failed-with-contamination",
        "VllmFleetVerificationFailed",
        {
            "old": "unless on (fleet_host) max by (fleet_host)"
            ' (vllm_fleet_verify_crosstalk_contaminated_answers{job="node"}) > 0',
            "new": "",
        },
        "verify.test.yml",
    ),
    (
        "failed-crosstalk-only",
        "VllmFleetVerificationFailed",
        {
            "old": 'vllm_fleet_verify_passed{job="node"}',
            "new": 'vllm_fleet_verify_check_ok{job="node", check="crosstalk"}',
        },
        "verify.test.yml",
    ),
]


@pytest.mark.parametrize("test_file", sorted({m[3] for m in MUTATIONS}))
def test_rewritten_test_files_pass_with_unchanged_rules(
    promtool: Path, tmp_path: Path, test_file: str
) -> None:
    """The mutation tests' harness (copies loading other rules) does not fail by itself."""
    rules = tmp_path / "same.rules.yml"
    rules.write_text(yaml.safe_dump(_load(ALERTS), sort_keys=False))
    copy = _with_rules(FIXTURES / test_file, rules, tmp_path)
    result = _promtool(promtool, "test", "rules", str(copy))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("alert", "change", "test_file"),
    [m[1:] for m in MUTATIONS],
    ids=[m[0] for m in MUTATIONS],
)
def test_a_wrong_rule_fails_its_tests(
    promtool: Path, tmp_path: Path, alert: str, change: dict[str, str], test_file: str
) -> None:
    rules = _mutated(alert, change, tmp_path)
    assert _promtool(promtool, "check", "rules", str(rules)).returncode == 0
    copy = _with_rules(FIXTURES / test_file, rules, tmp_path)
    result = _promtool(promtool, "test", "rules", str(copy))
    assert result.returncode != 0, result.stdout
    # promtool names each failing alert: the mutated one, not some other breakage.
    assert f"alertname: {alert}," in result.stdout + result.stderr
