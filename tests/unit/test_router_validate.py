"""The router role's validation (tasks/validate.yml) refuses bad settings by name.

Runs the role's real validation tasks with ansible-playbook on the controller (no host
is touched: validation only asserts and sets facts).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.paths import ROOT
from tests.support.playbook import run_play

RELEASES = yaml.safe_load((ROOT / "catalog/routers.yml").read_text())["fleet_router_releases"]
# What an inventory running vllm-router must say (its worker endpoints take no key, and its
# client port has no TLS).
ACCEPTED = {"accept_unauthenticated_control": True, "plain_http": True}
CA_DIR = "/srv/vllm-fleet/ca"
MODELS = {
    "smollm2-135m": {"served_name": "smollm2"},
    "smollm2-360m": {"served_name": "smollm2-big"},
    "smollm2-135m-b": {"served_name": "smollm2"},
}


def validate(
    tmp_path: Path,
    fleet_router: dict[str, object],
    engines: dict[str, list[dict[str, object]]] | None = None,
    expect_multi_model: bool | None = None,
    ca_dir: str = CA_DIR,
) -> subprocess.CompletedProcess[str]:
    """The role's validation on router01; ``engines``: engine host -> its groups (an
    inventory with them, models from MODELS)."""
    variables = {
        "fleet_router": fleet_router,
        "fleet_router_releases": RELEASES,
        "fleet_router_client_key": "client-key-0123456789",
        "fleet_router_control_key": "control-key-0123456789",
        "fleet_models": MODELS,
        "fleet_ca_dir": ca_dir,
    }
    (tmp_path / "vars.yml").write_text(yaml.safe_dump(variables))
    inventory = "router01,"
    if engines is not None:
        hosts = {h: {"fleet_engine_groups": g} for h, g in engines.items()}
        layout = {
            "all": {
                "children": {"routers": {"hosts": {"router01": {}}}, "engines": {"hosts": hosts}}
            }
        }
        (tmp_path / "hosts.yml").write_text(yaml.safe_dump(layout))
        inventory = str(tmp_path / "hosts.yml")
    checks = []
    if expect_multi_model is not None:
        checks.append(
            {
                "name": "The mode the validation chose",
                "ansible.builtin.assert": {
                    "that": f"router_multi_model | bool == {expect_multi_model}",
                    "fail_msg": "router_multi_model={{ router_multi_model }}",
                },
            }
        )
    play = [
        {
            "name": "Validate router settings",
            "hosts": "router01",
            "gather_facts": False,
            "vars_files": [str(tmp_path / "vars.yml")],
            "tasks": [
                {
                    "name": "Run the role's validation",
                    "ansible.builtin.include_role": {
                        "name": "router",
                        "tasks_from": "validate.yml",
                    },
                },
                *checks,
            ],
        }
    ]
    return run_play(tmp_path, play, inventory=inventory)


def test_the_defaults_pass(tmp_path):
    run = validate(tmp_path, {})
    assert run.returncode == 0, run.stdout[-3000:]


def test_a_fleet_without_a_ca_is_refused_unless_plain_http_is_said(tmp_path):
    run = validate(tmp_path, {}, ca_dir="")
    assert run.returncode != 0
    assert (
        "host router01: fleet_ca_dir is not set, so this router's client port (clients' prompts "
        "and key, the engine hosts' control keys) would speak plain HTTP"
    ) in " ".join(run.stdout.split())
    assert validate(tmp_path, {"plain_http": True}, ca_dir="").returncode == 0


def test_a_router_without_a_tls_listener_is_refused_where_the_fleet_has_a_ca(tmp_path):
    settings = {"impl": "vllm", "bind_address": "10.0.0.1", "accept_unauthenticated_control": True}
    run = validate(tmp_path, settings)
    assert run.returncode != 0
    assert (
        "host router01: fleet_router.impl=vllm cannot serve TLS (vllm-router-0.1.17 has no TLS listener"
    ) in " ".join(run.stdout.split())


@pytest.mark.parametrize(("retries", "breaker"), [(2, 2), (3, 5)])
def test_retries_that_cannot_reach_another_engine_are_refused(tmp_path, retries, breaker):
    run = validate(tmp_path, {"retry_max_retries": retries, "cb_failure_threshold": breaker})
    assert run.returncode != 0
    assert (
        f"host router01: fleet_router.retry_max_retries={retries} must be greater than "
        f"fleet_router.cb_failure_threshold={breaker}"
    ) in run.stdout
    assert f"raise retry_max_retries to at least {breaker + 1}" in run.stdout


@pytest.mark.parametrize("address", ["0.0.0.0", "8.8.8.8"])
def test_vllm_router_beyond_private_networks_is_refused(tmp_path, address):
    run = validate(tmp_path, {"impl": "vllm", "bind_address": address, **ACCEPTED})
    assert run.returncode != 0
    assert f"fleet_router.bind_address={address} is not a loopback or private address" in (
        run.stdout
    )


def test_vllm_router_exposure_can_be_accepted_explicitly(tmp_path):
    settings = {"impl": "vllm", "bind_address": "0.0.0.0", "accept_unauthenticated_exposure": True}
    assert validate(tmp_path, {**settings, **ACCEPTED}).returncode == 0


def test_vllm_router_whose_worker_endpoints_take_no_key_is_refused_unless_accepted(tmp_path):
    run = validate(tmp_path, {"impl": "vllm", "bind_address": "10.0.0.1"})
    assert run.returncode != 0
    assert (
        "host router01: fleet_router.impl=vllm takes no key on its worker endpoints "
        "(authenticates_control: false in catalog/routers.yml): any host that reaches its port "
        "can add a worker and receive every client's prompts"
    ) in " ".join(run.stdout.split())
    assert "fleet_router.accept_unauthenticated_control: true" in " ".join(run.stdout.split())
    assert (
        validate(tmp_path, {"impl": "vllm", "bind_address": "10.0.0.1", **ACCEPTED}).returncode == 0
    )


def group(model: str) -> list[dict[str, object]]:
    return [{"name": "g0", "model": model, "max_num_seqs": 8}]


def test_one_served_name_runs_the_regular_mode(tmp_path):
    """Two models under one served name (a takeover half-way) are still one name."""
    engines = {"engine01": group("smollm2-135m"), "engine02": group("smollm2-135m-b")}
    run = validate(tmp_path, {}, engines, expect_multi_model=False)
    assert run.returncode == 0, run.stdout[-3000:]


def test_two_served_names_run_sglang_in_its_multi_model_mode(tmp_path):
    engines = {"engine01": group("smollm2-135m"), "engine02": group("smollm2-360m")}
    run = validate(tmp_path, {"impl": "sglang"}, engines, expect_multi_model=True)
    assert run.returncode == 0, run.stdout[-3000:]


def test_multi_model_can_be_set_ahead_of_a_second_model(tmp_path):
    engines = {"engine01": group("smollm2-135m")}
    run = validate(tmp_path, {"multi_model": True}, engines, expect_multi_model=True)
    assert run.returncode == 0, run.stdout[-3000:]


def test_multi_model_false_with_two_served_names_is_refused(tmp_path):
    engines = {"engine01": group("smollm2-135m"), "engine02": group("smollm2-360m")}
    run = validate(tmp_path, {"multi_model": False}, engines)
    assert run.returncode != 0
    assert "host router01: fleet_router.multi_model=false, and the engines serve smollm2, " in (
        " ".join(run.stdout.split())
    )


def test_two_served_names_behind_vllm_router_are_refused(tmp_path):
    engines = {"engine01": group("smollm2-135m"), "engine02": group("smollm2-360m")}
    run = validate(tmp_path, {"impl": "vllm", "bind_address": "10.0.0.1", **ACCEPTED}, engines)
    assert run.returncode != 0
    assert (
        "host router01: fleet_router.impl=vllm cannot route by model (multi_model: false in "
        "catalog/routers.yml), and the engines serve smollm2, smollm2-big"
    ) in " ".join(run.stdout.split())
