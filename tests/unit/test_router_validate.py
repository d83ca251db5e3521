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


def validate(tmp_path: Path, fleet_router: dict[str, object]) -> subprocess.CompletedProcess[str]:
    variables = {
        "fleet_router": fleet_router,
        "fleet_router_releases": RELEASES,
        "fleet_router_client_key": "client-key-0123456789",
        "fleet_router_control_key": "control-key-0123456789",
    }
    (tmp_path / "vars.yml").write_text(yaml.safe_dump(variables))
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
                }
            ],
        }
    ]
    return run_play(tmp_path, play, inventory="router01,")


def test_the_defaults_pass(tmp_path):
    run = validate(tmp_path, {})
    assert run.returncode == 0, run.stdout[-3000:]


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
    run = validate(tmp_path, {"impl": "vllm", "bind_address": address})
    assert run.returncode != 0
    assert f"fleet_router.bind_address={address} is not a loopback or private address" in (
        run.stdout
    )


def test_vllm_router_exposure_can_be_accepted_explicitly(tmp_path):
    settings = {"impl": "vllm", "bind_address": "0.0.0.0", "accept_unauthenticated_exposure": True}
    assert validate(tmp_path, settings).returncode == 0
