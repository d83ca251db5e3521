"""The preflight plan and findings as a Markdown table."""

from __future__ import annotations

from vllm_fleet.preflight.checks import PreflightResult

GIB = 1024**3


def render_markdown(result: PreflightResult) -> str:
    lines = [
        "| host | group | stack | devices | KV bytes/token | KV cache | KV tokens | "
        "max concurrency at max_model_len | max_model_len | max_num_seqs |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result.plan:
        lines.append(
            f"| {row.host} | {row.group} | {row.stack} | {','.join(map(str, row.devices))} | "
            f"{row.kv_bytes_per_token} | {row.kv_cache_bytes / GIB:.2f} GiB | {row.capacity_tokens} | "
            f"{row.max_concurrency} | {row.max_model_len} | {row.max_num_seqs} |"
        )
    if result.warnings:
        lines += ["", "Warnings:"] + [f"- {w}" for w in result.warnings]
    if result.errors:
        lines += ["", "Errors:"] + [f"- {e}" for e in result.errors]
    return "\n".join(lines) + "\n"
