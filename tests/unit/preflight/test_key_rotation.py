"""Key rotations the routers would refuse mid-run are refused, and no key is ever shown."""

from __future__ import annotations

import base64
import json
import shlex

import jinja2

from tests.support.paths import ROOT
from vllm_fleet.ansible.preflight_action import router_default_vrid
from vllm_fleet.ansible.router import FILTERS as ROUTER_FILTERS
from vllm_fleet.preflight.checks import HostInput
from vllm_fleet.preflight.facts import HostFacts
from vllm_fleet.preflight.key_rotation import (
    CLIENT,
    CONTROL,
    CUTOVER,
    GENERATION,
    RETIRING,
    check_fleet_keys,
    keys_now,
)
from vllm_fleet.router.control_keys import host_control_key

OLD_CONTROL = "old-control-key-0123456789"
NEW_CONTROL = "new-control-key-0123456789"
OLD_CLIENT = "old-client-key-0123456789"
NEW_CLIENT = "new-client-key-0123456789"
DEFAULT_VRID = 51  # roles/router/defaults/main.yml (a test below keeps them equal)


def slurp(**files: dict[str, str]) -> dict:
    """The probe's slurp loop result: present files with content, absent ones failed."""
    results = []
    for name, values in files.items():
        text = "# managed\n" + "".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items())
        results.append(
            {
                "item": f"/etc/vllm-fleet/{name}.env",
                "content": base64.b64encode(text.encode()).decode(),
            }
        )
    results.append({"item": "/etc/vllm-fleet/absent.env", "failed": True, "msg": "not found"})
    return {"results": results}


def engine_host(presented: str | None, **variables: object) -> HostInput:
    files = {"watchdog": {"VLLM_FLEET_ROUTER_CONTROL_KEY": presented}} if presented else {}
    return HostInput("engine01", dict(variables), HostFacts(), key_files=slurp(**files))


def router_host(client_now: str, **variables: object) -> HostInput:
    files = {
        "router": {
            "VLLM_FLEET_ROUTER_CLIENT_KEY": client_now,
            "VLLM_FLEET_ROUTER_CONTROL_KEY": OLD_CONTROL,
        }
    }
    return HostInput("router01", dict(variables), HostFacts(), key_files=slurp(**files))


def shown(findings) -> str:
    return "\n".join(str(f) for f in findings)


def test_keys_now_reads_each_present_file_by_name():
    found = keys_now(slurp(watchdog={"VLLM_FLEET_ROUTER_CONTROL_KEY": "a b'c"}))
    assert found == {"watchdog.env": {"VLLM_FLEET_ROUTER_CONTROL_KEY": "a b'c"}}
    assert keys_now(None) == {} and keys_now({"results": [{"content": "!!"}]}) == {}


def test_a_control_key_changed_in_one_run_is_refused_with_the_two_run_sequence():
    findings = check_fleet_keys([engine_host(OLD_CONTROL, **{CONTROL: NEW_CONTROL})], DEFAULT_VRID)
    assert [(f.host, f.key) for f in findings] == [("engine01", CONTROL)]
    text = shown(findings)
    assert "would refuse this host's engines (401)" in text
    assert f"list the current one in {RETIRING}" in text and f"then empty {RETIRING}" in text
    assert OLD_CONTROL not in text and NEW_CONTROL not in text


def test_each_run_of_the_two_run_rotation_passes():
    first = engine_host(OLD_CONTROL, **{CONTROL: NEW_CONTROL, RETIRING: [OLD_CONTROL]})
    # The second run: the engine hosts present the new key; the old one is dropped.
    second = engine_host(NEW_CONTROL, **{CONTROL: NEW_CONTROL, RETIRING: []})
    unchanged = engine_host(OLD_CONTROL, **{CONTROL: OLD_CONTROL})
    fresh = engine_host(None, **{CONTROL: NEW_CONTROL})
    assert check_fleet_keys([first, second, unchanged, fresh], DEFAULT_VRID) == []


def test_dropping_the_retiring_key_before_a_host_moved_is_refused():
    """The first run failed on engine02: it still presents the old key."""
    behind = engine_host(OLD_CONTROL, **{CONTROL: NEW_CONTROL, RETIRING: []})
    assert [f.key for f in check_fleet_keys([behind], DEFAULT_VRID)] == [CONTROL]


def test_a_bad_retiring_list_is_refused_once_for_the_fleet_without_showing_it():
    for bad in ("not-a-list", ["short"], [NEW_CONTROL], [OLD_CLIENT], [OLD_CONTROL, 7]):
        hosts = [
            engine_host(None, **{CONTROL: NEW_CONTROL, CLIENT: OLD_CLIENT, RETIRING: bad})
            for _ in range(3)
        ]
        findings = check_fleet_keys(hosts, DEFAULT_VRID)
        assert [f.key for f in findings] == [RETIRING], bad
        assert NEW_CONTROL not in shown(findings) and OLD_CLIENT not in shown(findings)


def test_a_client_key_change_is_refused_until_the_run_says_the_clients_moved():
    refused = check_fleet_keys([router_host(OLD_CLIENT, **{CLIENT: NEW_CLIENT})], DEFAULT_VRID)
    assert [(f.host, f.key) for f in refused] == [("router01", CLIENT)]
    assert f"-e {CUTOVER}=true" in shown(refused)
    assert OLD_CLIENT not in shown(refused) and NEW_CLIENT not in shown(refused)
    for cutover in (True, "true"):
        assert (
            check_fleet_keys(
                [router_host(OLD_CLIENT, **{CLIENT: NEW_CLIENT, CUTOVER: cutover})], DEFAULT_VRID
            )
            == []
        )
    assert check_fleet_keys([router_host(OLD_CLIENT, **{CLIENT: OLD_CLIENT})], DEFAULT_VRID) == []


def test_vllm_router_has_no_client_key_to_cut_over():
    vllm = router_host(OLD_CLIENT, **{CLIENT: NEW_CLIENT, "fleet_router": {"impl": "vllm"}})
    assert check_fleet_keys([vllm], DEFAULT_VRID) == []


ENGINE = "engine-key-0123456789abc"


def router_running(impl_now: str, **variables: object) -> HostInput:
    """A router host whose router.json says impl_now runs, on the client key OLD_CLIENT."""
    host = router_host(OLD_CLIENT, **{"fleet_engine_api_key": ENGINE, **variables})
    settings = {"impl": impl_now, "package": f"{impl_now}_router", "router_args": {"port": 1}}
    host.key_files["results"].append(
        {
            "item": "/etc/vllm-fleet/router.json",
            "content": base64.b64encode(json.dumps(settings).encode()).decode(),
        }
    )
    return host


def test_keys_now_reads_the_routers_settings_as_json():
    host = router_running("sglang")
    assert keys_now(host.key_files)["router.json"] == {"impl": "sglang", "package": "sglang_router"}


def test_a_router_implementation_change_is_a_client_key_cut_over():
    """sglang-router checks the client key; vllm-router passes the client's key to the
    engines: moving between them changes the key every client must present."""
    for now, new in [("sglang", "vllm"), ("vllm", "sglang")]:
        change = {CLIENT: OLD_CLIENT, "fleet_router": {"impl": new}}
        refused = check_fleet_keys([router_running(now, **change)], DEFAULT_VRID)
        assert [(f.host, f.key, f.value) for f in refused] == [
            ("router01", "fleet_router.impl", new)
        ], (now, new)
        assert f"-e {CUTOVER}=true" in shown(refused)
        assert OLD_CLIENT not in shown(refused) and ENGINE not in shown(refused)
        assert (
            check_fleet_keys([router_running(now, **change, **{CUTOVER: True})], DEFAULT_VRID) == []
        )


def test_an_implementation_change_that_keeps_the_clients_key_passes():
    """The client key is the engine key: the clients present the same key to both."""
    same = {
        CLIENT: OLD_CLIENT,
        "fleet_engine_api_key": OLD_CLIENT,
        "fleet_router": {"impl": "vllm"},
    }
    assert check_fleet_keys([router_running("sglang", **same)], DEFAULT_VRID) == []
    unchanged = {CLIENT: OLD_CLIENT, "fleet_router": {"impl": "sglang"}}
    assert check_fleet_keys([router_running("sglang", **unchanged)], DEFAULT_VRID) == []


def keepalived_conf(vrid: int) -> str:
    """The router role's keepalived.conf, rendered from its template."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters.update(ROUTER_FILTERS)
    template = env.from_string((ROOT / "roles/router/templates/keepalived.conf.j2").read_text())
    return template.render(
        ansible_managed="managed",
        inventory_hostname="router01",
        router_vip={
            "address": "10.0.0.100",
            "prefix": 24,
            "vrid": vrid,
            "advert_interval_seconds": 1,
        },
        router_vip_check_path="/usr/local/libexec/check",
        router_vip_interface="eth0",
        router_vip_hosts=["router01", "router02"],
        router_vip_addresses={"router01": "10.0.0.10", "router02": "10.0.0.11"},
    )


def router_with_vip(
    vrid_now: int | None, text: str | None = None, **variables: object
) -> HostInput:
    host = router_host(OLD_CLIENT, **{CLIENT: OLD_CLIENT, **variables})
    conf = text if text is not None else keepalived_conf(vrid_now or 0)
    host.key_files["results"].append(
        {
            "item": "/etc/keepalived/keepalived.conf",
            "content": base64.b64encode(conf.encode()).decode(),
        }
    )
    return host


def test_a_new_vrrp_id_is_refused_with_the_sequence_that_moves_it_safely():
    """Rolled one router at a time, routers on the old and the new id would both hold the VIP."""
    vip = {"address": "10.0.0.100"}
    assert check_fleet_keys([router_with_vip(51, fleet_router={"vip": vip})], DEFAULT_VRID) == []
    moved = router_with_vip(51, fleet_router={"vip": {**vip, "vrid": 60}})
    [finding] = check_fleet_keys([moved], DEFAULT_VRID)
    assert (finding.host, finding.key, finding.value) == ("router01", "fleet_router.vip.vrid", 60)
    assert "this router runs 51" in finding.message and "remove fleet_router.vip" in finding.fix
    # The role's default is the id a VIP without vrid gets.
    [finding] = check_fleet_keys([router_with_vip(60, fleet_router={"vip": vip})], DEFAULT_VRID)
    assert finding.value == DEFAULT_VRID
    # Removing the VIP, and a keepalived the router role did not configure, pass.
    assert check_fleet_keys([router_with_vip(51, fleet_router={"vip": None})], DEFAULT_VRID) == []
    theirs = "vrrp_instance VI_1 {\n    virtual_router_id 7\n}\n"
    foreign = router_with_vip(None, theirs, fleet_router={"vip": vip})
    assert check_fleet_keys([foreign], DEFAULT_VRID) == []


def test_the_default_vrrp_id_is_the_router_roles():
    assert router_default_vrid(ROOT / "roles") == DEFAULT_VRID


def test_hosts_presenting_their_own_derived_keys_rotate_in_the_same_two_runs():
    old_own = host_control_key(OLD_CONTROL, "engine01")
    new_own = host_control_key(NEW_CONTROL, "engine01")
    one_run = engine_host(old_own, **{CONTROL: NEW_CONTROL})
    assert [f.key for f in check_fleet_keys([one_run], DEFAULT_VRID)] == [CONTROL]
    first = engine_host(old_own, **{CONTROL: NEW_CONTROL, RETIRING: [OLD_CONTROL]})
    second = engine_host(new_own, **{CONTROL: NEW_CONTROL, RETIRING: []})
    assert check_fleet_keys([first, second], DEFAULT_VRID) == []
    # Another host's key is not this host's: the routers know it under the other name only.
    stolen = engine_host(host_control_key(NEW_CONTROL, "engine02"), **{CONTROL: NEW_CONTROL})
    assert [f.key for f in check_fleet_keys([stolen], DEFAULT_VRID)] == [CONTROL]


def test_raising_a_hosts_generation_revokes_its_key_at_once_and_lowering_it_is_refused():
    gen0 = host_control_key(OLD_CONTROL, "engine01", 0)
    gen2 = host_control_key(OLD_CONTROL, "engine01", 2)
    revoked = engine_host(gen0, **{CONTROL: OLD_CONTROL, GENERATION: 1})
    assert check_fleet_keys([revoked], DEFAULT_VRID) == []
    lowered = engine_host(gen2, **{CONTROL: OLD_CONTROL, GENERATION: 1})
    findings = check_fleet_keys([lowered], DEFAULT_VRID)
    assert [(f.key, f.value) for f in findings] == [(GENERATION, "1")]
    assert f"set {GENERATION}: 2" in shown(findings) and gen2 not in shown(findings)


def test_a_generation_that_is_not_a_non_negative_integer_is_refused_by_name():
    assert check_fleet_keys([engine_host(None, **{GENERATION: "2"})], DEFAULT_VRID) == []
    for bad in (-1, "-1", "one", 1.5, True):
        findings = check_fleet_keys([engine_host(None, **{GENERATION: bad})], DEFAULT_VRID)
        assert [(f.host, f.key) for f in findings] == [("engine01", GENERATION)], bad
        assert "revoke the host's current key" in shown(findings)
