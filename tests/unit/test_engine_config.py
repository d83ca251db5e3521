from pathlib import Path

import pytest
from pydantic import ValidationError

from vllm_fleet.engine.config import (
    CredentialsMissing,
    EngineConfig,
    advertise_url,
    compress_ranges,
    device_env,
    engine_argv,
    engine_env,
    engine_url,
    owned_flag,
    probe_url,
)

TLS = {
    "cert": "engine-tls.crt",
    "key": "engine-tls.key",
    "ca_cert": "/etc/vllm-fleet/tls/ca.crt",
    "cert_sha256": "ab" * 32,
    "ca_sha256": "cd" * 32,
}


def config(**overrides):
    base = {
        "group": "g0",
        "accelerator": "cpu",
        "stack": "cpu-vllm-0.32.0",
        "stack_dir": "/opt/vllm-fleet/stacks/cpu-vllm-0.32.0",
        "model_path": "/srv/models/m/abc",
        "served_name": "smollm2",
        "port": 8100,
        "devices": [0],
        "max_model_len": 2048,
        "max_num_seqs": 16,
        "kv_cache_bytes": 1 << 30,
    }
    return EngineConfig.model_validate(base | overrides)


@pytest.mark.parametrize(
    ("devices", "expected"),
    [([0], "0"), ([3, 1, 2], "1-3"), ([0, 1, 2, 5, 7, 8], "0-2,5,7-8"), ([4, 4], "4")],
)
def test_compress_ranges(devices, expected):
    assert compress_ranges(devices) == expected


def test_one_device_mapping_for_every_accelerator():
    assert device_env("cpu", [2, 3]) == {
        "VLLM_CPU_OMP_THREADS_BIND": "2-3",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    }
    assert device_env("cuda", [4, 5]) == {"CUDA_VISIBLE_DEVICES": "4,5"}
    assert device_env("ascend", [0, 1, 2, 3]) == {"ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3"}


def test_argv_loads_the_local_path_with_explicit_limits():
    argv = engine_argv(config(enforce_eager=True, block_size=32, extra_args=["--seed", "0"]))
    assert argv[:3] == [
        "/opt/vllm-fleet/stacks/cpu-vllm-0.32.0/bin/vllm",
        "serve",
        "/srv/models/m/abc",
    ]
    pairs = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert pairs["--served-model-name"] == "smollm2"
    assert pairs["--kv-cache-memory-bytes"] == str(1 << 30)
    assert pairs["--max-model-len"] == "2048"
    assert pairs["--kv-cache-dtype"] == "auto"
    assert "--enforce-eager" in argv
    assert argv[-4:] == ["--block-size", "32", "--seed", "0"]
    assert "--enable-prefix-caching" in argv


def test_argv_never_carries_a_key():
    argv = engine_argv(config(extra_args=["--seed", "0"]))
    assert not any("api-key" in a for a in argv)
    with pytest.raises(ValidationError, match="VLLM_API_KEY is set by the role"):
        config(env={"VLLM_API_KEY": "should-not-move"})
    with pytest.raises(ValidationError, match="sets --api-key, which the role owns"):
        config(extra_args=["--api-key=should-not-move"])


def test_every_flag_the_role_sets_is_one_extra_args_may_not_set():
    """OWNED_FLAGS follows engine_argv: a flag added there and not here would let a group's
    extra_args give it a second value that vLLM's parser takes (the last one wins)."""
    argv = engine_argv(
        config(
            enforce_eager=True,
            block_size=32,
            enable_prefix_caching=False,
            trust_remote_code=True,
            tls=TLS,
        ),
        "/run/credentials/vllm-engine@g0.service",
    )
    flags = [a for a in argv if a.startswith("-")]
    assert flags and all(owned_flag(a) for a in flags), [a for a in flags if not owned_flag(a)]


@pytest.mark.parametrize(
    "args",
    [["--host", "0.0.0.0"], ["--host=0.0.0.0"], ["--ho", "::"], ["--port", "1"], ["-tp", "8"],
     ["--served_model_name", "x"], ["--config", "/tmp/x.yaml"], ["--uds", "/tmp/s"],
     ["--no-enable-prefix-caching"], ["--trust-remote-code"], ["--trust_remote_code"],
     ["--ssl-keyfile", "/tmp/k"], ["--ssl-cert-reqs=0"], ["--ssl-ca", "/tmp/ca"],
     ["--enable-ssl-refresh"]],
)  # fmt: skip
def test_extra_args_may_not_set_what_the_role_owns(args):
    with pytest.raises(ValidationError, match="which the role owns"):
        config(extra_args=args)


@pytest.mark.parametrize("name", ["HF_HUB_OFFLINE", "TMPDIR", "CUDA_VISIBLE_DEVICES", "HF_TOKEN"])
def test_env_may_not_replace_isolation_devices_or_carry_secrets(name):
    with pytest.raises(ValidationError, match=name):
        config(env={name: "x"})


def test_prefix_caching_can_be_turned_off():
    assert "--no-enable-prefix-caching" in engine_argv(config(enable_prefix_caching=False))


def test_env_keeps_caches_in_the_state_dir_and_stays_offline():
    env = engine_env(config(devices=[1], env={"OMP_NUM_THREADS": "1"}), Path("/var/lib/x"))
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["TMPDIR"] == "/var/lib/x/tmp"
    assert env["VLLM_CACHE_ROOT"].startswith("/var/lib/x/")
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert env["OMP_NUM_THREADS"] == "1"


@pytest.mark.parametrize(
    "bad",
    [{"port": 0}, {"devices": []}, {"accelerator": "tpu"}, {"group": "a b"}, {"typo_key": 1}],
)
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValidationError):
        config(**bad)


def test_ascend_env_pins_npus_and_sets_npu_and_hccl_defaults():
    env = engine_env(
        config(accelerator="ascend", stack="ascend-vllm-0.23.0", devices=[4, 5, 6, 7]),
        Path("/var/lib/vllm-fleet/engines/g0"),
    )
    assert env["ASCEND_RT_VISIBLE_DEVICES"] == "4,5,6,7"
    assert env["PYTORCH_NPU_ALLOC_CONF"] == "expandable_segments:True"
    assert env["TASK_QUEUE_ENABLE"] == "1"
    assert env["OMP_NUM_THREADS"] == "1"
    assert env["OMP_PROC_BIND"] == "false"
    assert env["HCCL_OP_EXPANSION_MODE"] == "AIV"
    # Unset: HCCL's own defaults, and no interface unless the host names one.
    for absent in ("HCCL_BUFFSIZE", "HCCL_CONNECT_TIMEOUT", "HCCL_IF_IP", "GLOO_SOCKET_IFNAME"):
        assert absent not in env
    assert "VLLM_CPU_OMP_THREADS_BIND" not in env


def test_ascend_settings_and_private_interface_reach_hccl_and_gloo():
    cfg = config(
        accelerator="ascend",
        devices=[0, 1],
        ascend={"hccl_buffsize": 512, "hccl_connect_timeout": 1200, "omp_num_threads": 4},
        network={"interface": "enp189s0f0", "address": "192.168.20.21"},
        env={"TASK_QUEUE_ENABLE": "2"},
    )
    env = engine_env(cfg, Path("/s"))
    assert env["HCCL_BUFFSIZE"] == "512"
    assert env["HCCL_CONNECT_TIMEOUT"] == "1200"
    assert env["OMP_NUM_THREADS"] == "4"
    assert env["HCCL_IF_IP"] == "192.168.20.21"
    assert env["HCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "enp189s0f0"
    assert env["TP_SOCKET_IFNAME"] == "enp189s0f0"
    # A group's own env wins over the derived values.
    assert env["TASK_QUEUE_ENABLE"] == "2"


def test_cuda_env_pins_gpus_and_nccl_follows_the_private_interface():
    env = engine_env(config(accelerator="cuda", devices=[4, 5]), Path("/s"))
    assert env["CUDA_VISIBLE_DEVICES"] == "4,5"
    assert not any(k.startswith(("HCCL_", "PYTORCH_NPU", "NCCL_")) for k in env)
    env = engine_env(
        config(accelerator="cuda", devices=[0], network={"interface": "ib0"}), Path("/s")
    )
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "ib0"


@pytest.mark.parametrize(
    "bad", [{"hccl_connect_timeout": 60}, {"task_queue_enable": 3}, {"hccl_bufsize": 1}]
)
def test_bad_ascend_settings_are_refused(bad):
    with pytest.raises(ValidationError):
        config(accelerator="ascend", ascend=bad)


def test_the_weights_own_code_runs_only_when_the_model_allows_it():
    assert "--trust-remote-code" not in engine_argv(config())
    assert "--trust-remote-code" in engine_argv(config(trust_remote_code=True))
    with pytest.raises(ValidationError, match="unless the model's entry in fleet_models says"):
        config(extra_args=["--trust-remote"])


@pytest.mark.parametrize(
    ("args", "guarantee"),
    [(["--host", "0.0.0.0"], "private bind address"), (["--api-key=x"], "off the command line"),
     (["--model", "org/m"], "sha256-verified local weights"),
     (["--enable-log-requests"], "prompts stay out of the journal")],
)  # fmt: skip
def test_each_refused_flag_names_the_guarantee_it_would_undo(args, guarantee):
    with pytest.raises(ValidationError, match=guarantee):
        config(extra_args=args)


def test_a_tls_group_serves_the_certificate_and_key_systemd_handed_its_unit():
    credentials = "/run/credentials/vllm-engine@g0.service"
    argv = engine_argv(config(tls=TLS, extra_args=["--seed", "0"]), credentials)
    assert argv[argv.index("--ssl-certfile") + 1] == f"{credentials}/engine-tls.crt"
    assert argv[argv.index("--ssl-keyfile") + 1] == f"{credentials}/engine-tls.key"
    # No client certificate asked for (the routers' health checks present none), and the
    # group's own arguments still come last.
    assert "--ssl-cert-reqs" not in argv and argv[-2:] == ["--seed", "0"]
    assert "--ssl-certfile" not in engine_argv(config(), credentials)


def test_a_tls_group_without_its_credentials_does_not_start_on_plain_http():
    with pytest.raises(CredentialsMissing, match="LoadCredential"):
        engine_argv(config(tls=TLS), None)


@pytest.mark.parametrize("name", ["../host.key", "tls/key", ".", ""])
def test_a_credential_name_is_a_plain_name(name):
    with pytest.raises(ValidationError):
        config(tls=TLS | {"key": name})


def test_the_scheme_follows_the_groups_tls():
    assert probe_url(config()) == "http://127.0.0.1:8100"
    assert probe_url(config(tls=TLS, host="10.0.0.5")) == "https://10.0.0.5:8100"
    assert advertise_url(config(tls=TLS, advertise_url="https://engine01:8100")) == (
        "https://engine01:8100"
    )
    assert engine_url("fd00::5", 8100, tls=True) == "https://[fd00::5]:8100"
    assert engine_url("[fd00::5]", 8100, tls=False) == "http://[fd00::5]:8100"
