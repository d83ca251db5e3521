"""KV-cache planning: how many tokens and requests fit, from a model's config.json.

Per token and layer, attention keeps K and V for each KV head on each rank:
``2 x kv_heads_per_rank x head_dim x dtype_bytes`` with ``kv_heads_per_rank =
max(1, kv_heads // tp)`` (KV heads are replicated when TP exceeds them). MLA
(DeepSeek V2/V3) keeps one latent of ``kv_lora_rank + qk_rope_head_dim`` values per
token and layer, no factor 2, replicated on every rank. A sliding-window layer holds
at most ``window`` tokens of a request.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "bfloat16": 2,
    "bf16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "int8": 1,
}
SAFETENSORS_DTYPE_BYTES: dict[str, int] = {
    "F64": 8,
    "I64": 8,
    "F32": 4,
    "I32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}


class PlanError(ValueError):
    """A config the planner cannot read, worded for the operator."""


@dataclass(frozen=True)
class AttentionShape:
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    sliding_window: int | None = None
    # Layers that attend over the whole sequence; the rest use the sliding window.
    full_attention_layers: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    dtype: str = "bfloat16"

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def full_layers(self) -> int:
        if self.full_attention_layers is not None:
            return self.full_attention_layers
        return 0 if self.sliding_window else self.num_layers

    @property
    def sliding_layers(self) -> int:
        return self.num_layers - self.full_layers

    @classmethod
    def from_config(cls, config: dict[str, object]) -> AttentionShape:
        """Read the attention shape from a Hugging Face config.json (VLMs: its text_config)."""
        text = config.get("text_config")
        cfg = {**config, **text} if isinstance(text, dict) else dict(config)
        for key in ("num_hidden_layers", "num_attention_heads"):
            if key not in cfg:
                raise PlanError(f"config.json has no {key}")
        layers = _positive(cfg, "num_hidden_layers")
        heads = _positive(cfg, "num_attention_heads")
        # Optional fields: absent, null or 0 take their defaults.
        kv_heads = (
            _positive(cfg, "num_key_value_heads") if cfg.get("num_key_value_heads") else heads
        )
        if cfg.get("head_dim"):
            head_dim = _positive(cfg, "head_dim")
        elif "hidden_size" not in cfg:
            raise PlanError("config.json has no head_dim and no hidden_size")
        else:
            head_dim = _positive(cfg, "hidden_size") // heads
            if not head_dim:
                raise PlanError(
                    f"config.json's hidden_size {cfg['hidden_size']} is smaller than its "
                    f"{heads} attention heads"
                )
        window = _positive(cfg, "sliding_window") if cfg.get("sliding_window") else None
        layer_types = cfg.get("layer_types")
        full = None
        if isinstance(layer_types, list):
            full = sum(1 for t in layer_types if "sliding" not in str(t))
        elif cfg.get("use_sliding_window") is False:
            window = None
        dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
        return cls(
            num_layers=layers,
            num_attention_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            sliding_window=window,
            full_attention_layers=full,
            kv_lora_rank=_positive(cfg, "kv_lora_rank") if cfg.get("kv_lora_rank") else None,
            qk_rope_head_dim=(
                _positive(cfg, "qk_rope_head_dim") if cfg.get("qk_rope_head_dim") else None
            ),
            dtype=dtype,
        )


def _positive(cfg: dict[object, object], key: str) -> int:
    """A config.json size: a whole number above 0 (and below 2**63; true is not a number)."""
    value = cfg[key]
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**63:
        return value
    raise PlanError(f"config.json's {key}={value!r} is not a positive whole number")


def dtype_bytes(name: str) -> int:
    try:
        return DTYPE_BYTES[name.lower()]
    except KeyError as err:
        raise PlanError(f"unknown dtype {name!r}; use one of {sorted(DTYPE_BYTES)}") from err


def kv_bytes_per_token_per_layer(shape: AttentionShape, tp: int, kv_dtype: str) -> int:
    """KV bytes one token costs in one layer, on one rank."""
    size = dtype_bytes(kv_dtype)
    if shape.is_mla:
        return (shape.kv_lora_rank or 0) * size + (shape.qk_rope_head_dim or 0) * size
    kv_heads_per_rank = max(1, shape.num_kv_heads // tp)
    return 2 * kv_heads_per_rank * shape.head_dim * size


def request_kv_bytes(shape: AttentionShape, tokens: int, tp: int, kv_dtype: str) -> int:
    """KV bytes one request of ``tokens`` tokens holds, on one rank."""
    per_layer = kv_bytes_per_token_per_layer(shape, tp, kv_dtype)
    window = shape.sliding_window or tokens
    return per_layer * (shape.full_layers * tokens + shape.sliding_layers * min(tokens, window))


def kv_bytes_per_token(shape: AttentionShape, tp: int, kv_dtype: str) -> int:
    """Bytes per token over all layers, on one rank, as if every layer kept every token."""
    return kv_bytes_per_token_per_layer(shape, tp, kv_dtype) * shape.num_layers


def safetensors_weight_bytes(model_dir: Path) -> int:
    """Total tensor bytes of a model's *.safetensors, read from their headers only."""
    total = 0
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise PlanError(f"{model_dir}: no *.safetensors files")
    for path in files:
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            count = 1
            for dim in info["shape"]:
                count *= dim
            total += count * SAFETENSORS_DTYPE_BYTES[info["dtype"]]
    return total


@dataclass(frozen=True)
class Plan:
    kv_bytes_per_token: int
    kv_capacity_bytes: int
    capacity_tokens: int
    request_bytes: int
    max_concurrency: float
    max_model_len_for_target: int
    target_num_seqs: int
    max_model_len: int

    @property
    def one_request_fits(self) -> bool:
        return self.max_concurrency >= 1

    @property
    def target_fits(self) -> bool:
        return self.max_concurrency >= self.target_num_seqs


def largest_len(shape: AttentionShape, budget: int, seqs: int, tp: int, kv_dtype: str) -> int:
    """The largest request length L with seqs x request_kv_bytes(L) <= budget (binary search)."""
    low, high = 0, 1
    while seqs * request_kv_bytes(shape, high, tp, kv_dtype) <= budget and high < 1 << 40:
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        if seqs * request_kv_bytes(shape, mid, tp, kv_dtype) <= budget:
            low = mid
        else:
            high = mid
    return low


def plan(
    shape: AttentionShape,
    kv_capacity_bytes: int,
    max_model_len: int,
    max_num_seqs: int,
    *,
    tp: int = 1,
    kv_dtype: str | None = None,
) -> Plan:
    """What fits in kv_capacity_bytes of KV cache on one rank."""
    kv_dtype = kv_dtype or shape.dtype
    per_token = kv_bytes_per_token(shape, tp, kv_dtype)
    request = request_kv_bytes(shape, max_model_len, tp, kv_dtype)
    return Plan(
        kv_bytes_per_token=per_token,
        kv_capacity_bytes=kv_capacity_bytes,
        capacity_tokens=kv_capacity_bytes // per_token,
        request_bytes=request,
        max_concurrency=kv_capacity_bytes / request,
        max_model_len_for_target=largest_len(shape, kv_capacity_bytes, max_num_seqs, tp, kv_dtype),
        target_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
    )


def available_kv_bytes(
    device_bytes: int, utilization: float, weight_bytes: int, tp: int, reserve_bytes: int
) -> int:
    """KV budget per device: memory x utilization - this rank's weights - a reserve."""
    return int(device_bytes * utilization) - weight_bytes // tp - reserve_bytes
