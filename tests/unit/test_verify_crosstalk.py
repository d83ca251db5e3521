"""Cross-talk: the judgement rules, and the check failing on fleets that misbehave."""

import asyncio
import re

import pytest

from tests.fixtures.openai_fixture_server import (
    CLIENT_KEY,
    ENGINE_KEY,
    fixture_fleet,
    verify_config,
)
from vllm_fleet.verify.config import ApiKeys, VerifyConfig
from vllm_fleet.verify.crosstalk import (
    MARKERS,
    build_probes,
    first_divergence,
    judge,
    run_crosstalk,
)
from vllm_fleet.verify.openai_calls import Answer

KEYS = ApiKeys(engine=ENGINE_KEY, client=CLIENT_KEY)


def crosstalk(config):
    return asyncio.run(run_crosstalk(VerifyConfig.model_validate(config), KEYS))


def test_markers_are_distinct_and_none_contains_another():
    lowered = [m.lower() for m in MARKERS]
    assert len(set(lowered)) == len(lowered)
    assert not [(a, b) for a in lowered for b in lowered if a != b and a in b]


def test_probes_are_deterministic_per_seed_and_embed_their_marker():
    probes = build_probes(10, seed=1234)
    assert probes == build_probes(10, seed=1234)
    assert [p.marker for p in probes] != [p.marker for p in build_probes(10, seed=1)]
    assert all(f'"{p.marker}"' in p.prompt for p in probes)


def test_first_divergence():
    assert first_divergence("abc", "abc") is None
    assert first_divergence("abcd", "abXd") == 2
    assert first_divergence("abc", "abcdef") == 3


def test_judge_counts_foreign_markers_but_not_those_in_the_own_baseline():
    a, b, c = build_probes(3, seed=0)
    ok = lambda text: Answer(200, text=text)  # noqa: E731
    baselines = {
        ("e", a.index): ok(f"{a.marker} is nice"),
        # b's own answer mentions c's marker: c's marker in b's answers is not cross-talk.
        ("e", b.index): ok(f"{b.marker} rhymes with {c.marker}"),
        ("e", c.index): ok(f"{c.marker} only"),
    }
    outcomes = [
        (a, "e", ok(f"{a.marker} is nice")),
        (a, "e", ok(f"{b.marker} rhymes with {c.marker}")),  # b's answer delivered to a
        (b, "e", ok(f"{b.marker} rhymes with {c.marker}")),
        (c, "e", Answer(503, error="HTTP 503")),
    ]
    judgement = judge([a, b, c], baselines, outcomes)
    tallies = {t.marker: t for t in judgement.tallies}

    assert (tallies[a.marker].contaminated, tallies[a.marker].diverged) == (1, 1)
    assert tallies[a.marker].foreign_markers == {b.marker, c.marker}
    assert tallies[a.marker].divergence_positions == [0]
    assert (tallies[b.marker].contaminated, tallies[b.marker].diverged) == (0, 0)
    assert tallies[c.marker].errors == 1
    assert judgement.status_codes == {200: 3, 503: 1}
    assert judgement.examples[0]["found"] == sorted([b.marker, c.marker])


def test_swapped_answers_under_concurrency_fail_as_contamination():
    with fixture_fleet(mode="swap") as (engines, router):
        result = crosstalk(verify_config(engines, router))

    assert result.status == "fail"
    totals = result.details["totals"]
    assert totals["contaminated"] > 0
    assert totals["errors"] == 0
    assert totals["status_codes"] == {"200": 16}  # every swapped answer was an HTTP 200
    per_prompt = result.details["per_prompt"]
    assert sum(p["contaminated"] for p in per_prompt) == totals["contaminated"]
    assert all(p["baseline_has_marker"] for p in per_prompt)  # baselines ran alone: honest
    assert any("another prompt's marker" in r for r in result.details["reasons"])


@pytest.mark.parametrize(("dtype", "status"), [("float32", "fail"), ("bfloat16", "warn")])
def test_divergence_from_baseline_fails_only_in_float32(dtype, status):
    with fixture_fleet(router=False, mode="drift") as (engines, _):
        config = verify_config(engines, None)
        for engine in config["engines"]:
            engine["dtype"] = dtype
        result = crosstalk(config)

    assert result.status == status
    assert result.details["totals"]["diverged"] > 0
    assert result.details["totals"]["contaminated"] == 0
    # "... here in a sentence." -> "... here in a drifted.": the diverging position is reported.
    positions = {p["first_divergence"] for p in result.details["per_prompt"]} - {None}
    assert positions
    assert all(pos > len(p["marker"]) for p in result.details["per_prompt"] for pos in positions)


def test_load_that_never_overlaps_fails():
    # The config claims 8 slots per engine, the engines run one request at a time.
    with fixture_fleet(router=False, max_num_seqs=1) as (engines, _):
        config = verify_config(engines, None)
        for engine in config["engines"]:
            engine["max_num_seqs"] = 8
        result = crosstalk(config)

    assert result.status == "fail"
    assert result.details["peak_running"]["fleet_sum"] <= 2
    assert result.details["overlap_threshold"] == 8
    assert any("did not overlap" in r for r in result.details["reasons"])


def sized_crosstalk(engines, router, **overrides):
    """Cross-talk with C left to the measurement (verify_config's fixture C is fixed)."""
    config = verify_config(engines, router, prompts=2, concurrency=None)
    for key, value in overrides.items():
        target, _, name = key.rpartition("__")
        (config[target] if target else config)[name] = value
    return crosstalk(config)


def test_slow_fleet_behind_a_router_gets_a_load_that_ends_within_the_deadline():
    # 4 slots, each request runs 0.4 s; the router cuts at 2 s, so the burst has 1 s: the
    # second wave just fits (1 when this machine adds > 0.1 s to a wave), a third never does.
    with fixture_fleet(max_num_seqs=2, latency_s=0.4) as (engines, router):
        result = sized_crosstalk(engines, router, router__request_timeout_seconds=2)

    assert result.status == "pass", result.details["reasons"]
    sizing = result.details["sizing"]
    assert sizing["slots"] == 4
    assert sizing["wave_seconds"] >= 0.4
    assert sizing["deadline_setting"] == "fleet_router.request_timeout_seconds"
    assert sizing["deadline_seconds"] == 2
    assert sizing["waves"] in (1, 2)
    assert sizing["waves"] * sizing["wave_seconds"] <= 1.0
    assert result.details["concurrency"] == sizing["waves"] * 4
    assert result.details["calibration"] == {
        "requests": 4,
        "wave_seconds": sizing["wave_seconds"],
        "status_codes": {"200": 4},
        "errors": [],
    }
    assert result.details["totals"]["status_codes"] == {"200": sizing["waves"] * 4}
    assert result.summary.startswith(f"C={sizing['waves'] * 4} ({sizing['waves']} x 4 slots")


def test_fleet_too_slow_for_one_wave_in_the_routers_deadline_fails_naming_it():
    # Each wave takes >= 0.6 s; the router's deadline is 1 s: a second request queued behind
    # the first wave would be cut, and even one wave leaves no margin.
    with fixture_fleet(max_num_seqs=2, latency_s=0.6) as (engines, router):
        result = sized_crosstalk(engines, router, router__request_timeout_seconds=1)

    assert result.status == "fail"
    wave = result.details["sizing"]["wave_seconds"]
    assert wave >= 0.6
    assert result.summary.startswith("not run: one full wave (4 concurrent requests")
    # The summary rounds the measured wave to 0.1 s; the details keep it to 1 ms.
    took = re.search(r"took ([0-9.]+) s \(measured\)", result.summary)
    assert took is not None and abs(float(took.group(1)) - wave) <= 0.05 + 1e-9, result.summary
    assert "fleet_router.request_timeout_seconds = 1 s" in result.summary
    assert "Raise fleet_router.request_timeout_seconds" in result.summary
    assert "max_num_seqs" in result.summary
    # The wave itself was answered; no burst was piled on top of it.
    assert result.details["calibration"]["status_codes"] == {"200": 4}
    assert result.details["concurrency"] == 0
    assert "totals" not in result.details


def test_wave_cut_at_verifys_own_timeout_fails_naming_that_setting():
    # Direct to one engine: each request runs 1.5 s, verify gives up after 1 s. The cut wave
    # counts with the time it took: it is reported as the deadline, not as a pile of errors.
    with fixture_fleet(engines=1, router=False, max_num_seqs=2, latency_s=1.5) as (engines, _):
        result = sized_crosstalk(engines, None, timeout_seconds=1)

    assert result.status == "fail"
    assert result.details["calibration"]["status_codes"] == {"0": 2}
    assert result.details["sizing"]["wave_seconds"] >= 1.0
    assert "fleet_verify_timeout = 1 s" in result.summary
    assert any(
        "2 of 2 requests of the calibration wave failed" in r for r in result.details["reasons"]
    )
    assert "totals" not in result.details


def test_fast_fleet_gets_more_waves_up_to_the_cap():
    # 0.2 s a wave against 5 s of budget, 6 waves asked for: the cap decides.
    with fixture_fleet(engines=1, router=False) as (engines, _):
        result = sized_crosstalk(engines, None, crosstalk__max_concurrency=12, crosstalk__waves=6)

    assert result.status == "pass", result.details["reasons"]
    sizing = result.details["sizing"]
    assert (sizing["slots"], sizing["waves"], result.details["concurrency"]) == (4, 3, 12)
    assert sizing["deadline_setting"] == "fleet_verify_timeout"
    assert sizing["cap_setting"] == "fleet_verify_crosstalk.max_concurrency"
    assert result.details["totals"]["status_codes"] == {"200": 12}


def test_fast_fleet_behind_a_router_stays_within_its_admission_limit():
    with fixture_fleet() as (engines, router):
        result = sized_crosstalk(engines, router, router__admission_factor=2, crosstalk__waves=6)

    assert result.status == "pass", result.details["reasons"]
    sizing = result.details["sizing"]
    assert (sizing["slots"], sizing["waves"], result.details["concurrency"]) == (8, 2, 16)
    assert sizing["cap_setting"].startswith("fleet_router.admission_factor")


def test_configured_concurrency_that_cannot_end_in_time_is_refused():
    # 2 slots, >= 0.4 s a wave, 1 s of budget: at most 2 waves fit; 20 requests need 10.
    with fixture_fleet(engines=1, router=False, max_num_seqs=2, latency_s=0.4) as (engines, _):
        result = sized_crosstalk(engines, None, timeout_seconds=2, crosstalk__concurrency=20)

    assert result.status == "fail"
    assert result.summary.startswith(
        "not run: fleet_verify_crosstalk.concurrency = 20 queues 10 waves of 2 requests"
    )
    assert "fleet_verify_timeout = 2 s" in result.summary
    assert result.details["sizing"]["source"] == "fleet_verify_crosstalk.concurrency"
    assert "totals" not in result.details
