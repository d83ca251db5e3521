"""The preflight plan and findings as a Markdown table."""

from __future__ import annotations

from vllm_fleet.preflight.checks import PreflightResult

GIB = 1024**3


def render_markdown(result: PreflightResult) -> str:
    lines = [
        "| host | group | stack | devices | KV bytes/token | KV cache | KV tokens | "
        "max concurrency at max_model_len | max_model_len | max_num_seqs | MemoryMax |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result.plan:
        bound = result.memory_plan.get(row.host, {}).get(row.group)
        lines.append(
            f"| {row.host} | {row.group} | {row.stack} | {','.join(map(str, row.devices))} | "
            f"{row.kv_bytes_per_token} | {row.kv_cache_bytes / GIB:.2f} GiB | {row.capacity_tokens} | "
            f"{row.max_concurrency} | {row.max_model_len} | {row.max_num_seqs} | "
            f"{'none' if bound is None else f'{bound / GIB:.2f} GiB'} |"
        )
    if result.warnings:
        lines += ["", "Warnings:"] + [f"- {w}" for w in result.warnings]
    if result.errors:
        lines += ["", "Errors:"] + [f"- {e}" for e in result.errors]
    return "\n".join(lines) + "\n"
