"""The example inventories render complete engine units and settings in check mode.

preflight (facts from fixtures) then vllm_engine run with --check --diff over a local
connection: nothing is reached or written; each template's rendered text comes back in the
diff. The settings are then read the way the host's engine-run wrapper reads them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT
from vllm_fleet.engine.config import EngineConfig, engine_argv, engine_env

PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
API_KEY = "test-api-key-never-in-a-unit"
CONTROL_KEY = "test-control-key"
EXPECTED = {
    "example-cuda": {
        "hosts": ["h100-01.infer.example.internal", "h100-02.infer.example.internal"],
        "groups": {"tp0": "0,1,2,3", "tp1": "4,5,6,7"},
        "device_var": "CUDA_VISIBLE_DEVICES",
    },
    "example-ascend": {
        "hosts": ["atlas-01.npu.example.internal", "atlas-02.npu.example.internal"],
        "groups": {"deepseek": "0,1,2,3", "qwen": "4,5,6,7"},
        "device_var": "ASCEND_RT_VISIBLE_DEVICES",
    },
}


def render(inventory: str, tmp_path: Path) -> list[dict]:
    playbook = tmp_path / "render.yml"
    playbook.write_text(
        f"- ansible.builtin.import_playbook: {ROOT}/playbooks/preflight.yml\n"
        "- hosts: engines\n  gather_facts: false\n"
        f"  vars_files: [{ROOT}/catalog/stacks.yml]\n"
        "  roles: [vllm_engine]\n"
    )
    secrets = {
        "fleet_engine_api_key": API_KEY,
        "fleet_router_control_key": CONTROL_KEY,
        "fleet_model_cache_token": "dGVzdCB0b2tlbiBvZiB0aGUgZXhhbXBsZSdzIGNhY2hl",
    }
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        # The bundle's drift callback records each changed task's diff (rendered text).
        "ANSIBLE_CALLBACKS_ENABLED": "vllm_fleet_drift",
        "VLLM_FLEET_DRIFT_OUT": str(tmp_path / "drift.json"),
        "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
    }
    run = subprocess.run(
        [
            PLAYBOOK, "-i", f"inventories/{inventory}", "-i", f"tests/fixtures/facts/{inventory}.yml",
            str(playbook), "--check", "--diff", "-c", "local",
            "-e", f"ansible_python_interpreter={sys.executable}", "-e", "ansible_become=false",
            "-e", "preflight_gather=false", "-e", f"preflight_report_dir={tmp_path}",
            # Its own lock: a deploy running from this checkout must not fail the test.
            "-e", f"preflight_deploy_lock_path={tmp_path}/deploy.lock",
            "-e", json.dumps(secrets),
            # Compared with a directory that does not exist: the diff is the whole file.
            "-e", f"vllm_engine_config_dir={tmp_path}/engines",
        ],
        cwd=ROOT, capture_output=True, text=True, check=False, env=env,
    )  # fmt: skip
    assert run.returncode == 0, (run.stdout[-4000:], run.stderr[-2000:])
    return json.loads((tmp_path / "drift.json").read_text())["hosts"]


def rendered(plan: dict, task_name: str) -> dict[str, list[dict]]:
    """host -> that task's changes (one per loop item), for hosts where it ran."""
    out = {
        host: [c for c in record["changed"] if c["task"] == f"vllm_engine : {task_name}"]
        for host, record in plan.items()
    }
    return {host: changes for host, changes in out.items() if changes}


@pytest.mark.parametrize("inventory", sorted(EXPECTED))
def test_example_renders_units_and_settings(inventory, tmp_path):
    want = EXPECTED[inventory]
    plan = render(inventory, tmp_path)
    units = rendered(plan, "Install the engine unit template")
    settings = rendered(plan, "Render each group's settings")
    envfiles = rendered(plan, "Render each group's environment file (holds the API key)")
    assert sorted(units) == sorted(settings) == sorted(envfiles) == want["hosts"]
    for host in want["hosts"]:
        [unit] = units[host]
        text = unit["diffs"][0]["after"]
        assert (
            f"ExecStart=/opt/vllm-fleet/agent/bin/vllm-fleet engine-run {tmp_path}/engines/%i.json"
            in text
        )
        assert "PrivateDevices=no" in text
        assert API_KEY not in text and CONTROL_KEY not in text
        env_files = [line for line in text.splitlines() if line.startswith("EnvironmentFile=")]
        if inventory == "example-ascend":
            # The CANN environment first, then the group's secrets.
            assert env_files == [
                "EnvironmentFile=/etc/vllm-fleet/ascend.env",
                f"EnvironmentFile={tmp_path}/engines/%i.env",
            ]
        else:
            assert env_files == [f"EnvironmentFile={tmp_path}/engines/%i.env"]
        # The examples have a fleet CA: systemd hands each engine unit the engines' own key
        # and certificate (not the host's).
        assert "LoadCredential=engine-tls.key:/etc/vllm-fleet/tls/engine.key" in text
        assert "LoadCredential=engine-tls.crt:/etc/vllm-fleet/tls/engine.crt" in text
        # The secrets file is rendered (0600) but its content never shows in the output.
        assert len(envfiles[host]) == len(want["groups"])
        assert API_KEY not in json.dumps(envfiles[host])
        assert [c["item"] for c in settings[host]] == list(want["groups"])
        for change in settings[host]:
            group = change["item"]
            after = change["diffs"][0]["after"]
            assert API_KEY not in after
            cfg = EngineConfig.model_validate_json(after)
            engine = engine_env(cfg, Path("/var/lib/vllm-fleet/engines") / group)
            assert engine[want["device_var"]] == want["groups"][group], (host, group)
            credentials = f"/run/credentials/vllm-engine@{group}.service"
            argv = engine_argv(cfg, credentials)
            assert argv[0] == f"/opt/vllm-fleet/stacks/{cfg.stack}/bin/vllm"
            assert argv[argv.index("--ssl-keyfile") + 1] == f"{credentials}/engine-tls.key"
            assert argv[argv.index("--ssl-certfile") + 1] == f"{credentials}/engine-tls.crt"
            assert cfg.tls is not None and str(cfg.tls.ca_cert) == "/etc/vllm-fleet/tls/ca.crt"
            assert cfg.advertise_url is not None and cfg.advertise_url.startswith("https://")
            assert argv[argv.index("--tensor-parallel-size") + 1] == "4"
            assert int(argv[argv.index("--kv-cache-memory-bytes") + 1]) > 0
            if inventory == "example-ascend":
                assert engine["PYTORCH_NPU_ALLOC_CONF"] == "expandable_segments:True"
                assert engine["TASK_QUEUE_ENABLE"] == "1"
                assert engine["HCCL_OP_EXPANSION_MODE"] == "AIV"
                assert engine["HCCL_BUFFSIZE"] == "512"
                assert engine["HCCL_CONNECT_TIMEOUT"] == "1200"
                assert engine["HCCL_SOCKET_IFNAME"] == engine["GLOO_SOCKET_IFNAME"] == "enp189s0f0"
                address = {"atlas-01": "192.168.20.21", "atlas-02": "192.168.20.22"}
                assert engine["HCCL_IF_IP"] == address[host.split(".")[0]]
            else:
                assert not any(k.startswith(("HCCL_", "ASCEND_")) for k in engine)
