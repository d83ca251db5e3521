"""The host_tls role's controller side: what a certificate names, and a CA that cannot be used
stops the run with the reason."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from vllm_fleet.ansible.host_tls import ca_certificate, identity, issue, renewal
from vllm_fleet.tls.ca import CA_KEY, init_ca


def test_a_certificate_names_the_host_and_the_address_the_fleet_reaches_it_on():
    hostvars = {
        "engine01": {"fleet_address": "10.0.0.21", "ansible_host": "203.0.113.7"},
        "engine02": {"ansible_host": "engine02.fleet.example"},
        "engine03": {"fleet_address": "fd00::23"},
        "engine04": {},
    }
    assert identity("engine01", hostvars) == {"names": ["engine01"], "addresses": ["10.0.0.21"]}
    assert identity("engine02", hostvars) == {
        "names": ["engine02", "engine02.fleet.example"],
        "addresses": [],
    }
    assert identity("engine03", hostvars) == {"names": ["engine03"], "addresses": ["fd00::23"]}
    assert identity("engine04", hostvars) == {"names": ["engine04"], "addresses": []}


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
