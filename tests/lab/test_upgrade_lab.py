"""Rolling upgrades of the lab under a steady client load through the router.

1. Settings and model revision: every engine goes from max_num_seqs 16 to 12 and from the
   pinned revision A to a revision B published to the mirror for this test.
2. A broken target (a flag vLLM refuses) on top of that: the canary host fails to start it,
   is rolled back, and the run stops before the second host; the report explains it.
3. Back to the inventory (B -> A, 12 -> 16), so later tests find the lab as deployed.

Each must finish with zero failed client requests, streams included: a drained engine
leaves the router first and finishes what it runs before it restarts.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.lab.client_load import ClientLoad
from tests.lab.conftest import (
    CACHE,
    ENGINES,
    ROOT,
    engine_settings,
    in_host,
    pinned_revision,
    playbook,
    smoke_in,
)
from tests.lab.test_router_watchdog import ENGINE_URLS, MODEL, ROUTER, secret, wait_until, workers
from vllm_fleet.publish import publish

UPGRADE_INVENTORY = ROOT / "inventories" / ".upgrade-test"


@pytest.fixture(scope="module")
def revision_b() -> Iterator[str]:
    """A second valid revision of the lab's model in the mirror (one file differs)."""
    source = CACHE / "upgrade-test-model"
    shutil.rmtree(source, ignore_errors=True)
    shutil.copytree(CACHE / "converted" / "smollm2-135m", source)
    (source / "NOTICE").write_text("revision B of the rolling-upgrade test\n")
    mirror_dir = CACHE / "mirror" / "models" / "smollm2-135m"
    revision = publish("smollm2-135m", source, mirror_dir)
    shutil.rmtree(source)
    yield revision
    shutil.rmtree(mirror_dir / revision, ignore_errors=True)


def write_inventory(revision: str, max_num_seqs: int, engine01_extra: list[str]) -> Path:
    """The lab inventory, edited as an operator would (inside inventories/, as the lab's
    secrets are found relative to it)."""
    shutil.rmtree(UPGRADE_INVENTORY, ignore_errors=True)
    shutil.copytree(ROOT / "inventories" / "lab", UPGRADE_INVENTORY)
    models_file = UPGRADE_INVENTORY / "group_vars/all/models.yml"
    models = yaml.safe_load(models_file.read_text())
    models["fleet_models"]["smollm2-135m"]["revision"] = revision
    models_file.write_text(yaml.safe_dump(models))
    for host in ENGINES:
        host_file = UPGRADE_INVENTORY / "host_vars" / f"{host}.yml"
        settings = yaml.safe_load(host_file.read_text())
        for group in settings["fleet_engine_groups"]:
            group["max_num_seqs"] = max_num_seqs
            if host == "engine01" and engine01_extra:
                group["extra_args"] = engine01_extra
        host_file.write_text(yaml.safe_dump(settings))
    return UPGRADE_INVENTORY


@pytest.fixture(scope="module")
def upgrade_lab(fresh_lab) -> Iterator[None]:
    assert fresh_lab.returncode == 0, fresh_lab.output[-3000:]
    wait_until(both_serving, 300, "both engines in the router's rotation")
    yield
    shutil.rmtree(UPGRADE_INVENTORY, ignore_errors=True)


def both_serving() -> bool:
    listed = workers()
    return all(listed.get(url) is True for url in ENGINE_URLS.values())


def load() -> ClientLoad:
    return ClientLoad(ROUTER, secret("router_client_key"), MODEL, plain=3, streams=1)


def report_of(run_output: str) -> dict[str, object]:
    reports = sorted((ROOT / "reports").glob("upgrade-*/report.json"))
    assert reports, run_output[-3000:]
    return json.loads(reports[-1].read_text())


def upgrade(*args: str) -> tuple[object, object]:
    with load() as clients:
        run = playbook("playbooks/upgrade.yml", *args)
        wait_until(both_serving, 120, "both engines serving after the upgrade")
    stats = clients.stats
    print(f"\n[upgrade {' '.join(args) or 'to the inventory'}] {run.seconds:.0f} s; {stats.line()}")
    return run, stats


def test_settings_and_revision_roll_through_the_fleet_without_a_failed_request(
    upgrade_lab, revision_b
):
    inventory = write_inventory(revision_b, 12, [])
    run, stats = upgrade("-i", str(inventory))
    assert run.returncode == 0, run.output[-6000:]
    assert stats.plain_failed == 0, stats.failures[:5]
    assert stats.streams_cut == 0
    assert stats.plain_ok > 0
    for host in ENGINES:
        settings = engine_settings(host)
        assert settings["max_num_seqs"] == 12
        assert str(settings["model_path"]).endswith(revision_b)
        assert in_host(host, "ls", "/var/lib/vllm-fleet/hold").stdout.split() == []
    report = report_of(run.output)
    assert [(h["host"], h["outcome"]) for h in report["hosts"]] == [
        ("engine01", "upgraded"),
        ("engine02", "upgraded"),
    ]
    assert all(d["idle"] for h in report["hosts"] for d in h["drained"])


def test_a_broken_target_rolls_the_canary_back_and_stops(upgrade_lab, revision_b):
    inventory = write_inventory(revision_b, 12, ["--no-such-flag"])
    run, stats = upgrade("-i", str(inventory))
    assert run.returncode != 0
    assert stats.plain_failed == 0, stats.failures[:5]
    assert stats.streams_cut == 0
    report = report_of(run.output)
    # The canary failed and was rolled back; the second host was never touched.
    assert [(h["host"], h["outcome"], h["step"]) for h in report["hosts"]] == [
        ("engine01", "rolled back", "restart")
    ]
    engine01 = report["hosts"][0]
    assert "unrecognized arguments: --no-such-flag" in engine01["error"]
    assert engine01["rollback"] == "rolled back: g0 serving on the previous settings again"
    for host in ENGINES:
        settings = engine_settings(host)
        assert "--no-such-flag" not in settings["extra_args"]
        assert str(settings["model_path"]).endswith(revision_b)
        assert smoke_in(host).returncode == 0


def test_back_to_the_inventory_without_a_failed_request(upgrade_lab):
    run, stats = upgrade()
    assert run.returncode == 0, run.output[-6000:]
    assert stats.plain_failed == 0, stats.failures[:5]
    assert stats.streams_cut == 0
    for host in ENGINES:
        settings = engine_settings(host)
        assert settings["max_num_seqs"] == 16
        assert str(settings["model_path"]).endswith(pinned_revision())
