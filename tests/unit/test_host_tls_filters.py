"""The host_tls role's controller side: what a certificate names, and a CA that cannot be used
stops the run with the reason."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from vllm_fleet.ansible.host_tls import ca_certificate, identity, issue, renewal
from vllm_fleet.tls.ca import CA_KEY, init_ca


def test_a_certificate_names_the_host_the_address_the_fleet_reaches_it_on_and_the_loopback():
    hostvars = {
        "engine01": {"fleet_address": "10.0.0.21", "ansible_host": "203.0.113.7"},
        "engine02": {"ansible_host": "engine02.fleet.example"},
        "engine03": {"fleet_address": "fd00::23"},
        "engine04": {},
    }
    loopback = ["127.0.0.1"]
    assert identity("engine01", hostvars) == {
        "names": ["engine01", "localhost"],
        "addresses": ["10.0.0.21", *loopback],
    }
    assert identity("engine02", hostvars) == {
        "names": ["engine02", "engine02.fleet.example", "localhost"],
        "addresses": loopback,
    }
    assert identity("engine03", hostvars)["addresses"] == ["fd00::23", *loopback]
    assert identity("engine04", hostvars) == {
        "names": ["engine04", "localhost"],
        "addresses": loopback,
    }


def test_a_router_hosts_certificate_names_the_vip_its_clients_reach_it_on():
    router = {"vip": {"address": "10.0.0.100"}}
    hostvars = {
        "router01": {
            "fleet_address": "10.0.0.10",
            "group_names": ["routers"],
            "fleet_router": router,
        },
        # The same inventory setting on an engine host names no VIP: it holds none.
        "engine01": {
            "fleet_address": "10.0.0.21",
            "group_names": ["engines"],
            "fleet_router": router,
        },
    }
    assert identity("router01", hostvars)["addresses"] == ["10.0.0.10", "10.0.0.100", "127.0.0.1"]
    assert identity("engine01", hostvars)["addresses"] == ["10.0.0.21", "127.0.0.1"]
    # The engines' certificate on a host that is also a router: its key is the engine user's,
    # so it must not vouch for the address clients send the routers' keys to.
    assert identity("router01", hostvars, vip=False)["addresses"] == ["10.0.0.10", "127.0.0.1"]


def test_a_ca_that_cannot_be_used_fails_the_task_with_the_reason(tmp_path):
    with pytest.raises(AnsibleFilterError, match=r"fleet CA: .*missing .*vllm-fleet ca init"):
        ca_certificate(str(tmp_path / "none"))
    init_ca(tmp_path / "ca")
    (tmp_path / "ca" / CA_KEY).chmod(0o644)
    with pytest.raises(AnsibleFilterError, match="lets others read the CA key"):
        renewal("", str(tmp_path / "ca"), "", ["engine01"], [])
    (tmp_path / "ca" / CA_KEY).chmod(0o600)
    with pytest.raises(AnsibleFilterError, match="not a PEM certificate signing request"):
        issue("garbage", str(tmp_path / "ca"), ["engine01"], [], 30)
    assert ca_certificate(str(tmp_path / "ca")).startswith("-----BEGIN CERTIFICATE-----")


def test_a_host_without_an_address_in_the_inventory_is_named_for_the_one_it_binds():
    """Its listeners bind its default address (fleet_defaults_bind_address): the role's own
    checks and any client that dials that address must find it in the certificate."""
    facts = {"all_ipv4_addresses": ["10.89.0.4"], "default_ipv4": {"address": "10.89.0.4"}}
    hostvars = {"vf-router": {"group_names": ["routers"]}}
    assert identity("vf-router", hostvars, facts) == {
        "names": ["vf-router", "localhost"],
        "addresses": ["10.89.0.4", "127.0.0.1"],
    }
    # No facts gathered (or no address to bind): the name, the inventory's address, loopback.
    assert identity("vf-router", hostvars, {}) == identity("vf-router", hostvars)
    lost = {"all_ipv4_addresses": ["192.0.2.1"], "default_ipv4": {}}
    assert identity("vf-router", {"vf-router": {"fleet_address": "10.0.0.9"}}, lost)[
        "addresses"
    ] == ["10.0.0.9", "127.0.0.1"]
