"""The monitoring role renders the lab inventory into a configuration Prometheus accepts.

Runs the real role (render mode) with ansible-playbook on the controller against the lab
inventory, then checks what it wrote with Prometheus's own promtool; and runs its
validation with bad settings.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.paths import ROOT
from tests.support.playbook import run_play
from vllm_fleet.tls.ca import init_ca


def run_role(
    tmp_path: Path, fleet_monitoring: dict[str, object], **more: object
) -> subprocess.CompletedProcess[str]:
    play = [
        {
            "name": "Monitoring (render mode)",
            "hosts": "monitoring",
            "gather_facts": False,
            "roles": [{"role": "monitoring"}],
        }
    ]
    extra = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "fleet_monitoring": fleet_monitoring,
        **more,
    }
    inventory = str(ROOT / "inventories/lab")
    return run_play(tmp_path, play, "-e", json.dumps(extra), inventory=inventory, local=False)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("monitoring")
    out = tmp / "prometheus"
    run = run_role(tmp, {"mode": "render", "render_dir": str(out)})
    assert run.returncode == 0, run.stdout[-4000:]
    return out


def test_prometheus_accepts_the_rendered_configuration_and_rules(rendered, promtool):
    check = subprocess.run(
        [str(promtool), "check", "config", str(rendered / "prometheus.yml")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    # check config also parsed both rule files through rule_files.
    assert "2 rule files found" in check.stdout
    assert "SUCCESS: 1 rules found" not in check.stdout


@pytest.fixture(scope="module")
def rendered_tls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The lab inventory as a fleet with a CA: its engines serve HTTPS (fleet_engine_tls)."""
    tmp = tmp_path_factory.mktemp("monitoring-tls")
    ca = init_ca(tmp / "ca")
    out = tmp / "prometheus"
    run = run_role(
        tmp,
        {"mode": "render", "render_dir": str(out)},
        fleet_ca_dir=str(tmp / "ca"),
        fleet_engine_plain_http=False,
        fleet_tls_ca_cert=str(ca),
    )
    assert run.returncode == 0, run.stdout[-4000:]
    return out


def test_engines_on_https_are_scraped_over_it_trusting_the_fleet_ca(rendered_tls, promtool):
    check = subprocess.run(
        [str(promtool), "check", "config", str(rendered_tls / "prometheus.yml")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    config = yaml.safe_load((rendered_tls / "prometheus.yml").read_text())
    [engines] = [job for job in config["scrape_configs"] if job["job_name"] == "vllm-engine"]
    assert engines["tls_config"] == {"ca_file": str(rendered_tls.parent / "ca" / "ca.crt")}
    assert {static["labels"]["__scheme__"] for static in engines["static_configs"]} == {"https"}
    rules = yaml.safe_load((rendered_tls / "rules/vllm-fleet-inventory.rules.yml").read_text())
    workers = {
        r["labels"]["worker"] for r in rules["groups"][0]["rules"] if "worker" in r["labels"]
    }
    assert workers == {"https://10.89.0.21:8100", "https://10.89.0.22:8100"}


def test_every_engine_group_router_and_watchdog_is_a_target(rendered):
    jobs = {j["job_name"]: j for j in yaml.safe_load((rendered / "scrape-configs.yml").read_text())}
    engines = jobs["vllm-engine"]
    assert engines["honor_labels"] is True
    targets = {c["targets"][0]: c["labels"] for c in engines["static_configs"]}
    assert targets == {
        "10.89.0.21:8100": {"fleet_host": "engine01", "fleet_group": "g0", "model_name": "smollm2"},
        "10.89.0.22:8100": {"fleet_host": "engine02", "fleet_group": "g0", "model_name": "smollm2"},
    }
    # Every target by the host's fleet_address (inventories/lab), labelled with its name.
    assert [c["targets"] for c in jobs["vllm-fleet-router"]["static_configs"]] == [
        ["10.89.0.10:29000"],
        ["10.89.0.11:29000"],
    ]
    assert [c["targets"] for c in jobs["vllm-fleet-watchdog"]["static_configs"]] == [
        ["10.89.0.21:9410"],
        ["10.89.0.22:9410"],
    ]


def test_inventory_rules_map_router_workers_to_models(rendered):
    groups = yaml.safe_load((rendered / "rules/vllm-fleet-inventory.rules.yml").read_text())
    rules = groups["groups"][0]["rules"]
    workers = {r["labels"]["worker"]: r["labels"] for r in rules if r["record"].endswith("info")}
    # The worker label is the URL the engine registered with the routers: its address.
    assert workers["http://10.89.0.21:8100"] == {
        "worker": "http://10.89.0.21:8100",
        "model_name": "smollm2",
        "fleet_host": "engine01",
        "fleet_group": "g0",
    }
    (threshold,) = [r for r in rules if r["record"] == "vllm_fleet:ttft_p99_threshold_seconds"]
    # The lab inventory sets 5 s (fleet_monitoring is replaced here, so the default 2 s).
    assert threshold == {
        "record": "vllm_fleet:ttft_p99_threshold_seconds",
        "expr": "vector(2.0)",
        "labels": {"model_name": "smollm2"},
    }


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"mode": "sidecar"},
            "host router01: fleet_monitoring.mode=sidecar is not a mode",
        ),
        (
            {"listen_address": "0.0.0.0"},
            "host router01: fleet_monitoring.listen_address=0.0.0.0 must be one IP address",
        ),
        (
            {"listen_address": "router01"},
            "host router01: fleet_monitoring.listen_address=router01 must be one IP address",
        ),
        (
            {"exporters": [{"job": "node", "hosts": "all"}]},
            "host router01: fleet_monitoring.exporters[0]=",
        ),
        (
            {"exporters": [{"job": "node", "port": 9100, "hosts": "gpu-nodes"}]},
            "an inventory group or a list of hosts",
        ),
    ],
)
def test_bad_settings_are_refused_by_name(tmp_path, settings, message):
    run = run_role(tmp_path, {"render_dir": str(tmp_path / "out"), **settings})
    assert run.returncode != 0
    assert message in " ".join(run.stdout.split())
    assert not (tmp_path / "out").exists()
