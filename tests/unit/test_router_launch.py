"""The router launcher builds each real router's RouterArgs; keys come only from the env."""

from __future__ import annotations

import json

import pytest

from vllm_fleet.router.launch import CLIENT_KEY_ENV, build_args, control_keys_from, keys_from

# What roles/router/templates/router.json.j2 renders (lab values).
ROUTER_ARGS = {
    "host": "10.89.0.2",
    "port": 30000,
    "policy": "cache_aware",
    "worker_urls": [],
    "prometheus_host": "10.89.0.2",
    "prometheus_port": 29000,
    "request_timeout_secs": 20,
    "max_concurrent_requests": 64,
    "queue_size": 0,
    "queue_timeout_secs": 5,
    "balance_abs_threshold": 8,
    "balance_rel_threshold": 1.5,
    "health_check_interval_secs": 1,
    "health_check_timeout_secs": 5,
    "health_failure_threshold": 3,
    "health_success_threshold": 1,
    "cb_failure_threshold": 3,
    "cb_success_threshold": 1,
    "cb_timeout_duration_secs": 3,
    "retry_max_retries": 3,
    "retry_initial_backoff_ms": 50,
    "retry_max_backoff_ms": 500,
    "log_level": "info",
}
KEYS = {CLIENT_KEY_ENV: "client-key-0123456789"}
CONTROL = [("operator", "control-key-0123456789"), ("engine-a", "engine-a-key-0123456789")]


def config(impl: str) -> dict[str, object]:
    package = {"sglang": "sglang_router", "vllm": "vllm_router"}[impl]
    return {"impl": impl, "package": package, "router_args": dict(ROUTER_ARGS)}


def test_sglang_gets_the_client_key_and_each_control_key_under_its_identity():
    args = build_args(config("sglang"), KEYS, CONTROL)
    assert args.api_key == KEYS[CLIENT_KEY_ENV]
    assert args.control_plane_api_keys == [
        ("operator", "operator", "control-key-0123456789", "admin"),
        ("engine-a", "engine-a", "engine-a-key-0123456789", "admin"),
    ]
    assert (args.host, args.prometheus_host) == ("10.89.0.2", "10.89.0.2")
    assert args.request_timeout_secs == 20 and args.max_concurrent_requests == 64


def test_sglang_refuses_to_start_without_both_kinds_of_key():
    with pytest.raises(SystemExit, match="refusing to start an unauthenticated router"):
        build_args(config("sglang"), KEYS, [])
    with pytest.raises(SystemExit, match="refusing to start an unauthenticated router"):
        build_args(config("sglang"), {}, CONTROL)


def test_vllm_router_takes_every_rendered_setting_and_no_key():
    args = build_args(config("vllm"), KEYS, CONTROL)
    assert args.policy == "cache_aware" and args.balance_abs_threshold == 8
    # vllm-router does not check client keys: passing one would only suggest it does.
    assert args.api_key is None


def test_an_unknown_setting_is_refused_by_name():
    bad = config("sglang")
    bad["router_args"]["helth_check_interval_secs"] = 1  # type: ignore[index]
    with pytest.raises(SystemExit, match="does not take helth_check_interval_secs"):
        build_args(bad, KEYS, CONTROL)


def test_keys_come_from_the_units_credentials_before_the_environment(tmp_path):
    (tmp_path / "router.env").write_text(
        "# comment\nVLLM_FLEET_ROUTER_CLIENT_KEY='from-credential-client'\n"
    )
    keys = keys_from(str(tmp_path), {CLIENT_KEY_ENV: "from-env", "PATH": "/usr/bin"})
    assert keys == {CLIENT_KEY_ENV: "from-credential-client"}
    # No credential: the environment's key, and nothing else from it.
    assert keys_from(None, {CLIENT_KEY_ENV: "a", "PATH": "/usr/bin"}) == {CLIENT_KEY_ENV: "a"}
    assert control_keys_from(str(tmp_path)) == []
    (tmp_path / "router-control-keys.json").write_text(
        json.dumps([{"id": i, "key": k} for i, k in CONTROL])
    )
    assert control_keys_from(str(tmp_path)) == CONTROL
    assert control_keys_from(None) == []


def test_tls_takes_the_certificate_and_key_from_the_units_credentials(tmp_path):
    from vllm_fleet.router.launch import tls_kwargs

    tls = {"cert": "tls.crt", "key": "tls.key", "cert_sha256": "ab" * 32}
    settings = {**config("sglang"), "tls": tls}
    assert tls_kwargs(config("sglang"), str(tmp_path)) == {}
    # No credentials (the unit lost its LoadCredential=): no plain-HTTP fallback.
    with pytest.raises(SystemExit, match="refusing to serve plain HTTP"):
        tls_kwargs(settings, None)
    (tmp_path / "tls.crt").write_text("cert")
    with pytest.raises(SystemExit, match=r"tls\.key is missing"):
        tls_kwargs(settings, str(tmp_path))
    (tmp_path / "tls.key").write_text("key")
    assert tls_kwargs(settings, str(tmp_path)) == {
        "server_cert_path": str(tmp_path / "tls.crt"),
        "server_key_path": str(tmp_path / "tls.key"),
    }


def test_settings_the_launcher_does_not_know_stop_it(tmp_path):
    from vllm_fleet.router.launch import main

    settings = {**config("sglang"), "tls_v2": {"cert": "tls.crt"}}
    (tmp_path / "router.json").write_text(json.dumps(settings))
    with pytest.raises(SystemExit, match=r"does not know: \['tls_v2'\]"):
        main([str(tmp_path / "router.json")])
