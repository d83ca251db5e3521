"""KV planner figures, each computed by hand in the comment beside it."""

import json
import struct

import pytest

from vllm_fleet.preflight.kv_planner import (
    AttentionShape,
    PlanError,
    kv_bytes_per_token,
    plan,
    request_kv_bytes,
    safetensors_weight_bytes,
)

QWEN25_72B = {
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "hidden_size": 8192,
    "torch_dtype": "bfloat16",
}
QWEN25_7B = {
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "hidden_size": 3584,
    "torch_dtype": "bfloat16",
}
DEEPSEEK_V3 = {
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "hidden_size": 7168,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "torch_dtype": "bfloat16",
}
GEMMA2_9B = {
    "num_hidden_layers": 42,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 256,
    "hidden_size": 3584,
    "sliding_window": 4096,
    "layer_types": ["sliding_attention", "full_attention"] * 21,
    "torch_dtype": "bfloat16",
}
SMOLLM2_135M = {
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "hidden_size": 576,
    "dtype": "bfloat16",
}


def shape(config):
    return AttentionShape.from_config(config)


def test_qwen25_72b_bf16_is_327680_bytes_per_token():
    # 2 (K,V) x 8 KV heads x 128 head_dim x 2 bytes x 80 layers
    assert kv_bytes_per_token(shape(QWEN25_72B), tp=1, kv_dtype="bfloat16") == 327_680


def test_qwen25_72b_tp8_holds_one_kv_head_per_rank():
    # 8 KV heads over 8 ranks: 1 per rank -> 327680 / 8
    assert kv_bytes_per_token(shape(QWEN25_72B), tp=8, kv_dtype="bfloat16") == 40_960


def test_gqa_7b():
    # Qwen2.5-7B: 2 x 4 x (3584 / 28 = 128) x 2 bytes x 28 layers
    assert kv_bytes_per_token(shape(QWEN25_7B), tp=1, kv_dtype="bfloat16") == 57_344


def test_kv_heads_are_replicated_when_tp_exceeds_them():
    # 4 KV heads, TP 8: each rank still keeps one head -> 2 x 1 x 128 x 2 x 28
    assert kv_bytes_per_token(shape(QWEN25_7B), tp=8, kv_dtype="bfloat16") == 14_336


def test_fp8_kv_cache_halves_bf16():
    assert kv_bytes_per_token(shape(QWEN25_7B), tp=1, kv_dtype="fp8") == 28_672


def test_deepseek_v3_mla_is_576_values_per_token_per_layer_on_every_rank():
    mla = shape(DEEPSEEK_V3)
    assert mla.is_mla
    # (512 + 64) values x 2 bytes x 61 layers, whatever the TP size
    assert kv_bytes_per_token(mla, tp=1, kv_dtype="bfloat16") == 576 * 2 * 61 == 70_272
    assert kv_bytes_per_token(mla, tp=8, kv_dtype="bfloat16") == 70_272


def test_sliding_window_layers_stop_growing_at_the_window():
    gemma = shape(GEMMA2_9B)
    assert (gemma.full_layers, gemma.sliding_layers) == (21, 21)
    per_layer = 2 * 8 * 256 * 2  # 8192 bytes per token per layer
    # 8192 tokens: 21 full layers hold 8192, 21 sliding layers hold 4096
    assert request_kv_bytes(gemma, 8192, tp=1, kv_dtype="bfloat16") == per_layer * 21 * (
        8192 + 4096
    )
    # Below the window both kinds hold every token
    assert request_kv_bytes(gemma, 1000, tp=1, kv_dtype="bfloat16") == per_layer * 42 * 1000


def test_all_sliding_model_without_layer_types():
    mistral = shape({**QWEN25_7B, "sliding_window": 4096})
    assert mistral.full_layers == 0
    per_layer = 2 * 4 * 128 * 2
    assert request_kv_bytes(mistral, 32768, 1, "bfloat16") == per_layer * 28 * 4096


def test_vlm_reads_its_text_config():
    vlm = shape({"model_type": "llava", "text_config": QWEN25_7B})
    assert kv_bytes_per_token(vlm, 1, "bfloat16") == 57_344


def test_plan_for_the_lab_engine():
    # SmolLM2-135M served in float32: 2 x 3 x 64 x 4 bytes x 30 layers = 46080 bytes/token.
    # 1 GiB of KV cache -> 1073741824 // 46080 = 23301 tokens; at 2048 tokens a request,
    # 11.38 requests fit; 16 requests fit up to 1456 tokens each (16 x 1456 x 46080 <= 1 GiB).
    result = plan(shape(SMOLLM2_135M), 1 << 30, 2048, 16, tp=1, kv_dtype="float32")
    assert result.kv_bytes_per_token == 46_080
    assert result.capacity_tokens == 23_301
    assert result.max_concurrency == pytest.approx(11.378, abs=1e-3)
    assert result.max_model_len_for_target == 1456
    assert result.one_request_fits
    assert not result.target_fits


def test_one_request_that_does_not_fit():
    # 72B at 131072 tokens: 327680 x 131072 = 40 GiB > a 30 GiB budget
    result = plan(shape(QWEN25_72B), 30 << 30, 131_072, 8, tp=1)
    assert not result.one_request_fits
    assert result.max_model_len_for_target * 8 * 327_680 <= 30 << 30


def test_missing_fields_and_unknown_dtype_are_clear_errors():
    with pytest.raises(PlanError, match="no num_hidden_layers"):
        shape({"num_attention_heads": 8})
    with pytest.raises(PlanError, match="unknown dtype 'int3'"):
        kv_bytes_per_token(shape(QWEN25_7B), 1, "int3")


def test_weight_bytes_come_from_safetensors_headers(tmp_path):
    header = {
        "a": {"dtype": "BF16", "shape": [4, 8], "data_offsets": [0, 64]},
        "b": {"dtype": "F32", "shape": [3], "data_offsets": [64, 76]},
        "__metadata__": {"format": "pt"},
    }
    raw = json.dumps(header).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(76))
    assert safetensors_weight_bytes(tmp_path) == 4 * 8 * 2 + 3 * 4


def test_model_info_cli_reads_config_and_header_sizes(tmp_path, capsys):
    from vllm_fleet.cli import main

    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2_135M))
    header = json.dumps(
        {"w": {"dtype": "BF16", "shape": [10, 10], "data_offsets": [0, 200]}}
    ).encode()
    (tmp_path / "model.safetensors").write_bytes(
        struct.pack("<Q", len(header)) + header + bytes(200)
    )
    assert main(["model-info", str(tmp_path)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info == {"config": SMOLLM2_135M, "weight_bytes": 200}
