"""Changes preflight refuses because they cannot be made safely."""

from __future__ import annotations

import base64
import json

from vllm_fleet.preflight.change_safety import RETIRED_KEY, check_change, running_groups

MODELS = {
    "smollm2-135m": {"served_name": "smollm2"},
    "smollm2-360m": {"served_name": "smollm2-big"},
}


def probe(*groups: tuple[str, str]) -> dict:
    return {
        "results": [
            {
                "item": {"path": f"/etc/vllm-fleet/engines/{g}.json"},
                "content": base64.b64encode(
                    json.dumps({"group": g, "served_name": s, "port": 8100}).encode()
                ).decode(),
            }
            for g, s in groups
        ]
    }


def fleet(**hosts: str) -> dict:
    return {h: {"fleet_engine_groups": [{"name": "g0", "model": m}]} for h, m in hosts.items()}


RUNNING = running_groups("engine01", probe(("g0", "smollm2"))) + running_groups(
    "engine02", probe(("g0", "smollm2"))
)


def test_both_groups_moved_to_a_new_name_at_once_is_refused_with_the_safe_sequence():
    findings = check_change(
        RUNNING, fleet(engine01="smollm2-360m", engine02="smollm2-360m"), MODELS, []
    )
    assert len(findings) == 1
    text = str(findings[0])
    assert text.startswith("engine01: fleet_models.*.served_name='smollm2'")
    assert "engine01/g0, engine02/g0" in text
    assert "first add the new model beside it" in text
    assert f"{RETIRED_KEY}: [smollm2]" in text


def test_a_new_model_beside_the_old_one_is_safe_and_so_is_retiring_the_old_name():
    assert (
        check_change(RUNNING, fleet(engine01="smollm2-360m", engine02="smollm2-135m"), MODELS, [])
        == []
    )
    moved = fleet(engine01="smollm2-360m", engine02="smollm2-360m")
    assert check_change(RUNNING, moved, MODELS, ["smollm2"]) == []


def test_a_retired_name_still_served_is_refused():
    findings = check_change(RUNNING, fleet(engine01="smollm2-135m"), MODELS, ["smollm2"])
    assert [f.key for f in findings] == [RETIRED_KEY]
    assert "still served by engine01/g0" in findings[0].message


def test_one_served_name_for_two_models_the_fleet_serves_is_refused():
    models = {**MODELS, "other": {"served_name": "smollm2"}}
    findings = check_change([], fleet(engine01="smollm2-135m", engine02="other"), models, [])
    assert len(findings) == 1
    assert findings[0].key == "fleet_models.other.served_name"
    assert "is also the served name of model smollm2-135m" in findings[0].message
    # An entry no group uses is harmless.
    assert check_change([], fleet(engine01="smollm2-135m"), models, []) == []


def test_removing_the_last_group_of_a_name_is_refused_and_a_fresh_fleet_is_not():
    assert check_change(RUNNING, fleet(engine01="smollm2-135m"), MODELS, []) == []
    findings = check_change(RUNNING, {}, MODELS, [])
    assert [f.value for f in findings] == ["smollm2"]
    assert check_change([], fleet(engine01="smollm2-360m"), MODELS, []) == []


def test_unreadable_probe_results_are_skipped_not_fatal():
    broken = {"results": [{"item": {"path": "x.json"}, "content": "!!"}, {"skipped": True}]}
    assert running_groups("engine01", broken) == []
    assert running_groups("engine01", None) == []


def test_two_served_names_behind_a_router_that_cannot_route_by_model_are_refused():
    """vllm-router (multi_model: false) would send each request to any engine: the new
    model beside the old one gets the other's 404s. Preflight names the router, its
    implementation, each name's groups and the fix."""
    beside = fleet(engine01="smollm2-360m", engine02="smollm2-135m")
    findings = check_change(RUNNING, beside, MODELS, [], {"router01": "vllm"})
    assert len(findings) == 1
    text = str(findings[0])
    assert text.startswith("router01: fleet_router.impl='vllm'")
    assert "smollm2 by engine02/g0; smollm2-big by engine01/g0" in text
    assert "cannot route by model" in text
    assert "use impl: sglang" in text


def test_one_served_name_behind_any_router_is_fine_and_so_is_a_takeover():
    """A new model taking over the old one's served name serves one name throughout."""
    models = {**MODELS, "smollm2-135m-b": {"served_name": "smollm2"}}
    swapped = fleet(engine01="smollm2-135m-b", engine02="smollm2-135m-b")
    assert check_change(RUNNING, swapped, models, [], {"router01": "vllm"}) == []
    # Half-way (one host on each model) is a rolling change's state, never an inventory's.
    half = fleet(engine01="smollm2-135m-b", engine02="smollm2-135m")
    assert [f.key for f in check_change(RUNNING, half, models, [], {})] == [
        "fleet_models.smollm2-135m-b.served_name"
    ]


def test_a_dropped_name_names_both_safe_sequences():
    moved = fleet(engine01="smollm2-360m", engine02="smollm2-360m")
    findings = check_change(RUNNING, moved, MODELS, [], {})
    assert [f.value for f in findings] == ["smollm2"]
    assert "first add the new model beside it" in findings[0].fix
    assert "give the new model served_name: smollm2" in findings[0].fix
