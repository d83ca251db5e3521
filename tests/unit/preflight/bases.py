"""Good hosts that the bad-inventory corpus mutates (facts as the probes would report them)."""

from __future__ import annotations

import copy

GIB = 1024**3

SMOLLM2_CONFIG = {
    "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
    "head_dim": 64, "hidden_size": 576, "max_position_embeddings": 8192, "dtype": "bfloat16",
}  # fmt: skip
LLAMA_70B_CONFIG = {
    "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
    "hidden_size": 8192, "max_position_embeddings": 131072, "torch_dtype": "bfloat16",
}  # fmt: skip
QWEN_32B_CONFIG = {
    "num_hidden_layers": 64, "num_attention_heads": 40, "num_key_value_heads": 8,
    "hidden_size": 5120, "max_position_embeddings": 32768, "torch_dtype": "bfloat16",
}  # fmt: skip
DEEPSEEK_V3_CONFIG = {
    "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
    "hidden_size": 7168, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
    "max_position_embeddings": 163840, "torch_dtype": "bfloat16",
}  # fmt: skip

BASES: dict[str, dict[str, object]] = {
    "cpu": {
        "variables": {
            "fleet_accelerator": "cpu",
            "fleet_address": "10.0.0.21",
            "fleet_engine_stack": "cpu-vllm-0.32.0",
            "fleet_models": {
                "smollm2-135m": {
                    "source": "mirror",
                    "url": "http://router01:8088/models/smollm2-135m",
                    "revision": "b" * 64,
                    "served_name": "smollm2",
                    "config": SMOLLM2_CONFIG,
                    "weight_bytes": 269_060_552,
                },
            },
            "fleet_engine_groups": [
                {
                    "name": "g0",
                    "model": "smollm2-135m",
                    "devices": [0],
                    "port": 8100,
                    "max_model_len": 2048,
                    "max_num_seqs": 16,
                    "dtype": "float32",
                    "kv_cache_bytes": 1_610_612_736,
                    "enforce_eager": True,
                },
            ],
        },
        "facts": {"python": "3.11", "cpu_count": 2, "memory_bytes": 24 * GIB},
    },
    "cuda": {
        "variables": {
            "fleet_accelerator": "cuda",
            "fleet_address": "10.0.0.21",
            "fleet_engine_stack": "cuda-vllm-0.33.0",
            "fleet_models": {
                "llama-3.1-70b": {
                    "source": "hf",
                    "repo": "meta-llama/Llama-3.1-70B-Instruct",
                    "revision": "1" * 40,
                    "served_name": "llama-70b",
                    "config": LLAMA_70B_CONFIG,
                    "weight_bytes": 141_107_412_992,
                },
            },
            "fleet_engine_groups": [
                {
                    "name": "tp0",
                    "model": "llama-3.1-70b",
                    "devices": [0, 1, 2, 3],
                    "tensor_parallel_size": 4,
                    "port": 8100,
                    "max_model_len": 32768,
                    "max_num_seqs": 64,
                    "dtype": "bfloat16",
                },
            ],
        },
        "facts": {
            "python": "3.11",
            "cpu_count": 224,
            "memory_bytes": 2048 * GIB,
            "driver_version": "580.95.05",
            "devices": [{"index": i, "memory_bytes": 80 * GIB} for i in range(8)],
        },
    },
    "ascend": {
        "variables": {
            "fleet_accelerator": "ascend",
            "fleet_address": "10.0.0.21",
            "fleet_engine_stack": "ascend-vllm-0.23.0",
            "fleet_models": {
                "qwen2.5-32b": {
                    "source": "mirror",
                    "url": "http://mirror/models/qwen2.5-32b",
                    "revision": "c" * 64,
                    "served_name": "qwen2.5-32b",
                    "config": QWEN_32B_CONFIG,
                    "weight_bytes": 65_527_752_704,
                },
            },
            "fleet_engine_groups": [
                {
                    "name": "tp0",
                    "model": "qwen2.5-32b",
                    "devices": [0, 1, 2, 3],
                    "tensor_parallel_size": 4,
                    "port": 8100,
                    "max_model_len": 16384,
                    "max_num_seqs": 32,
                    "dtype": "bfloat16",
                },
            ],
        },
        "facts": {
            "python": "3.11",
            "cpu_count": 192,
            "memory_bytes": 1536 * GIB,
            "driver_version": "25.2.0",
            "cann_version": "9.1.0",
            "devices": [{"index": i, "memory_bytes": 64 * GIB, "healthy": True} for i in range(8)],
        },
    },
}


def base(name: str) -> dict[str, object]:
    return copy.deepcopy(BASES[name])
