"""`vllm-fleet verify` end to end against fixture fleets (real HTTP on loopback)."""

import json
import os
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.openai_fixture_server import (
    CLIENT_KEY,
    ENGINE_KEY,
    fixture_fleet,
    verify_config,
)
from vllm_fleet.verify.runner import main


def run_verify(tmp_path, config, monkeypatch, engine_key=ENGINE_KEY, client_key=CLIENT_KEY):
    config_path = tmp_path / "verify.json"
    config_path.write_text(json.dumps(config))
    monkeypatch.setenv("VLLM_FLEET_ENGINE_API_KEY", engine_key)
    monkeypatch.setenv("VLLM_FLEET_CLIENT_API_KEY", client_key)
    out = tmp_path / "out"
    code = main(["--config", str(config_path), "--out", str(out)])
    report = json.loads((out / "report.json").read_text()) if code != 2 else None
    return code, report, out


def statuses(report):
    return {c["name"]: c["status"] for c in report["checks"]}


def test_honest_fleet_behind_a_router_passes(tmp_path, monkeypatch, capsys):
    with fixture_fleet() as (engines, router):
        code, report, out = run_verify(tmp_path, verify_config(engines, router), monkeypatch)

    assert code == 0
    assert (out / "report.md").read_text().startswith("# vllm-fleet verify: PASS")
    assert statuses(report) == {
        "smoke engine01/g0": "pass",
        "smoke engine02/g0": "pass",
        "smoke router": "pass",
        "crosstalk": "pass",
        "prefix_cache engine01/g0": "pass",
        "prefix_cache engine02/g0": "pass",
        "prefix_cache router": "pass",
    }
    assert [(r["host"], r["health"], r["kv_capacity_tokens"]) for r in report["fleet"]] == [
        ("engine01", "ok", 16 * 1000),
        ("engine02", "ok", 16 * 1000),
    ]
    printed = capsys.readouterr().out.splitlines()
    assert len([line for line in printed if line.startswith("[PASS]")]) == 7
    assert "verdict: PASS (7 passed, 0 warnings, 0 failed)" in printed


def test_honest_fleet_without_router_spreads_load_over_engines(tmp_path, monkeypatch):
    with fixture_fleet(router=False) as (engines, _):
        code, report, _ = run_verify(
            tmp_path, verify_config(engines, None), monkeypatch, client_key=""
        )

    assert code == 0
    crosstalk = next(c for c in report["checks"] if c["name"] == "crosstalk")
    assert crosstalk["details"]["endpoints"] == ["engine01/g0", "engine02/g0"]
    assert (
        report["concurrency"] == {"smollm2": 16} == {"smollm2": crosstalk["details"]["concurrency"]}
    )
    peaks = crosstalk["details"]["peak_running"]["per_engine"]
    # 8 requests per engine, 4 slots each: both engines ran full batches.
    assert set(peaks) == {"engine01/g0", "engine02/g0"}
    assert all(2 <= peak <= 4 for peak in peaks.values())
    assert "smoke router" not in statuses(report)


def test_wrong_engine_key_fails_the_engine_smoke(tmp_path, monkeypatch):
    with fixture_fleet(router=False) as (engines, _):
        code, report, _ = run_verify(
            tmp_path, verify_config(engines, None), monkeypatch, engine_key="not-the-key"
        )

    assert code == 1
    smoke = next(c for c in report["checks"] if c["name"] == "smoke engine01/g0")
    assert smoke["status"] == "fail"
    failed = {i["name"] for i in smoke["details"]["items"] if not i["ok"]}
    assert {"models", "chat", "completion", "stream"} <= failed
    # /health and /metrics stay open, as on vLLM.
    assert {"health", "metrics"}.isdisjoint(failed)


def test_engine_without_auth_fails_the_auth_items(tmp_path, monkeypatch):
    with fixture_fleet(router=False, enforce_auth=False) as (engines, _):
        code, report, _ = run_verify(
            tmp_path, verify_config(engines, None), monkeypatch, client_key=""
        )

    assert code == 1
    smoke = next(c for c in report["checks"] if c["name"] == "smoke engine01/g0")
    failed = {i["name"] for i in smoke["details"]["items"] if not i["ok"]}
    assert failed == {"auth: no key", "auth: wrong key"}
    # The one-line summary (what a play or CI log shows) names the status it got.
    assert "auth: wrong key (POST /v1/chat/completions: 200" in smoke["summary"]


def test_router_with_an_open_model_list_passes_with_a_warning(tmp_path, monkeypatch):
    with fixture_fleet(router_opts={"open_model_list": True}) as (engines, router):
        code, report, _ = run_verify(tmp_path, verify_config(engines, router), monkeypatch)

    assert code == 0
    smoke = next(c for c in report["checks"] if c["name"] == "smoke router")
    assert smoke["status"] == "warn"
    assert smoke["summary"] == "7/7 ok; warnings: auth: no key, auth: wrong key"
    assert report["counts"] == {"pass": 6, "warn": 1, "fail": 0}


@pytest.mark.parametrize(
    ("engine_key", "client_key", "router"),
    [("", "c", False), ("e", "", True)],
)
def test_missing_key_is_a_usage_error(tmp_path, monkeypatch, engine_key, client_key, router):
    config = verify_config([], None)
    config["engines"] = [
        {
            "host": "h",
            "group": "g",
            "url": "http://127.0.0.1:9",
            "stack": "s",
            "model": "m",
            "revision": "r",
            "devices": [0],
            "max_num_seqs": 1,
        }
    ]
    if router:
        config["router"] = {
            "url": "http://127.0.0.1:9",
            "policy": "cache_aware",
            "request_timeout_seconds": 20,
        }
    code, _, out = run_verify(tmp_path, config, monkeypatch, engine_key, client_key)

    assert code == 2
    assert not out.exists()


def test_unknown_config_key_is_a_usage_error(tmp_path, monkeypatch, capsys):
    config = verify_config([], None)
    config["crosstalk"]["concurency"] = 8
    code, _, _ = run_verify(tmp_path, config, monkeypatch)

    assert code == 2
    assert "concurency" in capsys.readouterr().err


def test_unreachable_engines_fail_every_check_without_crashing(tmp_path, monkeypatch):
    with fixture_fleet(engines=1, router=False) as (engines, _):
        config = verify_config(engines, None)
    # The server is stopped now: its port refuses connections.
    code, report, out = run_verify(tmp_path, config, monkeypatch, client_key="")

    assert code == 1
    assert statuses(report) == {
        "smoke engine01/g0": "fail",
        "crosstalk": "fail",
        "prefix_cache engine01/g0": "fail",
    }
    assert report["fleet"][0]["health"] == "unreachable (ConnectError)"
    crosstalk = next(c for c in report["checks"] if c["name"] == "crosstalk")
    # The calibration wave (one request per slot) failed: no burst was piled on top.
    assert crosstalk["details"]["calibration"]["status_codes"] == {"0": 4}
    assert crosstalk["summary"].startswith("not run: 4 of 4 requests of the calibration wave")
    assert "totals" not in crosstalk["details"]
    assert report["concurrency"] == {"smollm2": 0}
    assert (out / "report.md").exists()


def test_metrics_file_reports_contamination_in_prometheus_text_format(
    tmp_path, monkeypatch, promtool
):
    """What node exporter's textfile collector will expose for the cross-talk alert."""
    config_path = tmp_path / "verify.json"
    metrics = tmp_path / "textfile/vllm_fleet_verify.prom"
    monkeypatch.setenv("VLLM_FLEET_ENGINE_API_KEY", ENGINE_KEY)
    monkeypatch.setenv("VLLM_FLEET_CLIENT_API_KEY", CLIENT_KEY)
    # The verification unit's umask: node exporter (another user) must still read the file.
    umask = os.umask(0o077)
    try:
        with fixture_fleet(mode="swap") as (engines, router):
            config_path.write_text(json.dumps(verify_config(engines, router)))
            code = main(
                ["--config", str(config_path), "--out", str(tmp_path / "out"),
                 "--metrics-file", str(metrics)]
            )  # fmt: skip
    finally:
        os.umask(umask)

    assert code == 1
    assert [p.name for p in metrics.parent.iterdir()] == [metrics.name]  # no temporary left
    text = metrics.read_text()
    assert 'vllm_fleet_verify_check_ok{check="crosstalk"} 0.0' in text
    assert 'vllm_fleet_verify_check_ok{check="smoke router"} 1.0' in text
    assert "vllm_fleet_verify_passed 0.0" in text
    contaminated = next(
        line for line in text.splitlines() if line.startswith("vllm_fleet_verify_crosstalk_")
    )
    assert float(contaminated.split()[1]) > 0
    assert oct(metrics.stat().st_mode & 0o777) == "0o644"
    lint = subprocess.run(
        [str(promtool), "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_two_served_names_are_verified_each_on_its_own_engines(tmp_path, monkeypatch):
    """One engine serves smollm2, the other smollm2-b, behind a router that routes by model:
    each name gets its own router smoke, cross-talk load (sized from its own engine) and
    prefix probe, and the metrics file sums both names' contaminated answers."""
    names = ["smollm2", "smollm2-b"]
    with fixture_fleet(served_names=names) as (engines, router):
        config = verify_config(engines, router)
        config_path = tmp_path / "verify.json"
        config_path.write_text(json.dumps(config))
        monkeypatch.setenv("VLLM_FLEET_ENGINE_API_KEY", ENGINE_KEY)
        monkeypatch.setenv("VLLM_FLEET_CLIENT_API_KEY", CLIENT_KEY)
        prom = tmp_path / "verify.prom"
        out = tmp_path / "out"
        code = main(["--config", str(config_path), "--out", str(out), "--metrics-file", str(prom)])
    report = json.loads((out / "report.json").read_text())

    assert code == 0, statuses(report)
    assert statuses(report) == {
        "smoke engine01/g0": "pass",
        "smoke router[smollm2]": "pass",
        "crosstalk[smollm2]": "pass",
        "prefix_cache engine01/g0": "pass",
        "prefix_cache router[smollm2]": "pass",
        "smoke engine02/g0": "pass",
        "smoke router[smollm2-b]": "pass",
        "crosstalk[smollm2-b]": "pass",
        "prefix_cache engine02/g0": "pass",
        "prefix_cache router[smollm2-b]": "pass",
    }
    assert report["served_names"] == names
    assert set(report["concurrency"]) == set(names)
    crosstalk = {c["name"]: c["details"] for c in report["checks"] if "crosstalk" in c["name"]}
    # Each name's load saw only its own engine, and was sized from its 4 slots alone.
    assert set(crosstalk["crosstalk[smollm2]"]["peak_running"]["per_engine"]) == {"engine01/g0"}
    assert set(crosstalk["crosstalk[smollm2-b]"]["peak_running"]["per_engine"]) == {"engine02/g0"}
    assert all(d["sizing"]["slots"] == 4 for d in crosstalk.values())
    # Both names were verified at once, their loads in lockstep: no burst began before both
    # calibration waves had been sent and answered, and the two bursts ran together.
    phases = [d["phases_s"] for d in crosstalk.values()]
    assert min(p["burst"] for p in phases) >= max(p["calibration"] for p in phases)
    assert max(p["burst"] for p in phases) < min(p["burst_end"] for p in phases)
    assert [r["served_name"] for r in report["fleet"]] == names
    markdown = (out / "report.md").read_text()
    assert "- served names: `smollm2` (cross-talk C = " in markdown
    families = {f.name: f for f in text_string_to_metric_families(prom.read_text())}
    oks = {s.labels["check"]: s.value for s in families["vllm_fleet_verify_check_ok"].samples}
    assert oks["crosstalk[smollm2-b]"] == 1.0
    contaminated = families["vllm_fleet_verify_crosstalk_contaminated_answers"].samples
    assert [s.value for s in contaminated] == [0.0]


def test_a_router_that_ignores_the_model_fails_the_names_it_misroutes(tmp_path, monkeypatch):
    """A model-blind router sends smollm2-b requests to the smollm2 engine (404, as vLLM
    answers a name it does not serve): verify fails that name's router checks."""
    names = ["smollm2", "smollm2-b"]
    with fixture_fleet(served_names=names, router_opts={"route_by_model": False}) as (
        engines,
        router,
    ):
        code, report, _ = run_verify(tmp_path, verify_config(engines, router), monkeypatch)

    assert code == 1
    status = statuses(report)
    assert status["smoke engine01/g0"] == status["smoke engine02/g0"] == "pass"
    assert "fail" in {status["smoke router[smollm2]"], status["smoke router[smollm2-b]"]}
    assert "fail" in {status["crosstalk[smollm2]"], status["crosstalk[smollm2-b]"]}
    failed = next(c for c in report["checks"] if c["name"] == "smoke router[smollm2-b]")
    assert "404" in json.dumps(failed["details"])


def test_an_https_engine_without_the_fleet_ca_is_a_usage_error_not_the_systems_trust(
    tmp_path, monkeypatch, capsys
):
    """An engine on HTTPS carries a certificate from the fleet CA: with no CA to trust, verify
    refuses to start rather than fall back to the system's CAs."""
    with fixture_fleet(engines=1, router=False) as (engines, _):
        config = verify_config(engines, None)
    for engine in config["engines"]:
        engine["url"] = engine["url"].replace("http://", "https://")
    code, _, out = run_verify(tmp_path, config, monkeypatch, client_key="")

    assert code == 2
    assert not out.exists()
    assert "speaks HTTPS and the verification has no fleet CA to trust" in capsys.readouterr().err
