"""Rolling upgrades of the lab under a steady client load through the router.

1. Settings and model revision: every engine goes from max_num_seqs 16 to 12 and from the
   pinned revision A to a revision B published to the mirror for this test.
2. A broken target (a flag vLLM refuses) on top of that: the canary host fails to start it,
   is rolled back, and the run stops before the second host; the report explains it.

They run after the fault matrix (tests/lab/conftest.py) and before the change matrix, which
starts from whatever they leave. The first runs in make test-all only (marker full).

Each must finish with zero failed client requests, streams included: a drained engine
leaves the router first and finishes what it runs before it restarts.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator

import pytest

from tests.lab.faults import ENGINE_URLS, MODEL, ROUTER, secret, wait_until, workers
from tests.support.lab import (
    CACHE,
    ENGINES,
    ROOT,
    PlaybookRun,
    engine_settings,
    in_host,
    playbook,
    smoke_in,
)
from vllm_fleet.lab.client_load import ClientLoad, LoadStats
from vllm_fleet.lab.rotation import RotationSampler
from vllm_fleet.lab.variants import inventory_variant, publish_revision, remove_revision

VARIANT = "upgrade-test"


@pytest.fixture(scope="module")
def revision_b() -> Iterator[str]:
    """A second valid revision of the lab's model in the mirror (one file differs)."""
    revision = publish_revision(CACHE, "revision B of the rolling-upgrade test")
    yield revision
    remove_revision(CACHE, revision)


@pytest.fixture(scope="module")
def upgrade_lab(fresh_lab) -> Iterator[None]:
    assert fresh_lab.returncode == 0, fresh_lab.output[-3000:]
    wait_until(both_serving, 300, "both engines in the router's rotation")
    yield
    shutil.rmtree(ROOT / "inventories" / VARIANT, ignore_errors=True)


def both_serving() -> bool:
    listed = workers()
    return all(listed.get(url) is True for url in ENGINE_URLS.values())


def load() -> ClientLoad:
    return ClientLoad(ROUTER, secret("router_client_key"), MODEL, plain=3, streams=1)


def report_of(run_output: str) -> dict[str, object]:
    reports = sorted((ROOT / "reports").glob("upgrade-*/report.json"))
    assert reports, run_output[-3000:]
    return json.loads(reports[-1].read_text())


def upgrade(*args: str) -> tuple[PlaybookRun, LoadStats]:
    urls = list(ENGINE_URLS.values())
    with (
        RotationSampler(ROUTER, secret("router_control_key"), urls) as sampler,
        load() as clients,
    ):
        run = playbook("playbooks/upgrade.yml", *args)
        wait_until(both_serving, 120, "both engines serving after the upgrade")
    stats, rotation = clients.stats, sampler.rotation
    out = {u: round(s, 1) for u, s in rotation.unavailable_seconds().items()}
    print(
        f"\n[upgrade {' '.join(args) or 'to the inventory'}] {run.seconds:.0f} s; {stats.line()}; "
        f"engines serving at least {rotation.min_serving()}; out of rotation (s) {out}"
    )
    # Never fewer than N-1 of the model's engines serving.
    assert rotation.min_serving() >= len(urls) - 1
    assert len(rotation.samples) > 10
    return run, stats


# make test-all: the change matrix's interrupted-upgrade row runs upgrade.yml and completes
# the same change with site.yml's engine play, the same role (fleet_upgrade).
@pytest.mark.full
def test_settings_and_revision_roll_through_the_fleet_without_a_failed_request(
    upgrade_lab, revision_b
):
    inventory = inventory_variant(ROOT, VARIANT, revision_b, 12)
    run, stats = upgrade("-i", str(inventory))
    assert run.returncode == 0, run.output[-6000:]
    assert stats.plain_failed == 0, stats.failures[:5]
    assert stats.streams_cut == stats.streams_refused == 0
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
    before = {host: engine_settings(host) for host in ENGINES}
    inventory = inventory_variant(ROOT, VARIANT, revision_b, 12, {"engine01": ["--no-such-flag"]})
    run, stats = upgrade("-i", str(inventory))
    assert run.returncode != 0
    assert stats.plain_failed == 0, stats.failures[:5]
    assert stats.streams_cut == stats.streams_refused == 0
    report = report_of(run.output)
    # The canary failed and was rolled back; the second host was never touched.
    assert [(h["host"], h["outcome"], h["step"]) for h in report["hosts"]] == [
        ("engine01", "rolled back", "restart")
    ]
    engine01 = report["hosts"][0]
    assert "unrecognized arguments: --no-such-flag" in engine01["error"]
    assert engine01["rollback"] == "rolled back: g0 serving on the previous settings again"
    for host in ENGINES:
        # The canary is back on what it ran before; the second host was never touched.
        assert engine_settings(host) == before[host]
        assert smoke_in(host).returncode == 0
