"""The fleet_upgrade role's filters (loaded from the role, as Ansible loads them)."""

from __future__ import annotations

from vllm_fleet.ansible import fleet_upgrade as filters


def test_config_groups_are_the_settings_files_stems():
    files = [
        {"path": "/etc/vllm-fleet/engines/g1.env"},
        {"path": "/etc/vllm-fleet/engines/g1.json"},
        {"path": "/etc/vllm-fleet/engines/g0.json"},
    ]
    assert filters.config_groups(files) == ["g0", "g1"]


def test_failure_text_prefers_the_failed_items_messages_and_flattens_lists():
    result = {
        "msg": "One or more items failed",
        "results": [
            {"failed": False, "msg": "fine"},
            {"failed": True, "msg": ["group g0 did not start:", ["line 1", "line 2"]]},
        ],
    }
    assert filters.failure_text(result) == "group g0 did not start:\nline 1\nline 2"
    assert filters.failure_text({"msg": "plain"}) == "plain"
    long = {"msg": ["header line", *(f"journal line {i}" for i in range(500)), "the reason"]}
    text = filters.failure_text(long, 400)
    assert len(text) <= 400
    assert text.startswith("header line\n[...]\n")
    assert text.endswith("journal line 499\nthe reason")


def test_records_keep_play_order_and_skip_hosts_without_one():
    hostvars = {
        "a": {"fleet_upgrade_record": {"host": "a"}},
        "b": {},
        "c": {"fleet_upgrade_record": {"host": "c"}},
    }
    assert filters.upgrade_records(["c", "b", "a"], hostvars) == [{"host": "c"}, {"host": "a"}]


def test_snapshot_files_keep_owner_group_mode_and_filter_by_group():
    def slurped(path: str, owner: str, group: str, mode: str) -> dict:
        return {
            "item": {"path": path, "pw_name": owner, "gr_name": group, "mode": mode},
            "content": "Zm9v",
        }

    results = [
        slurped("/etc/vllm-fleet/engines/g0.json", "root", "vllm", "0640"),
        slurped("/etc/vllm-fleet/engines/g0.env", "root", "root", "0600"),
        slurped("/etc/vllm-fleet/engines/g1.json", "root", "vllm", "0640"),
        slurped("/etc/systemd/system/vllm-engine@.service", "root", "root", "0644"),
    ]
    assert len(filters.snapshot_files(results)) == 4
    chosen = filters.snapshot_files(results, ["g0"], "/etc/systemd/system/vllm-engine@.service")
    assert [(f["path"], f["group"], f["mode"]) for f in chosen] == [
        ("/etc/vllm-fleet/engines/g0.json", "vllm", "0640"),
        ("/etc/vllm-fleet/engines/g0.env", "root", "0600"),
        ("/etc/systemd/system/vllm-engine@.service", "root", "0644"),
    ]
    assert filters.snapshot_files(results, [], "") == []
