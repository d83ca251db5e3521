"""The shipped inventories parse and fit the vllm_engine role's argument spec."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.paths import ROOT
from tests.unit.test_weights_filters import filters as weights_filters

SPEC = yaml.safe_load((ROOT / "roles/vllm_engine/meta/argument_specs.yml").read_text())
GROUP_OPTIONS = SPEC["argument_specs"]["main"]["options"]["vllm_engine_groups"]["options"]
REQUIRED = {name for name, opt in GROUP_OPTIONS.items() if opt.get("required")}


def hostvars(inventory: str) -> dict[str, dict]:
    out = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-inventory"),
            "-i",
            str(ROOT / "inventories" / inventory),
            "--list",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    return json.loads(out)["_meta"]["hostvars"]


@pytest.mark.parametrize("inventory", ["lab", "example-cuda", "example-ascend"])
def test_engine_groups_fit_the_role_spec(inventory):
    engines = {h: v for h, v in hostvars(inventory).items() if "fleet_engine_groups" in v}
    assert len(engines) >= 2
    for host, hv in engines.items():
        assert hv["fleet_accelerator"] in {"cpu", "cuda", "ascend"}
        ports = [g["port"] for g in hv["fleet_engine_groups"]]
        assert len(ports) == len(set(ports)), host
        for group in hv["fleet_engine_groups"]:
            assert set(group) >= REQUIRED, (host, group["name"])
            assert set(group) <= set(GROUP_OPTIONS), (host, set(group) - set(GROUP_OPTIONS))
            # Each model can be fetched as written: pinned, with its source's settings.
            assert weights_filters.spec_problems(group["model"], hv["fleet_models"]) == []


@pytest.mark.parametrize("inventory", ["example-cuda", "example-ascend"])
def test_examples_keep_the_key_in_vault(inventory):
    for hv in hostvars(inventory).values():
        for key in ("fleet_engine_api_key", "fleet_router_client_key", "fleet_router_control_key"):
            assert set(hv[key]) == {"__ansible_vault"}, key
        if any(m.get("source") == "hf" for m in hv["fleet_models"].values()):
            assert set(hv["fleet_hf_token"]) == {"__ansible_vault"}
        if inventory == "example-cuda":  # its cache01.infer.example.internal serves hf models
            assert set(hv["fleet_model_cache_token"]) == {"__ansible_vault"}


def test_the_cuda_example_fetches_from_the_hub_once_through_its_cache_host():
    hv = hostvars("example-cuda")
    model = hv["h100-01.infer.example.internal"]["fleet_models"]["llama-3.1-70b-instruct"]
    assert model["source"] == "hf"
    assert (
        weights_filters.fetch_args(
            "llama-3.1-70b-instruct",
            hv["h100-01.infer.example.internal"]["fleet_models"],
            "http://cache01:8090",
        )["source"]
        == "cache"
    )
    assert "cache01.infer.example.internal" in hv
