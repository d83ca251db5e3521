"""The routers' VIP (fleet_router.vip): what keepalived can hold, refused by name otherwise;
and the in-flight count a planned router restart waits on."""

from __future__ import annotations

import pytest

from vllm_fleet.ansible.router import public_reach, router_addresses
from vllm_fleet.router.inflight import inflight
from vllm_fleet.router.vip import handover, peers, vip_problems

ROUTERS = {"router01": "10.89.0.10", "router02": "10.89.0.11"}


def vip(**overrides: object) -> dict[str, object]:
    return {
        "address": "10.89.0.100",
        "prefix": 24,
        "vrid": 51,
        "advert_interval_seconds": 1,
        **overrides,
    }


def test_a_free_address_in_the_routers_subnet_is_accepted():
    assert vip_problems(vip(), ROUTERS) == []


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"address": "10.89.0.10"}, "is router01's own address"),
        ({"address": "10.90.0.100"}, "not in router01's subnet 10.89.0.0/24"),
        ({"address": "8.8.8.8"}, "not a private address"),
        ({"address": "10.89.0.255"}, "network or broadcast address"),
        ({"address": "routers.internal"}, "is not an IPv4 address"),
        ({"prefix": 33}, "fleet_router.vip.prefix=33"),
        ({"prefix": "24"}, "fleet_router.vip.prefix='24'"),
        ({"vrid": 0}, "fleet_router.vip.vrid=0 must be a whole number from 1 to 255"),
        ({"vrid": True}, "fleet_router.vip.vrid=True"),
        ({"advert_interval_seconds": 0}, "advert_interval_seconds=0"),
    ],
)
def test_a_vip_keepalived_cannot_hold_is_refused_by_name(overrides, expected):
    problems = vip_problems(vip(**overrides), ROUTERS)
    assert any(expected in p for p in problems), problems


def test_each_router_talks_vrrp_to_the_others_only():
    assert peers(ROUTERS, "router01") == ["10.89.0.11"]
    assert peers({**ROUTERS, "router03": "10.89.0.12"}, "router02") == ["10.89.0.10", "10.89.0.12"]


def test_a_router_without_a_primary_address_is_named():
    hostvars = {
        "router01": {"ansible_facts": {"default_ipv4": {"address": "10.89.0.10"}}},
        "router02": {"ansible_facts": {}},
    }
    with pytest.raises(Exception, match="router host router02: no primary IPv4 address"):
        router_addresses(["router01", "router02"], hostvars)
    assert router_addresses(["router01"], hostvars) == {"router01": "10.89.0.10"}


METRICS = """\
# HELP smg_worker_requests_active Active requests per worker
# TYPE smg_worker_requests_active gauge
smg_worker_requests_active{worker="http://engine01:8100"} 2
smg_worker_requests_active{worker="http://engine02:8100"} 1
# HELP smg_http_connections_active Open connections
# TYPE smg_http_connections_active gauge
smg_http_connections_active 7
"""


def test_in_flight_is_the_sum_over_the_engines_of_the_routers_own_gauge():
    assert inflight(METRICS, "smg_worker_requests_active") == 3
    assert inflight(METRICS, "vllm_router_running_requests") == 0
    assert inflight(METRICS, "vllm_router_running_requests", "smg_worker_requests_active") == 3


def ready(host: str, status: int, msg: str = "") -> dict[str, object]:
    return {"item": host, "status": status, "msg": msg}


def drain(host: str, exists: bool | None) -> dict[str, object]:
    if exists is None:
        return {"item": host, "unreachable": True, "msg": "Failed to connect"}
    return {"item": host, "stat": {"exists": exists}}


def test_a_ready_undrained_router_can_take_the_vip():
    result = handover([ready("router02", 200)], [drain("router02", False)], 200)
    assert result == {"eligible": ["router02"], "refused": []}


@pytest.mark.parametrize(
    ("status", "exists", "expected"),
    [
        (200, True, "router02: being drained itself"),
        (-1, False, "router02: its router does not answer (Connection refused)"),
        (503, False, "router02: its router has no engines (/readiness 503)"),
        (200, None, "router02: unreachable (Failed to connect)"),
    ],
)
def test_a_router_that_cannot_take_the_vip_is_named_with_why(status, exists, expected):
    result = handover(
        [ready("router02", status, "Connection refused")], [drain("router02", exists)], 200
    )
    assert result["eligible"] == []
    assert len(result["refused"]) == 1 and result["refused"][0].startswith(expected), result


def test_without_engines_anywhere_a_live_router_is_as_good_a_holder():
    # This router has none either (503): a peer that answers 503 may take the VIP.
    result = handover([ready("router02", 503)], [drain("router02", False)], "503")
    assert result["eligible"] == ["router02"]


def test_one_good_peer_of_two_is_enough():
    result = handover(
        [ready("router02", 200), ready("router03", 200)],
        [drain("router02", True), drain("router03", False)],
        200,
    )
    assert result["eligible"] == ["router03"]
    assert result["refused"] == ["router02: being drained itself (a restart is under way there)"]


@pytest.mark.parametrize(
    ("bind", "host_addresses", "expected"),
    [
        ("10.89.0.10", ["10.89.0.10", "8.8.8.8"], []),
        ("8.8.8.8", ["8.8.8.8"], ["8.8.8.8"]),
        ("127.0.0.1", ["8.8.8.8"], []),
        # Without a VIP a wildcard bind is public whatever the host has now.
        ("0.0.0.0", None, ["0.0.0.0"]),
        # A VIP's wildcard bind reaches whatever the host has.
        ("0.0.0.0", ["10.89.0.10", "127.0.0.1", "fe80::1"], []),
        ("0.0.0.0", ["10.89.0.10", "8.8.8.8"], ["8.8.8.8"]),
        ("::", ["10.89.0.10", "2001:db8::5", "2a00:1450::1"], ["2a00:1450::1"]),
    ],
)
def test_the_public_addresses_a_bind_reaches_are_named(bind, host_addresses, expected):
    assert public_reach(bind, host_addresses) == expected
