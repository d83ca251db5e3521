"""Who the engine firewall lets in, and what it says when a router cannot get through."""

from vllm_fleet.ansible.engine_firewall import firewall_sources, unreached

HOSTVARS = {
    "router01": {"fleet_address": "10.0.0.10"},
    "router02": {"ansible_host": "fd00::11"},
    "prom01": {"fleet_address": "10.0.0.10"},
    "named": {},
}


def test_sources_by_family_deduplicated_with_networks_and_the_hosts_without_an_address():
    sources = firewall_sources(
        ["router01", "router02", "prom01", "named"], HOSTVARS, ["10.9.0.0/24", "10.0.0.10", "x"]
    )
    assert sources == {
        "ipv4": ["10.0.0.10", "10.9.0.0/24"],
        "ipv6": ["fd00::11"],
        "names": ["named", "x"],
    }


def test_a_host_bit_network_is_normalised_and_a_single_address_network_is_an_address():
    sources = firewall_sources([], {}, ["10.9.0.7/24", "10.9.1.1/32"])
    assert sources["ipv4"] == ["10.9.0.0/24", "10.9.1.1"]


def test_the_refusal_names_each_router_and_port_that_timed_out():
    result = {
        "msg": "One or more items failed",
        "results": [
            {"failed": False, "item": ["router01", 8100]},
            {"failed": True, "item": ["router02", 8100], "msg": "Timeout"},
            {"failed": True, "item": ["router02", 8101], "msg": "Timeout"},
        ],
    }
    assert unreached(result) == (
        "router02 could not connect to port 8100; router02 could not connect to port 8101"
    )
    assert unreached({"msg": "boom"}) == "boom"
