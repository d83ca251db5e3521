"""Reading an engine's Prometheus ``/metrics``.

prometheus_client's parser drops ``_total`` from counter family names, so families are
looked up by their base name and a counter's value by its ``_total`` sample.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

Families = dict[str, Metric]

RUNNING = "vllm:num_requests_running"
PREFIX_QUERIES = "vllm:prefix_cache_queries"
PREFIX_HITS = "vllm:prefix_cache_hits"
CACHE_CONFIG = "vllm:cache_config_info"


def base_name(name: str) -> str:
    return name.removesuffix("_total")


def parse_families(text: str) -> Families:
    return {base_name(f.name): f for f in text_string_to_metric_families(text)}


async def fetch_families(client: httpx.AsyncClient, base_url: str) -> Families:
    # vLLM leaves /metrics open: no key is sent.
    response = await client.get(f"{base_url}/metrics")
    response.raise_for_status()
    return parse_families(response.text)


def missing_families(families: Families, expected: list[str]) -> list[str]:
    return [name for name in expected if base_name(name) not in families]


def value(families: Families, name: str) -> float | None:
    """Sum over every label set (engine index, model name) of a gauge or counter."""
    family = families.get(base_name(name))
    if family is None:
        return None
    wanted = {base_name(name), base_name(name) + "_total"}
    return sum(s.value for s in family.samples if s.name in wanted)


@dataclass(frozen=True)
class KvCapacity:
    tokens: int
    num_gpu_blocks: int
    block_size: int
    max_concurrency: str | None = None  # vLLM's own figure, at max_model_len

    def __str__(self) -> str:
        text = f"{self.tokens} tokens ({self.num_gpu_blocks} blocks x {self.block_size})"
        return text + (f", max concurrency {self.max_concurrency}" if self.max_concurrency else "")


def _int_label(labels: dict[str, str], name: str) -> int | None:
    try:
        return int(labels[name])
    except (KeyError, ValueError):
        return None


def kv_capacity(families: Families) -> KvCapacity | None:
    """KV capacity as the engine reports it in ``vllm:cache_config_info``.

    vLLM calls its KV blocks "gpu blocks" on every backend (CPU included). Recent versions
    also label ``kv_cache_size_tokens``; older ones only have num_gpu_blocks x block_size.
    One sample per engine core, so data-parallel engines add up.
    """
    family = families.get(CACHE_CONFIG)
    if family is None or not family.samples:
        return None
    tokens = blocks = 0
    block_size: int | None = None
    for sample in family.samples:
        sample_blocks = _int_label(sample.labels, "num_gpu_blocks")
        block_size = _int_label(sample.labels, "block_size")
        if sample_blocks is None or block_size is None:
            return None
        blocks += sample_blocks
        reported = _int_label(sample.labels, "kv_cache_size_tokens")
        tokens += reported if reported is not None else sample_blocks * block_size
    concurrency = family.samples[0].labels.get("kv_cache_max_concurrency")
    return KvCapacity(tokens, blocks, block_size or 0, concurrency)


def cache_config_labels(families: Families) -> dict[str, str]:
    family = families.get(CACHE_CONFIG)
    return dict(family.samples[0].labels) if family and family.samples else {}
