"""One control key per engine host: derived, revocable, and named in the router's audit log."""

from __future__ import annotations

import json
import re

import httpx
import pytest
import yaml

from tests.support.paths import ROOT
from tests.unit.router_fixtures import CLIENT_KEY, ENGINE_KEY, running_engine, running_router
from vllm_fleet.router.control_keys import (
    OPERATOR_ID,
    host_control_key,
    host_generations,
    read_control_keys,
    router_control_keys,
)

FLEET_KEY = "fleet-control-key-0123456789"
OLD_FLEET_KEY = "old-fleet-control-key-0123456789"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def test_each_host_and_generation_gets_its_own_key_and_none_is_the_fleets():
    keys = {
        host_control_key(FLEET_KEY, host, generation)
        for host in ("engine-a", "engine-b")
        for generation in (0, 1)
    }
    assert len(keys) == 4
    assert FLEET_KEY not in keys
    # Stable: the controller derives the same key on every run.
    assert host_control_key(FLEET_KEY, "engine-a") == host_control_key(FLEET_KEY, "engine-a", 0)
    # Another fleet key gives other host keys.
    assert host_control_key(OLD_FLEET_KEY, "engine-a") not in keys
    assert all(len(k) == 43 and re.fullmatch(r"[A-Za-z0-9_-]+", k) for k in keys)
    assert host_control_key("", "engine-a") == ""
    with pytest.raises(ValueError, match="engine-a: fleet_router_control_key_generation=-1"):
        host_control_key(FLEET_KEY, "engine-a", -1)


def test_the_router_accepts_the_operator_and_each_host_at_its_generation():
    keys = router_control_keys(FLEET_KEY, [], {"engine-b": 2, "engine-a": 0})
    assert keys == [
        {"id": OPERATOR_ID, "key": FLEET_KEY},
        {"id": "engine-a", "key": host_control_key(FLEET_KEY, "engine-a", 0)},
        {"id": "engine-b", "key": host_control_key(FLEET_KEY, "engine-b", 2)},
    ]
    # engine-b's earlier keys are not among them: raising its generation revoked them.
    accepted = {k["key"] for k in keys}
    assert host_control_key(FLEET_KEY, "engine-b", 1) not in accepted
    assert host_control_key(FLEET_KEY, "engine-b", 0) not in accepted


def test_a_retiring_fleet_key_keeps_its_host_keys_accepted_under_their_own_names():
    keys = router_control_keys(FLEET_KEY, [OLD_FLEET_KEY], {"engine-a": 1})
    assert [k["id"] for k in keys] == [
        "operator",
        "engine-a",
        "operator-retiring-1",
        "engine-a-retiring-1",
    ]
    assert keys[3]["key"] == host_control_key(OLD_FLEET_KEY, "engine-a", 1)


@pytest.mark.parametrize("host", ["operator", "../etc", "a b", "", "-x"])
def test_a_host_name_that_cannot_be_an_audit_identity_is_refused(host):
    with pytest.raises(ValueError, match="not usable as control-key identities"):
        router_control_keys(FLEET_KEY, [], {host: 0})


def test_generations_come_from_each_hosts_variables():
    hostvars = {"engine-a": {"fleet_router_control_key_generation": 3}, "engine-b": {}}
    assert host_generations(["engine-a", "engine-b", "gone"], hostvars) == {
        "engine-a": 3,
        "engine-b": 0,
        "gone": 0,
    }


def test_the_routers_credential_must_hold_keys(tmp_path):
    path = tmp_path / "router-control-keys.json"
    path.write_text(json.dumps([{"id": "engine-a", "key": ""}]))
    with pytest.raises(ValueError, match="no control keys"):
        read_control_keys(path)
    path.write_text(json.dumps(router_control_keys(FLEET_KEY, [], {"engine-a": 0})))
    assert [i for i, _ in read_control_keys(path)] == ["operator", "engine-a"]


def test_a_real_router_takes_each_hosts_key_refuses_revoked_ones_and_audits_by_host(
    tmp_path, monkeypatch
):
    generations = {"engine-a": 0, "engine-b": 1}
    accepted = [
        [k["id"], k["id"], k["key"], "admin"]
        for k in router_control_keys(FLEET_KEY, [], generations)
    ]
    log = tmp_path / "router.log"
    # As the router unit runs it: its own level (the lab's warn), the audit log at INFO
    # through RUST_LOG with the catalog's filter (roles/router/templates).
    release = yaml.safe_load((ROOT / "catalog/routers.yml").read_text())
    monkeypatch.setenv(
        "RUST_LOG", f"warn,{release['fleet_router_releases']['sglang']['audit_log_filter']}"
    )
    extra = {
        "control_plane_api_keys": accepted,
        "control_plane_audit_enabled": True,
        "log_level": "warn",
    }
    with running_engine() as engine, running_router("sglang", log, extra=extra) as router:

        def add_worker(key: str | None) -> int:
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            body = {"url": engine.url, "api_key": ENGINE_KEY, "model_id": "fake-model"}
            return httpx.post(f"{router.url}/workers", json=body, headers=headers).status_code

        refused = {
            "no key": add_worker(None),
            "the client key": add_worker(CLIENT_KEY),
            "the engine key": add_worker(ENGINE_KEY),
            "engine-b's revoked key": add_worker(host_control_key(FLEET_KEY, "engine-b", 0)),
            "a key derived from another fleet key": add_worker(
                host_control_key(OLD_FLEET_KEY, "engine-a", 0)
            ),
        }
        assert refused == dict.fromkeys(refused, 401)
        assert add_worker(host_control_key(FLEET_KEY, "engine-a", 0)) in (200, 201, 202)
    audit = [
        ANSI.sub("", line) for line in log.read_text().splitlines() if "control_plane_audit" in line
    ]
    added = [line for line in audit if "method=POST" in line and "outcome=success" in line]
    assert len(added) == 1 and "principal=engine-a " in added[0]
    denied = [line for line in audit if "method=POST" in line and "outcome=denied" in line]
    assert len(denied) == len(refused)
    # Not every request's lines: the rest of the router stays at its own level.
    assert "started processing request" not in log.read_text()
