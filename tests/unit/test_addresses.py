"""Fleet hosts reach each other by address: fleet_address, else ansible_host, else the name."""

import pytest

from vllm_fleet.ansible.addresses import fleet_address, fleet_addresses, router_targets, url_host
from vllm_fleet.ansible.engine_watchdog import FILTERS as WATCHDOG
from vllm_fleet.ansible.fleet_defaults import FILTERS as FLEET
from vllm_fleet.ansible.vllm_engine import FILTERS as ENGINE

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


def test_routers_that_speak_tls_are_called_over_https_trusting_the_fleet_ca():
    ca = "/etc/vllm-fleet/tls/ca.crt"
    # Ansible hands a templated boolean over as a string.
    for tls in (True, "True"):
        [target] = router_targets(["fd00::4"], "sglang", "30000", tls, ca)
        assert target == {"impl": "sglang", "url": "https://[fd00::4]:30000", "ca_file": ca}
    for plain in (False, "False"):
        [target] = router_targets(["10.89.0.10"], "sglang", 30000, plain, ca)
        assert target == {"impl": "sglang", "url": "http://10.89.0.10:30000"}


def test_engines_and_watchdogs_reach_the_routers_at_the_same_addresses():
    routers = list(HOSTVARS)
    assert ENGINE["vllm_engine_addresses"](routers, HOSTVARS) == WATCHDOG[
        "engine_watchdog_addresses"
    ](routers, HOSTVARS)
    addresses = fleet_addresses(routers, HOSTVARS)
    ca = "/etc/vllm-fleet/tls/ca.crt"
    assert ENGINE["vllm_engine_router_targets"](addresses, "sglang", 30000, True, ca) == WATCHDOG[
        "engine_watchdog_router_targets"
    ](addresses, "sglang", 30000, True, ca)


FACTS = {
    "all_ipv4_addresses": ["10.89.0.21", "192.0.2.7"],
    "all_ipv6_addresses": ["fd00::21"],
    "default_ipv4": {"address": "192.0.2.7", "interface": "eth1"},
}


def bind(address: str | None, facts: dict) -> str:
    hostvars = {"engine01": {"fleet_address": address} if address else {}}
    return FLEET["fleet_defaults_bind_address"]("engine01", hostvars, facts)


def test_listeners_bind_where_the_fleet_reaches_the_host_when_it_has_that_address():
    assert bind("10.89.0.21", FACTS) == "10.89.0.21"
    assert bind("fd00::21", FACTS) == "fd00::21"
    # A name, an address the host does not have (NAT), or none: its primary address.
    assert bind("engine01.example", FACTS) == "192.0.2.7"
    assert bind("203.0.113.9", FACTS) == "192.0.2.7"
    assert bind(None, FACTS) == "192.0.2.7"


def test_a_host_whose_default_route_is_gone_still_binds_its_fleet_address():
    # An interface taken down and up loses its default route (the fault matrix's flapping
    # link): the listeners must not move to loopback, where no other host reaches them.
    assert bind("10.89.0.21", {**FACTS, "default_ipv4": {}}) == "10.89.0.21"


def test_a_host_with_neither_is_refused_naming_the_fix_never_bound_to_loopback():
    bare = {"all_ipv4_addresses": ["127.0.0.1"], "default_ipv4": {}}
    with pytest.raises(ValueError) as err:
        bind("engine01.example", bare)
    message = str(err.value)
    assert "host engine01" in message
    assert "'engine01.example'" in message
    assert "no default IPv4 route" in message
    assert "Set fleet_address" in message


def test_a_play_without_facts_reads_the_fleet_address():
    # Plays that gather no facts (the routers' drain healing) bind nothing; they must not fail.
    assert bind("10.89.0.21", {}) == "10.89.0.21"
    assert bind("engine01.example", {}) == "127.0.0.1"
