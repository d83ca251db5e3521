"""Fleet hosts reach each other by address: fleet_address, else ansible_host, else the name."""

from vllm_fleet.ansible.addresses import fleet_address, fleet_addresses, url_host
from vllm_fleet.ansible.engine_watchdog import FILTERS as WATCHDOG
from vllm_fleet.ansible.vllm_engine import FILTERS as ENGINE
from vllm_fleet.ansible.vllm_engine import router_targets

HOSTVARS = {
    "router01": {"fleet_address": "10.89.0.10", "ansible_host": "mgmt-router01"},
    "router02": {"ansible_host": "10.89.0.11"},
    "router03": {},
    "router04": {"fleet_address": "fd00::4"},
}


def test_the_address_is_fleet_address_then_ansible_host_then_the_name():
    assert fleet_addresses(list(HOSTVARS), HOSTVARS) == [
        "10.89.0.10", "10.89.0.11", "router03", "fd00::4",
    ]  # fmt: skip
    assert fleet_address("router03", HOSTVARS) == "router03"


def test_an_ipv6_address_is_bracketed_in_urls():
    assert url_host("fd00::4") == "[fd00::4]"
    assert url_host("10.89.0.10") == "10.89.0.10"
    assert url_host("router03") == "router03"
    targets = router_targets(fleet_addresses(["router04", "router01"], HOSTVARS), "sglang", 30000)
    assert [t["url"] for t in targets] == ["http://[fd00::4]:30000", "http://10.89.0.10:30000"]


def test_engines_and_watchdogs_reach_the_routers_at_the_same_addresses():
    routers = list(HOSTVARS)
    assert ENGINE["vllm_engine_addresses"](routers, HOSTVARS) == WATCHDOG[
        "engine_watchdog_addresses"
    ](routers, HOSTVARS)
