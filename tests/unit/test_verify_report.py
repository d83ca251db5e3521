"""The report (JSON shape, Markdown, console summary) and reading vLLM's /metrics text."""

import json
from datetime import UTC, datetime

from vllm_fleet.verify import engine_metrics
from vllm_fleet.verify.config import DEFAULT_FAMILIES, VerifyConfig
from vllm_fleet.verify.report import build_report, fleet_rows, render_markdown, summary_lines
from vllm_fleet.verify.results import CheckResult
from vllm_fleet.verify.smoke import EngineFacts

# Trimmed from a vLLM 0.32 CPU engine's /metrics.
VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="smollm2"} 3.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="smollm2"} 1274.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="smollm2"} 1.7960057139951222e+09
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="smollm2"} 512.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",enable_prefix_caching="True",engine="0",\
kv_cache_max_concurrency="17.0625",kv_cache_size_tokens="34944",num_cpu_blocks="None",\
num_gpu_blocks="273"} 1.0
"""


def test_metrics_counters_are_found_by_their_family_name_without_total():
    families = engine_metrics.parse_families(VLLM_METRICS)

    assert engine_metrics.value(families, "vllm:prefix_cache_hits") == 512
    assert engine_metrics.value(families, "vllm:prefix_cache_queries_total") == 1274
    assert engine_metrics.value(families, "vllm:num_requests_running") == 3
    assert engine_metrics.value(families, "vllm:num_preemptions") is None
    assert engine_metrics.missing_families(families, DEFAULT_FAMILIES) == [
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions",
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
    ]


def test_kv_capacity_as_reported_by_the_engine():
    kv = engine_metrics.kv_capacity(engine_metrics.parse_families(VLLM_METRICS))
    assert (kv.tokens, kv.num_gpu_blocks, kv.block_size) == (34944, 273, 128)
    assert str(kv) == "34944 tokens (273 blocks x 128), max concurrency 17.0625"


def test_kv_capacity_from_blocks_when_the_engine_does_not_label_tokens():
    text = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="100",engine="0"} 1.0\n'
    kv = engine_metrics.kv_capacity(engine_metrics.parse_families(text))
    assert kv.tokens == 1600
    bad = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="None",engine="0"} 1.0\n'
    assert engine_metrics.kv_capacity(engine_metrics.parse_families(bad)) is None


def sample_report():
    cfg = VerifyConfig.model_validate(
        {
            "engines": [
                {
                    "host": "engine01",
                    "group": "g0",
                    "url": "http://engine01:8100",
                    "stack": "cpu-vllm-0.32.0",
                    "commit": "0123456789ab+dirty",
                    "model": "smollm2-135m",
                    "served_name": "smollm2",
                    "revision": "bffa" * 16,
                    "devices": [0, 1],
                    "max_num_seqs": 16,
                    "dtype": "float32",
                },
                {
                    "host": "engine02",
                    "group": "g0",
                    "url": "http://engine02:8100",
                    "stack": "cpu-vllm-0.32.0",
                    "model": "smollm2-135m",
                    "served_name": "smollm2",
                    "revision": "bffa" * 16,
                    "devices": [0],
                    "max_num_seqs": 16,
                    "dtype": "float32",
                },
            ],
            "router": {
                "url": "http://router01:30000",
                "policy": "cache_aware",
                "request_timeout_seconds": 300,
                "admission_factor": 2,
            },
        }
    )
    kv = engine_metrics.kv_capacity(engine_metrics.parse_families(VLLM_METRICS))
    facts = {"engine01/g0": EngineFacts(health="ok", kv_capacity=kv)}
    checks = [
        CheckResult(
            "smoke engine01/g0",
            "pass",
            "8/8 ok",
            {"items": [{"name": "chat", "ok": True, "detail": "5 tokens: 'Paris'"}]},
            0.4,
        ),
        CheckResult(
            "crosstalk",
            "fail",
            "C=64: 3 contaminated",
            {
                "served_name": "smollm2",
                "concurrency": 64,
                "reasons": ["FAIL: 3 answers carry another prompt's marker"],
                "per_prompt": [
                    {
                        "index": 0,
                        "marker": "Zorbleck",
                        "requests": 7,
                        "contaminated": 3,
                        "diverged": 3,
                        "errors": 0,
                        "retries": 1,
                        "baseline_has_marker": True,
                        "first_divergence": 0,
                        "foreign_markers": ["Quindara"],
                    }
                ],
            },
            12.5,
        ),
        CheckResult("prefix_cache engine01/g0", "warn", "odd | pipe", {}, 1.0),
    ]
    started = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    return build_report(cfg, fleet_rows(cfg, facts), checks, started, 14.2)


def test_report_json_shape_and_verdict():
    report = json.loads(json.dumps(sample_report()))  # what report.json holds

    assert report["verdict"] == "fail"
    assert report["counts"] == {"pass": 1, "warn": 1, "fail": 1}
    assert report["served_names"] == ["smollm2"]
    assert report["concurrency"] == {"smollm2": 64}
    assert [r["kv_capacity_tokens"] for r in report["fleet"]] == [34944, None]
    assert [r["health"] for r in report["fleet"]] == ["ok", "unknown"]
    assert report["checks"][1]["details"]["per_prompt"][0]["contaminated"] == 3


def test_markdown_has_fleet_table_checks_and_per_prompt_counts():
    markdown = render_markdown(sample_report())
    lines = markdown.splitlines()

    assert lines[0] == "# vllm-fleet verify: FAIL"
    assert (
        "| engine01 | g0 | cpu-vllm-0.32.0 | 0123456789ab+dirty | smollm2-135m | smollm2 | "
        "bffabffabffa | 0,1 | 16 | float32 | "
        "34944 tokens (273 blocks x 128), max concurrency 17.0625 | ok |"
    ) in lines
    assert (
        "| engine02 | g0 | cpu-vllm-0.32.0 | not recorded | smollm2-135m | smollm2 | bffabffabffa | 0 | 16 | float32 | "
        "not reported | unknown |"
    ) in lines
    assert "| crosstalk | FAIL | 12.5 s | C=64: 3 contaminated |" in lines
    assert "| prefix_cache engine01/g0 | WARN | 1.0 s | odd \\| pipe |" in lines
    assert "- [ok] chat: 5 tokens: 'Paris'" in lines
    assert "- FAIL: 3 answers carry another prompt's marker" in lines
    assert "| 0 | Zorbleck | 7 | 3 | 3 | 0 | 1 | True | 0 | Quindara |" in lines
    assert "- router: http://router01:30000 (cache_aware)" in lines
    assert "- served names: `smollm2` (cross-talk C = 64)" in lines


def test_summary_has_one_line_per_check_and_the_verdict():
    lines = summary_lines(sample_report())
    assert lines == [
        "[PASS] smoke engine01/g0: 8/8 ok (0.4s)",
        "[FAIL] crosstalk: C=64: 3 contaminated (12.5s)",
        "[WARN] prefix_cache engine01/g0: odd | pipe (1.0s)",
        "verdict: FAIL (1 passed, 1 warnings, 1 failed)",
    ]
