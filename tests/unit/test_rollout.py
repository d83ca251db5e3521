"""What a run restarts, drains and releases: decided from the host's actual state."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time

import pytest

from vllm_fleet.deploy.rollout import drain_plan, restart_plan
from vllm_fleet.engine import state as engine_state
from vllm_fleet.router import hold


def systemctl_show(active: str, started_us: int):
    def run(argv, **_kwargs):
        assert argv[:2] == ["systemctl", "show"]
        out = f"ActiveState={active}\nExecMainStartTimestampMonotonic={started_us}\n"
        return subprocess.CompletedProcess(argv, 0, out, "")

    return run


@pytest.fixture
def host(tmp_path, monkeypatch):
    config = tmp_path / "engines"
    config.mkdir()
    unit = tmp_path / "vllm-engine@.service"
    unit.write_text("[Service]\n")
    monkeypatch.setenv(hold.HOLD_DIR_ENV, str(tmp_path / "hold"))
    for name in ("g0.json", "g0.env"):
        (config / name).write_text("{}")
    # Every file written an hour ago.
    old = time.time() - 3600
    for path in (*config.iterdir(), unit):
        os.utime(path, (old, old))
    return config, unit


def started_ago(seconds: float) -> int:
    return int((time.monotonic() - seconds) * 1_000_000)


def test_a_group_started_after_its_files_were_written_is_current(host):
    config, unit = host
    state = engine_state.host_state(config, unit, run=systemctl_show("active", started_ago(60)))
    assert state.pending_restart == []
    assert state.groups["g0"].newer_than_process == []


def test_settings_written_after_the_process_started_mean_it_runs_something_else(host):
    """The interrupted run: new settings rendered, the restart never happened."""
    config, unit = host
    (config / "g0.json").write_text('{"max_num_seqs": 8}')  # mtime now
    state = engine_state.host_state(config, unit, run=systemctl_show("active", started_ago(60)))
    assert state.pending_restart == ["g0"]
    assert state.groups["g0"].newer_than_process == ["g0.json"]


def test_a_new_unit_file_or_key_is_stale_too(host):
    config, unit = host
    unit.write_text("[Service]\nUMask=0077\n")
    (config / "g0.env").write_text("VLLM_API_KEY=new\n")
    state = engine_state.host_state(config, unit, run=systemctl_show("active", started_ago(60)))
    assert state.groups["g0"].newer_than_process == ["g0.env", "vllm-engine@.service"]


def test_a_new_memory_bound_in_the_groups_drop_in_is_stale_and_another_groups_is_not(host):
    """A run that died after writing g0's drop-in (its MemoryMax=) and before the restart."""
    config, unit = host
    for group in ("g0", "g1"):
        (unit.parent / f"vllm-engine@{group}.service.d").mkdir()
    (unit.parent / "vllm-engine@g1.service.d" / "g1.conf").write_text("[Service]\n")
    (unit.parent / "vllm-engine@g0.service.d" / "g0.conf").write_text(
        "[Service]\nMemoryMax=6442450944\n"
    )
    state = engine_state.group_state(
        "g0", config, unit, run=systemctl_show("active", started_ago(60))
    )
    assert state.newer_than_process == ["g0.conf"]
    old = time.time() - 3600
    os.utime(unit.parent / "vllm-engine@g0.service.d" / "g0.conf", (old, old))
    state = engine_state.group_state(
        "g0", config, unit, run=systemctl_show("active", started_ago(60))
    )
    assert state.newer_than_process == []


@pytest.mark.parametrize("active", ["failed", "inactive"])
def test_a_stopped_group_must_start(host, active):
    config, unit = host
    state = engine_state.host_state(config, unit, run=systemctl_show(active, 0))
    assert state.pending_restart == ["g0"]


def test_a_start_under_way_is_not_stale(host):
    config, unit = host
    state = engine_state.host_state(config, unit, run=systemctl_show("activating", started_ago(5)))
    assert state.pending_restart == []


def test_holds_left_by_a_run_are_told_from_an_operators(host):
    config, unit = host
    (config / "g1.json").write_text("{}")
    hold.hold("g0", "upgrade 20261202T010000Z")
    hold.hold("g1", "disk replacement, ticket 42")
    state = engine_state.host_state(config, unit, run=systemctl_show("active", started_ago(1)))
    assert state.run_holds == ["g0"]
    assert state.operator_holds == ["g1"]
    data = json.loads(state.to_json())
    assert data["groups"]["g0"]["hold"]["by_run"] is True
    assert data["groups"]["g0"]["hold"]["since"] == pytest.approx(time.time(), abs=60)


def render(name: str, changed: bool) -> dict:
    return {"item": {"name": name}, "changed": changed}


def state(pending=(), run_holds=(), operator_holds=()) -> str:
    return json.dumps(
        {
            "pending_restart": list(pending),
            "run_holds": list(run_holds),
            "operator_holds": list(operator_holds),
        }
    )


def test_restart_plan_adds_what_the_host_says_is_stale_to_what_this_run_changed():
    plan = restart_plan(
        ["g0", "g1", "g2"],
        False,
        [render("g0", True), render("g1", False), render("g2", False)],
        state(pending=["g1", "gone"], run_holds=["g2"], operator_holds=["g1"]),
    )
    assert plan == {"restart": ["g0", "g1"], "run_holds": ["g2"], "operator_holds": ["g1"]}


def test_restart_plan_a_changed_unit_restarts_every_group_and_a_new_host_has_no_state():
    assert restart_plan(["g0", "g1"], True, [], "")["restart"] == ["g0", "g1"]
    assert restart_plan(["g0"], False, [render("g0", False)], "") == {
        "restart": [],
        "run_holds": [],
        "operator_holds": [],
    }


def slurped(group: str, served: str) -> list[dict]:
    config = {"group": group, "served_name": served}
    env = "VLLM_API_KEY=secret\n"
    return [
        {
            "item": {"path": f"/etc/vllm-fleet/engines/{group}.json"},
            "content": base64.b64encode(json.dumps(config).encode()).decode(),
        },
        {
            "item": {"path": f"/etc/vllm-fleet/engines/{group}.env"},
            "content": base64.b64encode(env.encode()).decode(),
        },
    ]


MODELS = {"a": {"served_name": "alpha"}, "b": {"served_name": "beta"}}


def engine_state_json(**active: str) -> str:
    return json.dumps({"groups": {g: {"active_state": s} for g, s in active.items()}})


def plan_for(host_groups: dict, batch: list[str], snapshot, restart, groups, active) -> list:
    hostvars = {
        h: {"fleet_engine_groups": [{"name": n, "model": m} for n, m in g]}
        for h, g in host_groups.items()
    }
    return drain_plan(
        snapshot,
        groups=groups,
        restart=restart,
        state_json=active,
        engine_hosts=list(host_groups),
        batch_hosts=batch,
        hostvars=hostvars,
        models=MODELS,
    )


def test_a_revision_change_waits_for_every_other_engine_of_the_served_name():
    fleet = {"e1": [("g0", "a")], "e2": [("g0", "a")], "e3": [("g0", "a")]}
    plan = plan_for(
        fleet, ["e1"], slurped("g0", "alpha"), ["g0"], ["g0"], engine_state_json(g0="active")
    )
    assert plan == [{"name": "g0", "served_name": "alpha", "leaving": False, "min_peers": 2}]


def test_a_model_replaced_host_by_host_counts_peers_of_the_name_it_serves_now():
    """e1 moves alpha -> beta while e2 still serves alpha: no group will serve alpha after
    this change (retired), so nothing outside the batch is owed to it."""
    fleet = {"e1": [("g0", "b")], "e2": [("g0", "b")]}
    plan = plan_for(
        fleet, ["e2"], slurped("g0", "alpha"), ["g0"], ["g0"], engine_state_json(g0="active")
    )
    assert plan[0]["min_peers"] == 0
    assert plan[0]["served_name"] == "alpha"


def test_a_group_leaving_the_inventory_drains_first_and_a_stopped_one_is_not_drained():
    fleet = {"e1": [("g0", "a")], "e2": [("g0", "a")]}
    snapshot = slurped("g0", "alpha") + slurped("g9", "alpha") + slurped("g8", "beta")
    plan = plan_for(
        fleet,
        ["e1"],
        snapshot,
        [],
        ["g0"],
        engine_state_json(g0="active", g9="active", g8="failed"),
    )
    assert plan == [{"name": "g9", "served_name": "alpha", "leaving": True, "min_peers": 1}]


def test_an_operators_hold_is_not_drained_over():
    fleet = {"e1": [("g0", "a")], "e2": [("g0", "a")]}
    state = json.dumps({"groups": {"g0": {"active_state": "active"}}, "operator_holds": ["g0"]})
    assert plan_for(fleet, ["e1"], slurped("g0", "alpha"), ["g0"], ["g0"], state) == []
