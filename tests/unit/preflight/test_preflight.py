"""Preflight refuses each bad inventory of the corpus with its own message, and passes good ones."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.support.paths import ROOT
from tests.unit.preflight.bases import base
from vllm_fleet.engine.config import EngineConfig
from vllm_fleet.preflight import HostInput, validate
from vllm_fleet.preflight.checks import GROUP_OPTIONAL, GROUP_REQUIRED
from vllm_fleet.preflight.facts import HostFacts
from vllm_fleet.preflight.report import render_markdown

GIB = 1024**3

CATALOG = yaml.safe_load((ROOT / "catalog/stacks.yml").read_text())["fleet_stacks"]
CASES = yaml.safe_load((Path(__file__).with_name("cases.yml")).read_text())
KNOWN = {
    "fleet_accelerator", "fleet_address", "fleet_engine_stack", "fleet_engine_groups", "fleet_models",
    "fleet_engine_firewall", "fleet_engine_firewall_sources",
    "fleet_engine_api_key", "fleet_wheelhouse_dir", "fleet_wheelhouse_url",
    "fleet_memory_utilization", "fleet_memory_reserve_bytes", "fleet_engine_memory_overhead_bytes",
}  # fmt: skip


def walk(tree: dict, path: str) -> tuple[object, str | int]:
    *parents, last = path.split("/")
    node: object = tree
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]  # type: ignore[index]
    return node, int(last) if isinstance(node, list) else last


def mutate(case: dict) -> dict:
    host = base(case["base"])
    for path, value in (case.get("set") or {}).items():
        node, key = walk(host, path)
        node[key] = value  # type: ignore[index]
    for path in case.get("delete") or []:
        node, key = walk(host, path)
        del node[key]  # type: ignore[arg-type]
    for path, value in (case.get("append") or {}).items():
        node, key = walk(host, path)
        node[key].append(value)  # type: ignore[index]
    return host


def run(host: dict, name: str = "host1"):
    facts = HostFacts.from_dict(host["facts"])
    return validate([HostInput(name, host["variables"], facts)], CATALOG, KNOWN)


def test_the_corpus_is_big_and_every_message_is_its_own():
    assert len(CASES) >= 25
    assert len({c["expect"] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_bad_inventory_is_refused_with_its_message(case):
    result = run(mutate(case))
    messages = [str(e) for e in result.errors]
    assert not result.ok
    assert any(case["expect"] in m for m in messages), messages
    assert all(m.startswith("host1: ") and "; fix: " in m for m in messages)


@pytest.mark.parametrize("name", ["cpu", "cuda", "ascend"])
def test_good_hosts_pass_and_get_a_plan(name):
    result = run(base(name))
    assert result.errors == []
    assert len(result.plan) == 1
    assert result.plan[0].capacity_tokens > 0


def test_lab_engine_plan_matches_hand_figures():
    row = run(base("cpu")).plan[0]
    # 1.5 GiB / 46080 bytes per token (float32 KV of SmolLM2-135M)
    assert (row.kv_bytes_per_token, row.capacity_tokens) == (46_080, 34_952)
    assert row.max_concurrency == 17.07


def test_gpu_plan_chooses_the_kv_size_from_memory():
    row = run(base("cuda")).plan[0]
    # 80 GiB x 0.9 - 141107412992 / 4 weights - 2 GiB reserve
    assert row.kv_cache_bytes == int(80 * 1024**3 * 0.9) - 141_107_412_992 // 4 - 2 * 1024**3
    assert row.kv_bytes_per_token == 2 * 2 * 128 * 2 * 80  # 2 KV heads per rank at TP 4


def test_a_cpu_engine_is_bounded_by_its_weights_at_its_dtype_its_kv_cache_and_the_overhead():
    result = run(base("cpu"))
    # SmolLM2's bfloat16 files served in float32 (twice), 1.5 GiB of KV cache, 4 GiB overhead.
    assert result.memory_plan == {"host1": {"g0": 269_060_552 * 2 + 1_610_612_736 + 4 * GIB}}
    assert "| 6.00 GiB |" in render_markdown(result)
    host = base("cpu")
    host["variables"]["fleet_engine_memory_overhead_bytes"] = GIB
    host["variables"]["fleet_engine_groups"][0]["dtype"] = "auto"
    assert run(host).memory_plan["host1"]["g0"] == 269_060_552 + 1_610_612_736 + GIB


def test_device_engines_share_the_hosts_memory_by_devices_and_a_set_bound_wins():
    # 2048 GiB less the 2 GiB reserve; the group has 4 of the host's 8 GPUs.
    assert run(base("cuda")).memory_plan["host1"]["tp0"] == 2046 * GIB // 2
    host = base("ascend")
    host["variables"]["fleet_engine_groups"][0]["memory_max_bytes"] = 200 * GIB
    assert run(host).memory_plan["host1"]["tp0"] == 200 * GIB


def test_device_engines_on_a_host_of_unknown_memory_get_no_bound_and_a_warning():
    host = base("cuda")
    host["facts"]["memory_bytes"] = 0
    result = run(host)
    assert result.ok and result.memory_plan == {}
    assert any("gets no memory bound" in str(w) for w in result.warnings)


def test_target_concurrency_that_does_not_fit_is_a_warning_with_numbers():
    host = base("cpu")
    host["variables"]["fleet_engine_groups"][0]["max_num_seqs"] = 64
    result = run(host)
    assert result.ok
    [warning] = result.warnings
    assert "64 requests of 2048 tokens need 5.62 GiB of KV cache, 1.50 GiB holds 17.1" in str(
        warning
    )
    assert "lower max_num_seqs to 17 or max_model_len to 546" in str(warning)


def test_mla_model_plans_with_the_latent_size():
    host = base("cuda")
    host["variables"]["fleet_models"]["llama-3.1-70b"]["config"] = {
        "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
        "hidden_size": 7168, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "torch_dtype": "bfloat16",
    }  # fmt: skip
    row = run(host).plan[0]
    assert row.kv_bytes_per_token == 576 * 2 * 61


def test_group_settings_match_the_vllm_engine_argument_spec():
    spec = yaml.safe_load((ROOT / "roles/vllm_engine/meta/argument_specs.yml").read_text())
    options = spec["argument_specs"]["main"]["options"]["vllm_engine_groups"]["options"]
    assert set(options) == set(GROUP_REQUIRED + GROUP_OPTIONAL)
    assert {k for k, o in options.items() if o.get("required")} == set(GROUP_REQUIRED)
    # ... and each reaches the engine as the setting of the same name (the name and the model
    # become its unit, model path and served name).
    renamed = {"name", "model"}
    assert set(GROUP_REQUIRED + GROUP_OPTIONAL) - renamed <= set(EngineConfig.model_fields)


def test_fp8_kv_cache_doubles_the_tokens_of_bf16():
    host = base("cuda")
    bf16 = run(host).plan[0]
    host["variables"]["fleet_engine_groups"][0]["kv_cache_dtype"] = "fp8"
    fp8 = run(host).plan[0]
    assert fp8.kv_bytes_per_token * 2 == bf16.kv_bytes_per_token
    assert fp8.capacity_tokens == bf16.capacity_tokens * 2


def test_installed_weights_override_the_catalog_metadata():
    host = base("cuda")
    installed = {
        "llama-3.1-70b": {
            "config": host["variables"]["fleet_models"]["llama-3.1-70b"]["config"],
            "weight_bytes": 100 * 1024**3,
        }
    }
    facts = HostFacts.from_dict(host["facts"])
    result = validate([HostInput("h", host["variables"], facts, installed)], CATALOG, KNOWN)
    # 80 GiB x 0.9 - 100 GiB / 4 - 2 GiB
    assert result.plan[0].kv_cache_bytes == int(80 * 1024**3 * 0.9) - 25 * 1024**3 - 2 * 1024**3


@pytest.mark.parametrize(
    "key",
    ["fleet_router_contrl_key", "fleet_engine_api_kye", "fleet_hf_tokn", "fleet_router_secrt"],
)
def test_an_unknown_variable_is_named_but_its_value_never_shown(key):
    """A misspelt secret no longer looks like one: no unknown variable's value is shown."""
    host = base("cpu")
    host["variables"][key] = "s3cret-value-that-must-not-leak"
    messages = [str(e) for e in run(host).errors]
    assert any(f"{key}='<not shown>': unknown variable" in m for m in messages), messages
    assert not any("s3cret-value" in m for m in messages)


@pytest.mark.parametrize("name", ["..", ".", ".hidden"])
def test_a_model_name_that_would_leave_the_models_root_is_refused(name):
    host = base("cpu")
    models = host["variables"]["fleet_models"]
    models[name] = models.pop("smollm2-135m")
    host["variables"]["fleet_engine_groups"][0]["model"] = name
    messages = [str(e) for e in run(host).errors]
    assert any(
        f"fleet_models.{name}={name!r}: a model name becomes a directory" in m for m in messages
    ), messages


@pytest.mark.parametrize(
    ("variables", "warned"),
    [({"fleet_address": "10.0.0.21"}, False), ({"fleet_address": "fd00::21"}, False),
     ({"ansible_host": "10.0.0.21"}, False), ({}, True), ({"ansible_host": "gpu-7.dc1"}, True),
     ({"fleet_address": "gpu-7.dc1"}, True)],
)  # fmt: skip
def test_a_host_the_fleet_reaches_by_name_is_a_warning(variables, warned):
    host = base("cpu")
    del host["variables"]["fleet_address"]
    host["variables"] |= variables
    result = run(host)
    assert result.ok
    dns = [w for w in result.warnings if "DNS outage" in w.message]
    assert bool(dns) == warned, result.warnings
    if warned:
        assert "set fleet_address to the host's private IP address" in dns[0].fix


@pytest.mark.parametrize("value", ["10.0.0.21/24", "http://10.0.0.21", "", 21, "a b", "-x"])
def test_a_fleet_address_that_is_no_address_is_refused(value):
    host = base("cpu")
    host["variables"]["fleet_address"] = value
    [error] = run(host).errors
    assert (error.key, error.value) == ("fleet_address", value)
    assert "not an IP address or host name" in error.message
