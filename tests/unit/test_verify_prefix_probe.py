"""Prefix-cache probe: passes on a caching engine, fails when hits never come."""

import asyncio

import httpx

from tests.fixtures.openai_fixture_server import (
    CLIENT_KEY,
    ENGINE_KEY,
    fixture_fleet,
    verify_config,
)
from vllm_fleet.verify.config import ApiKeys, VerifyConfig
from vllm_fleet.verify.prefix_probe import build_prefix, probe_engine, probe_router

KEYS = ApiKeys(engine=ENGINE_KEY, client=CLIENT_KEY)


def probe(config, via_router=False):
    cfg = VerifyConfig.model_validate(config)

    async def go():
        async with httpx.AsyncClient(timeout=10) as client:
            if via_router:
                return await probe_router(client, cfg.router.url, KEYS, cfg)
            return await probe_engine(client, cfg.engines[0], KEYS, cfg)

    return asyncio.run(go())


def test_prefix_is_deterministic_apart_from_the_nonce_and_about_the_asked_size():
    one, two = build_prefix(600, "aaaa"), build_prefix(600, "bbbb")
    assert one.replace("aaaa", "bbbb") == two
    assert one.startswith("Record aaaa.")
    assert 600 * 6 <= len(one) <= 600 * 6 + 200


def test_caching_engine_hits_on_the_second_send():
    with fixture_fleet(engines=1, router=False) as (engines, _):
        result = probe(verify_config(engines, None))

    assert result.status == "pass"
    assert result.details["first"]["hits"] == 0
    assert result.details["second"]["hits"] > 0
    assert all(s["ttft_s"] is not None for s in result.details["sends"])


def test_engine_whose_cache_never_hits_fails():
    with fixture_fleet(engines=1, router=False, mode="no_prefix_cache") as (engines, _):
        result = probe(verify_config(engines, None))

    assert result.status == "fail"
    assert result.details["second"]["queries"] > 0
    assert result.details["second"]["hits"] == 0


def test_router_that_keeps_a_prefix_on_one_engine_passes():
    with fixture_fleet() as (engines, router):
        result = probe(verify_config(engines, router), via_router=True)

    assert result.status == "pass"
    assert result.details["landed_on"] in ([["engine01/g0"]] * 2, [["engine02/g0"]] * 2)


def test_router_that_scatters_a_prefix_fails():
    with fixture_fleet(router_opts={"sticky": False}) as (engines, router):
        result = probe(verify_config(engines, router), via_router=True)

    assert result.status == "fail"
    assert result.details["landed_on"] == [["engine01/g0"], ["engine02/g0"]]
