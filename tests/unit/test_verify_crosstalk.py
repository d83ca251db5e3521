"""Cross-talk: the judgement rules, and the check failing on fleets that misbehave."""

import asyncio

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


def test_default_concurrency_fills_the_fleet_with_at_least_64():
    base = verify_config([], None)
    engine = {
        "host": "h",
        "group": "g",
        "url": "http://h:1",
        "stack": "s",
        "model": "m",
        "revision": "r",
        "devices": [0],
        "max_num_seqs": 16,
    }
    base["crosstalk"] = {}
    base["engines"] = [engine] * 2
    assert VerifyConfig.model_validate(base).concurrency() == 64
    base["engines"] = [{**engine, "max_num_seqs": 128}] * 2
    assert VerifyConfig.model_validate(base).concurrency() == 200  # capped by max_concurrency
    base["crosstalk"] = {"concurrency": 7}
    assert VerifyConfig.model_validate(base).concurrency() == 7
