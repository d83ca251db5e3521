"""Preflight: the engines' ports speak HTTPS whenever the fleet has a CA, plain HTTP only where
the inventory says so, and every router then holds the fleet CA to verify them
(vllm_fleet.preflight.engine_tls). The role's own default (fleet_engine_tls in fleet_defaults)
decides the same way."""

from __future__ import annotations

import jinja2
import pytest
import yaml

from tests.support.paths import ROOT
from vllm_fleet.preflight.engine_tls import check_engine_tls, engine_tls

CA = {"fleet_ca_dir": "/srv/vllm-fleet/ca"}
PLAIN = {"fleet_engine_plain_http": True}
DEFAULTS = yaml.safe_load((ROOT / "roles/fleet_defaults/defaults/main.yml").read_text())


def test_a_fleet_with_a_ca_serves_https_and_plain_http_only_when_said():
    assert engine_tls(CA) is True
    assert engine_tls({**CA, **PLAIN}) is False
    assert engine_tls(PLAIN) is False
    assert engine_tls({}) is False
    assert engine_tls({"fleet_engine_plain_http": "yes"}) is None


@pytest.mark.parametrize("variables", [CA, {**CA, **PLAIN}, PLAIN, {}, {"fleet_ca_dir": ""}])
def test_the_roles_default_decides_as_preflight(variables):
    template = jinja2.Environment(undefined=jinja2.ChainableUndefined).from_string(
        DEFAULTS["fleet_engine_tls"]
    )
    assert template.render(variables).strip() == str(engine_tls(variables))


def test_a_fleet_with_a_ca_or_explicit_plain_http_passes():
    assert check_engine_tls({"engine01": CA, "engine02": CA}, {"router01": CA}) == []
    assert check_engine_tls({"engine01": PLAIN}, {"router01": {}}) == []
    # Engines on plain HTTP need no CA on the routers for them.
    assert check_engine_tls({"engine01": {**CA, **PLAIN}}, {"router01": {}}) == []


def test_engines_without_a_ca_and_without_plain_http_are_refused_naming_the_fix():
    [finding] = check_engine_tls({"engine01": {}}, {"router01": {}})
    text = str(finding)
    assert text.startswith("engine01: fleet_ca_dir=None: is not set, and this host serves engines")
    assert "vllm-fleet ca init DIR" in text and "fleet_engine_plain_http: true" in text


def test_a_router_without_the_fleet_ca_is_refused_when_engines_serve_https():
    engines = {f"engine{i:02d}": CA for i in range(1, 6)}
    [finding] = check_engine_tls(engines, {"router01": CA, "router02": {}})
    text = str(finding)
    assert text.startswith("router02: fleet_ca_dir=None: is not set on this router")
    assert "(engine01, engine02, engine03 ...)" in text


def test_plain_http_must_be_a_bool():
    [finding] = check_engine_tls({"engine01": {**CA, "fleet_engine_plain_http": "no"}}, {})
    assert str(finding) == (
        "engine01: fleet_engine_plain_http='no': must be true or false; fix: leave it out (TLS)"
    )
