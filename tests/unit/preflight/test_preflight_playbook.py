"""playbooks/preflight.yml end to end on the example inventories, their facts from fixtures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
CACHE_TOKEN = "dGVzdCB0b2tlbiBvZiB0aGUgZXhhbXBsZSdzIGNhY2hl"


def preflight(inventory: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            PLAYBOOK, "-i", f"inventories/{inventory}", "-i", f"tests/fixtures/facts/{inventory}.yml",
            "playbooks/preflight.yml", "-e", "preflight_gather=false",
            "-e", f"preflight_report_dir={tmp_path}",
            # Its own lock: a deploy running from this checkout must not fail the test.
            "-e", f"preflight_deploy_lock_path={tmp_path}/deploy.lock",
            # The example hosts exist only as fixtures: no lease host to reach.
            "-e", '{"preflight_deploy_lease_hosts": []}',
            # The example's own is in Ansible Vault, whose password the tests do not have.
            "-e", f"fleet_model_cache_token={CACHE_TOKEN}", *extra,
        ],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("inventory", "rows", "per_token"),
    [("example-cuda", 4, 81_920), ("example-ascend", 4, 31_104)],
)
def test_examples_pass_and_write_the_plan(inventory, rows, per_token, tmp_path):
    run = preflight(inventory, tmp_path, "--check")
    assert run.returncode == 0, run.stdout[-3000:]
    [report] = tmp_path.glob("preflight-*.json")
    data = json.loads(report.read_text())
    assert data["errors"] == []
    assert len(data["plan"]) == rows
    assert data["plan"][0]["kv_bytes_per_token"] == per_token
    assert (tmp_path / report.name.replace(".json", ".md")).read_text().startswith("| host | group")


def test_a_bad_example_is_refused_with_host_key_value_and_fix(tmp_path):
    overlap = json.dumps(
        {
            "fleet_engine_groups": [
                {"name": "a", "model": "llama-3.1-70b-instruct", "devices": [0, 1, 2, 3],
                 "tensor_parallel_size": 4, "port": 8100, "max_model_len": 8192, "max_num_seqs": 8},
                {"name": "b", "model": "llama-3.1-70b-instruct", "devices": [3, 4, 5, 6],
                 "tensor_parallel_size": 4, "port": 8101, "max_model_len": 8192, "max_num_seqs": 8},
            ]
        }
    )  # fmt: skip
    run = preflight("example-cuda", tmp_path, "--limit", "engines", "-e", overlap)
    assert run.returncode != 0
    assert (
        "h100-01.infer.example.internal: fleet_engine_groups[b].devices=[3, 4, 5, 6]: "
        "device 3 is also given to group a; fix: give each device to one group only"
    ) in run.stdout
    assert "no host was changed" in run.stdout


def test_two_served_names_behind_a_router_that_cannot_route_by_model_are_refused(tmp_path):
    """example-ascend serves two names behind sglang-router (multi-model mode: it passes
    above); the same fleet behind vllm-router (multi_model: false) is refused, naming the
    router, each name's groups and the fix."""
    router = json.dumps({"fleet_router": {"impl": "vllm", "bind_address": "127.0.0.1"}})
    run = preflight("example-ascend", tmp_path, "--check", "-e", router)
    assert run.returncode != 0
    assert "gw01.npu.example.internal: fleet_router.impl='vllm': " in run.stdout
    assert (
        "deepseek-v2-lite by atlas-01.npu.example.internal/deepseek, "
        "atlas-02.npu.example.internal/deepseek"
    ) in run.stdout
    assert "use impl: sglang" in run.stdout


def test_a_fleet_without_a_ca_is_refused_unless_its_engines_say_plain_http(tmp_path):
    """example-cuda without its CA, the routers allowed plain HTTP: the engines' ports would
    carry every prompt and the engine key in the clear, and nothing said so."""
    no_ca = json.dumps(
        {"fleet_ca_dir": "", "fleet_model_cache_plain_http": True,
         "fleet_router": {"impl": "sglang", "plain_http": True}}
    )  # fmt: skip
    run = preflight("example-cuda", tmp_path, "--check", "-e", no_ca)
    assert run.returncode != 0
    assert (
        "h100-01.infer.example.internal: fleet_ca_dir='': is not set, and this host serves engines"
    ) in run.stdout
    assert "fleet_engine_plain_http: true" in run.stdout
    said = json.dumps({**json.loads(no_ca), "fleet_engine_plain_http": True})
    run = preflight("example-cuda", tmp_path, "--check", "-e", said)
    assert run.returncode == 0, run.stdout[-3000:]
