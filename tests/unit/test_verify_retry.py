"""Retry-After: a router shedding load is waited for, a bounded number of times, and counted."""

import asyncio
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from tests.fixtures.openai_fixture_server import (
    CLIENT_KEY,
    ENGINE_KEY,
    fixture_fleet,
    verify_config,
)
from vllm_fleet.verify.config import ApiKeys, VerifyConfig
from vllm_fleet.verify.crosstalk import run_crosstalk
from vllm_fleet.verify.openai_calls import parse_retry_after

KEYS = ApiKeys(engine=ENGINE_KEY, client=CLIENT_KEY)
PROMPTS = 4  # the baseline sends these first, one each, through the router
WAVE = 8  # then the calibration wave: one request per sequence slot (2 engines x 4)


def crosstalk(config):
    return asyncio.run(run_crosstalk(VerifyConfig.model_validate(config), KEYS))


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("3", 3.0), ("0", 0.0), ("0.5", 0.5), ("-4", 0.0), (None, None), ("", None), ("soon", None)],
)
def test_parse_retry_after_seconds(header, seconds):
    assert parse_retry_after(header) == seconds


def test_parse_retry_after_http_date():
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    assert 25 < parse_retry_after(when) <= 30
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past


def test_throttled_requests_under_load_are_retried_and_counted():
    router_opts = {"throttle_from": PROMPTS + WAVE, "throttle_count": 3, "retry_after": "0"}
    with fixture_fleet(router_opts=router_opts) as (engines, router):
        result = crosstalk(verify_config(engines, router, prompts=PROMPTS))

    assert result.status == "pass"
    totals = result.details["totals"]
    assert (totals["retries"], totals["baseline_retries"]) == (3, 0)
    assert totals["status_codes"] == {"200": 16}
    assert sum(p["retries"] for p in result.details["per_prompt"]) == 3


def test_throttling_beyond_the_retry_budget_fails_with_the_status_reported():
    router_opts = {"throttle_from": PROMPTS + WAVE, "throttle_count": 10_000, "retry_after": "0"}
    with fixture_fleet(router_opts=router_opts) as (engines, router):
        config = verify_config(engines, router, prompts=PROMPTS)
        config["retry"] = {"max_retries": 2}
        result = crosstalk(config)

    assert result.status == "fail"
    totals = result.details["totals"]
    assert totals["status_codes"] == {"429": 16}
    assert totals["errors"] == 16
    assert totals["retries"] == 16 * 2


def test_retry_after_delay_is_honoured_up_to_the_configured_cap():
    router_opts = {"throttle_from": 0, "throttle_count": 1, "retry_after": "3600"}
    with fixture_fleet(router_opts=router_opts) as (engines, router):
        config = verify_config(engines, router, prompts=PROMPTS)
        config["retry"] = {"max_delay_seconds": 0.3}
        start = time.perf_counter()
        result = crosstalk(config)
        elapsed = time.perf_counter() - start

    assert result.status == "pass"
    assert result.details["totals"]["baseline_retries"] == 1
    assert result.details["baseline_duration_s"] >= 0.3
    assert elapsed < 5
