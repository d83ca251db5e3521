"""The routers' VIP (fleet_router.vip): what keepalived can hold, refused by name otherwise;
and the in-flight count a planned router restart waits on."""

from __future__ import annotations

import pytest

from vllm_fleet.ansible.router import router_addresses
from vllm_fleet.router.inflight import inflight
from vllm_fleet.router.vip import peers, vip_problems

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
