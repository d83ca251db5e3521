"""Preflight: the routers' client port speaks HTTPS whenever the fleet has a CA, plain HTTP
only where the inventory says so, and every router and engine host agrees
(vllm_fleet.preflight.router_tls)."""

from __future__ import annotations

import base64
import json

import yaml

from tests.support.paths import ROOT
from vllm_fleet.preflight.checks import HostInput
from vllm_fleet.preflight.facts import HostFacts
from vllm_fleet.preflight.router_tls import (
    check_router_tls,
    check_scheme_change,
    router_tls,
    serving_tls,
)

RELEASES = yaml.safe_load((ROOT / "catalog/routers.yml").read_text())["fleet_router_releases"]
CA = {"fleet_ca_dir": "/srv/vllm-fleet/ca"}
PLAIN = {"fleet_router": {"plain_http": True}}


def test_a_fleet_with_a_ca_speaks_https_and_plain_http_only_when_said():
    assert router_tls(CA) is True
    assert router_tls({**CA, **PLAIN}) is False
    assert router_tls(PLAIN) is False
    assert router_tls({}) is False
    assert router_tls({"fleet_router": {"plain_http": "yes"}}) is None


def test_a_fleet_with_a_ca_or_explicit_plain_http_passes():
    fleet = {"router01": CA, "router02": CA}
    assert check_router_tls(fleet, {"engine01": CA}, RELEASES) == []
    fleet = {"router01": PLAIN, "router02": PLAIN}
    assert check_router_tls(fleet, {"engine01": PLAIN}, RELEASES) == []
    # No routers: nothing speaks on a client port.
    assert check_router_tls({}, {"engine01": {}}, RELEASES) == []


def test_routers_without_a_ca_and_without_plain_http_are_refused_on_every_host():
    findings = check_router_tls({"router01": {}}, {"engine01": {}}, RELEASES)
    text = "\n".join(map(str, findings))
    assert "router01: fleet_ca_dir=None: is not set, and this host serves the routers'" in text
    assert "engine01: fleet_ca_dir=None: is not set, and this host calls the routers'" in text
    assert "vllm-fleet ca init DIR" in text
    assert "fleet_router.plain_http: true" in text


def test_a_router_without_a_tls_listener_is_refused_where_the_fleet_has_a_ca():
    vllm = {**CA, "fleet_router": {"impl": "vllm"}}
    [finding] = check_router_tls({"router01": vllm}, {"engine01": vllm}, RELEASES)
    assert str(finding).startswith(
        "router01: fleet_router.impl='vllm': vllm-router-0.1.17 has no TLS"
    )
    plain = {**CA, "fleet_router": {"impl": "vllm", "plain_http": True}}
    assert check_router_tls({"router01": plain}, {"engine01": plain}, RELEASES) == []


def test_engine_hosts_that_would_call_the_routers_with_the_other_scheme_are_refused():
    findings = check_router_tls({"router01": CA}, {"engine01": CA, "engine02": PLAIN}, RELEASES)
    [finding] = findings
    assert str(finding).startswith(
        "engine02: fleet_router.plain_http='http': this engine host would call the routers over "
        "http, and they speak https"
    )
    [mixed] = check_router_tls({"router01": CA, "router02": PLAIN}, {}, RELEASES)
    assert "router01: https, router02: http" in str(mixed)


def test_a_plain_http_that_is_no_bool_is_named():
    bad = {"fleet_router": {"plain_http": "true"}}
    [finding] = check_router_tls({"router01": bad}, {}, RELEASES)
    assert str(finding) == (
        "router01: fleet_router.plain_http='true': must be true or false; fix: leave it out (TLS)"
    )


def test_every_release_in_the_catalog_says_whether_it_serves_tls():
    assert all(isinstance(r["serves_tls"], bool) for r in RELEASES.values())


def router_host(name: str, router_json: dict[str, object] | None, **variables: object) -> HostInput:
    """A router host as the probe saw it: its router.json now (None: no router runs yet)."""
    results = [{"item": "/etc/vllm-fleet/router.env", "failed": True}]
    if router_json is not None:
        content = base64.b64encode(json.dumps(router_json).encode()).decode()
        results.append({"item": "/etc/vllm-fleet/router.json", "content": content})
    return HostInput(name, dict(variables), HostFacts(), key_files={"results": results})


def test_what_a_router_serves_now_is_read_from_its_router_json():
    assert serving_tls(router_host("r", {"impl": "sglang", "tls": {"cert": "tls.crt"}}).key_files)
    assert serving_tls(router_host("r", {"impl": "sglang", "tls": None}).key_files) is False
    # Rendered before the routers had TLS: no "tls" at all.
    assert serving_tls(router_host("r", {"impl": "sglang"}).key_files) is False
    assert serving_tls(router_host("r", None).key_files) is None


def test_a_serving_fleets_scheme_change_is_refused_before_any_host_changes():
    plain_now = {"impl": "sglang", "tls": None}
    # A CA added to a fleet whose routers serve plain HTTP (for the model cache, say).
    [finding] = check_scheme_change([router_host("router01", plain_now, **CA)], ["router01"])
    text = str(finding)
    assert text.startswith("router01: fleet_router.plain_http='http now -> https': ")
    assert "the routers would be left without engines in between" in text
    assert "set fleet_router.plain_http: true" in text
    tls_now = {"impl": "sglang", "tls": {"cert": "tls.crt", "key": "tls.key"}}
    [back] = check_scheme_change([router_host("router01", tls_now, **CA, **PLAIN)], ["router01"])
    assert "set fleet_router.plain_http: false" in str(back)
    # Unchanged, a new router, or not a router host: nothing to refuse.
    assert check_scheme_change([router_host("router01", tls_now, **CA)], ["router01"]) == []
    assert check_scheme_change([router_host("router01", None, **CA)], ["router01"]) == []
    assert check_scheme_change([router_host("engine01", plain_now, **CA)], ["router01"]) == []
