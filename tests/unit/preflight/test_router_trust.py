"""Preflight refuses a router whose worker endpoints take no key, unless the inventory
accepts it for that router host (vllm_fleet.preflight.router_trust)."""

from __future__ import annotations

import yaml

from tests.support.paths import ROOT
from vllm_fleet.preflight.router_trust import check_open_control_planes

RELEASES = yaml.safe_load((ROOT / "catalog/routers.yml").read_text())["fleet_router_releases"]


def test_vllm_router_is_refused_per_host_naming_the_risk_and_the_setting():
    routers = {
        "router01": {"impl": "vllm"},
        "router02": {"impl": "vllm", "accept_unauthenticated_control": True},
        "router03": {"impl": "sglang"},
        "router04": {},
    }
    [finding] = check_open_control_planes(routers, RELEASES)
    text = str(finding)
    assert text.startswith("router01: fleet_router.impl='vllm': takes no key on its worker")
    assert "receive every client's prompts" in text
    assert "set fleet_router.accept_unauthenticated_control: true" in text


def test_only_a_real_true_accepts_it():
    for value in ("true", "yes", 1, None):
        routers = {"router01": {"impl": "vllm", "accept_unauthenticated_control": value}}
        assert check_open_control_planes(routers, RELEASES), value


def test_every_release_in_the_catalog_says_whether_its_control_plane_takes_a_key():
    assert all(isinstance(r["authenticates_control"], bool) for r in RELEASES.values())
