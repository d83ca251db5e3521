"""The KV planner's predicted capacity against what the lab's real engines report.

Run with the lab up (make lab). For each engine group it reads the group's settings and
the model's config.json on the host, predicts the KV capacity in tokens with
vllm_fleet.preflight.kv_planner, and divides by the capacity vLLM reports in vllm:cache_config_info
(num_gpu_blocks x block_size). The target is a ratio within 0.95-1.05.
"""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
from prometheus_client.parser import text_string_to_metric_families

from vllm_fleet.preflight.kv_planner import AttentionShape, plan

ENGINES = {"engine01": "http://127.0.0.1:8101", "engine02": "http://127.0.0.1:8102"}


def on_host(host: str, path: str) -> str:
    argv = ["podman", "exec", host, "cat", path]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def reported_tokens(base_url: str) -> int:
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        if family.name == "vllm:cache_config_info":
            labels = family.samples[0].labels
            return int(labels["num_gpu_blocks"]) * int(labels["block_size"])
    raise SystemExit(f"{base_url}: no vllm:cache_config_info")


def main() -> int:
    print(f"{'host':10s} {'group':6s} {'predicted':>10s} {'reported':>10s} {'ratio':>7s}")
    worst = 0.0
    for host, url in ENGINES.items():
        settings = json.loads(on_host(host, "/etc/vllm-fleet/engines/g0.json"))
        config = json.loads(on_host(host, f"{settings['model_path']}/config.json"))
        shape = AttentionShape.from_config(config)
        kv_dtype = shape.dtype if settings["dtype"] == "auto" else settings["dtype"]
        predicted = plan(
            shape,
            settings["kv_cache_bytes"],
            settings["max_model_len"],
            settings["max_num_seqs"],
            tp=settings["tensor_parallel_size"],
            kv_dtype=kv_dtype,
        ).capacity_tokens
        reported = reported_tokens(url)
        ratio = predicted / reported
        worst = max(worst, abs(ratio - 1))
        print(f"{host:10s} {settings['group']:6s} {predicted:10d} {reported:10d} {ratio:7.4f}")
    print(f"largest deviation: {worst:.2%} (target: within 5%)")
    return 0 if worst <= 0.05 else 1


if __name__ == "__main__":
    sys.exit(main())
