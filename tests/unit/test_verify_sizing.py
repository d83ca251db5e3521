"""Cross-talk sizing: C from one measured wave, the deadline, the caps (pure arithmetic)."""

import pytest

from vllm_fleet.verify.config import VerifyConfig
from vllm_fleet.verify.sizing import (
    ADMISSION,
    CONCURRENCY,
    MAX_CONCURRENCY,
    ROUTER_TIMEOUT,
    VERIFY_TIMEOUT,
    Limit,
    Limits,
    size,
    split,
    waves_of,
)

ENGINE = {
    "host": "h",
    "group": "g",
    "url": "http://h:1",
    "stack": "s",
    "model": "m",
    "served_name": "m",
    "revision": "r",
    "devices": [0],
    "max_num_seqs": 16,
}


def config(router=None, timeout=120, **crosstalk):
    return VerifyConfig.model_validate(
        {
            "engines": [ENGINE, ENGINE],
            "router": router,
            "crosstalk": crosstalk,
            "timeout_seconds": timeout,
        }
    )


def limits(deadline=20.0, cap=200, admission=None, setting=ROUTER_TIMEOUT):
    admitted = None if admission is None else Limit(admission, ADMISSION)
    the_cap = admitted if admitted is not None and admission < cap else Limit(cap, MAX_CONCURRENCY)
    return Limits(Limit(deadline, setting), the_cap, admitted)


def test_the_deadline_is_the_tighter_of_the_routers_and_verifys_own():
    router = {"url": "http://r:1", "policy": "cache_aware", "request_timeout_seconds": 20}
    assert Limits.of(config(router)).deadline == Limit(20, ROUTER_TIMEOUT)
    assert Limits.of(config(router, timeout=15)).deadline == Limit(15, VERIFY_TIMEOUT)
    # Direct to the engines only verify's own timeout applies.
    assert Limits.of(config(None, timeout=90)).deadline == Limit(90, VERIFY_TIMEOUT)


def test_the_cap_is_the_routers_admission_limit_when_that_is_lower():
    router = {"url": "http://r:1", "policy": "p", "request_timeout_seconds": 20}
    assert Limits.of(config({**router, "admission_factor": 2})).cap == Limit(64, ADMISSION)
    assert Limits.of(config({**router, "admission_factor": 10})).cap == Limit(200, MAX_CONCURRENCY)
    assert Limits.of(config(router, max_concurrency=50)).cap == Limit(50, MAX_CONCURRENCY)
    assert Limits.of(config(None)).admission is None


def test_split_follows_the_slots_and_waves_count_the_busiest_endpoint():
    assert split(16, [4, 4]) == [8, 8]
    assert split(12, [8, 4]) == [8, 4]
    assert split(24, [8, 4]) == [16, 8]
    assert split(5, [4, 4]) == [3, 2]
    assert waves_of([8, 4], [8, 4]) == 1
    assert waves_of([3, 2], [4, 4]) == 1
    assert waves_of([9, 4], [8, 4]) == 2


def test_a_fast_fleet_gets_the_waves_asked_for_up_to_the_cap():
    # 1 s a wave, 10 s of budget: 10 waves would fit; two are asked for by default.
    sized = size([16, 16], 1.0, limits(deadline=20.0))
    assert (sized.concurrency, sized.waves, sized.problem) == (64, 2, None)
    # Asked for 8: the cap (200 / 32 slots) allows 6.
    sized = size([16, 16], 1.0, limits(deadline=20.0), wanted_waves=8)
    assert (sized.concurrency, sized.waves, sized.problem) == (192, 6, None)
    # The router admits 64 at once: two waves.
    sized = size([16, 16], 1.0, limits(deadline=20.0, admission=64), wanted_waves=8)
    assert (sized.concurrency, sized.waves) == (64, 2)
    assert sized.as_dict()["cap_setting"] == ADMISSION


def test_a_slow_fleet_gets_as_many_waves_as_end_within_half_the_deadline():
    sized = size([16, 16], 4.0, limits(deadline=20.0, admission=64))
    assert (sized.concurrency, sized.waves) == (64, 2)  # 2 x 4 s <= 10 s
    sized = size([16, 16], 6.0, limits(deadline=20.0, admission=64))
    assert (sized.concurrency, sized.waves) == (32, 1)  # a second wave would end at 12 s
    assert sized.as_dict() == {
        "slots": 32,
        "wave_seconds": 6.0,
        "deadline_seconds": 20.0,
        "deadline_setting": ROUTER_TIMEOUT,
        "budget_seconds": 10.0,
        "concurrency": 32,
        "waves": 1,
        "projected_seconds": 6.0,
        "source": "measured",
        "cap": 64,
        "cap_setting": ADMISSION,
    }


def test_a_fleet_too_slow_for_one_wave_is_refused_with_the_setting_and_the_fix():
    sized = size([16, 16], 11.0, limits(deadline=20.0), max_tokens=24)
    assert sized.concurrency == 0
    assert sized.problem is not None
    assert "one full wave (32 concurrent requests" in sized.problem
    assert "took 11.0 s (measured)" in sized.problem
    assert f"{ROUTER_TIMEOUT} = 20 s" in sized.problem
    assert f"Raise {ROUTER_TIMEOUT} (to at least 22 s)" in sized.problem
    assert "max_num_seqs" in sized.problem
    assert "fleet_verify_crosstalk.max_tokens (now 24)" in sized.problem


def test_a_cap_below_the_slots_wins():
    sized = size([16, 16], 1.0, limits(cap=20))
    assert (sized.concurrency, sized.waves) == (20, 1)


def test_a_configured_concurrency_wins_when_it_fits():
    sized = size([16, 16], 1.0, limits(), configured=7)
    assert (sized.concurrency, sized.waves, sized.source, sized.problem) == (
        7,
        1,
        CONCURRENCY,
        None,
    )
    # Beyond max_concurrency too: the operator asked for it.
    sized = size([16, 16], 0.5, limits(cap=64), configured=96)
    assert (sized.concurrency, sized.waves, sized.problem) == (96, 3, None)


@pytest.mark.parametrize(
    ("configured", "wave", "admission", "expected"),
    [
        (
            64,
            6.0,
            None,
            f"{CONCURRENCY} = 64 queues 2 waves of 32 requests; at 6.0 s a wave (measured) the last "
            f"would end after ~12.0 s, beyond half of {ROUTER_TIMEOUT} = 20 s. Set it to at most 32",
        ),
        (
            100,
            1.0,
            64,
            f"{CONCURRENCY} = 100 exceeds the router's admission limit of 64 ({ADMISSION})",
        ),
    ],
)
def test_a_configured_concurrency_that_cannot_fit_is_refused(configured, wave, admission, expected):
    sized = size([16, 16], wave, limits(admission=admission), configured=configured)
    assert sized.problem is not None
    assert expected in sized.problem
