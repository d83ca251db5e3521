"""Draining a group out of a real sglang-router and releasing it back; the hold file."""

from __future__ import annotations

import json
import threading

import pytest

from tests.unit.router_fixtures import (
    CONTROL_KEY,
    ENGINE_KEY,
    FakeEngine,
    running_engine,
    running_router,
    sglang_listing,
    wait_until,
)
from vllm_fleet.cli import main
from vllm_fleet.engine.config import EngineConfig
from vllm_fleet.engine.membership import Membership, admit
from vllm_fleet.router import hold
from vllm_fleet.router.client import RouterTarget, router_client
from vllm_fleet.router.traffic import TrafficError, drain, release


@pytest.fixture
def sglang_router(tmp_path):
    """A router per test: peers counted by one test must not be left over from another."""
    with running_router("sglang", tmp_path / "router.log") as router:
        yield router


@pytest.fixture(autouse=True)
def hold_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(hold.HOLD_DIR_ENV, str(tmp_path / "hold"))
    return tmp_path / "hold"


@pytest.fixture
def engine():
    with running_engine() as served:
        yield served


def config_for(engine: FakeEngine, routers: list[str]) -> EngineConfig:
    port = int(engine.url.rsplit(":", 1)[1])
    return EngineConfig.model_validate(
        {
            "group": "g0",
            "accelerator": "cpu",
            "stack": "s",
            "stack_dir": "/opt/vllm-fleet/stacks/s",
            "model_path": "/srv/models/m/r",
            "served_name": engine.served_name,
            "host": "127.0.0.1",
            "port": port,
            "devices": [0],
            "max_model_len": 128,
            "max_num_seqs": 2,
            "kv_cache_bytes": 1 << 20,
            "advertise_url": engine.url,
            "routers": [{"impl": "sglang", "url": url} for url in routers],
        }
    )


def listed(router_url: str) -> list[str]:
    return [str(w["url"]) for w in sglang_listing(router_url)]


def join(router_url: str, engine: FakeEngine) -> None:
    client = router_client(RouterTarget(impl="sglang", url=router_url), CONTROL_KEY)
    client.join(engine.url, ENGINE_KEY, engine.served_name)
    wait_until(lambda: engine.url in listed(router_url), timeout=15, what="the join")


def test_drain_leaves_every_router_holds_and_waits_for_idle(sglang_router, engine, hold_dir):
    join(sglang_router.url, engine)
    engine.running, engine.waiting = 2, 1
    # The engine finishes its requests a little after the drain starts.
    threading.Timer(0.6, lambda: setattr(engine, "running", 0)).start()
    threading.Timer(0.9, lambda: setattr(engine, "waiting", 0)).start()
    result = drain(config_for(engine, [sglang_router.url]), CONTROL_KEY, 10, "upgrade", poll=0.1)
    assert result.left == [sglang_router.url]
    assert result.idle is True
    assert 0.8 < result.seconds < 5
    assert engine.url not in listed(sglang_router.url)
    assert hold.is_held("g0")
    assert json.loads((hold_dir / "g0").read_text())["reason"] == "upgrade"


def test_drain_gives_up_waiting_at_its_timeout_and_says_what_is_left(sglang_router, engine):
    engine.running = 3
    result = drain(config_for(engine, [sglang_router.url]), CONTROL_KEY, 0.5, "upgrade", poll=0.1)
    assert result.idle is False
    assert result.in_flight == 3.0
    assert result.left == []  # it was not listed
    assert hold.is_held("g0")


def test_drain_without_the_control_key_fails_and_names_the_group(sglang_router, engine):
    join(sglang_router.url, engine)
    with pytest.raises(TrafficError, match=r"group g0: could not leave the routers: .*401"):
        drain(config_for(engine, [sglang_router.url]), "wrong-key", 5, "upgrade")
    assert engine.url in listed(sglang_router.url)


def test_release_lifts_the_hold_and_waits_until_listed(sglang_router, engine):
    hold.hold("g0", "upgrade")
    cfg = config_for(engine, [sglang_router.url])
    seconds = release(cfg, ENGINE_KEY, CONTROL_KEY, 20, poll=0.1)
    assert not hold.is_held("g0")
    assert engine.url in listed(sglang_router.url)
    assert seconds < 20
    # Once listed, releasing again changes nothing.
    assert release(cfg, ENGINE_KEY, CONTROL_KEY, 5) < 5
    assert listed(sglang_router.url).count(engine.url) == 1
    drain(cfg, CONTROL_KEY, 1, "cleanup")


def test_release_to_a_router_that_is_down_times_out_with_its_name(engine):
    with pytest.raises(TrafficError, match="group g0: could not rejoin"):
        release(config_for(engine, ["http://127.0.0.1:9"]), ENGINE_KEY, CONTROL_KEY, 0.5, poll=0.1)


def test_the_cli_reads_keys_from_the_env_file(tmp_path, sglang_router, engine, capsys):
    cfg = config_for(engine, [sglang_router.url])
    (tmp_path / "g0.json").write_text(cfg.model_dump_json())
    env = tmp_path / "g0.env"
    env.write_text(f"VLLM_API_KEY='{ENGINE_KEY}'\nVLLM_FLEET_ROUTER_CONTROL_KEY='{CONTROL_KEY}'\n")
    argv = [str(tmp_path / "g0.json"), "--env-file", str(env), "--timeout", "20"]
    assert main(["traffic", "release", *argv]) == 0
    assert engine.url in listed(sglang_router.url)
    assert main(["traffic", "drain", *argv, "--reason", "test"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert json.loads(out[-1])["left"] == [sglang_router.url]
    assert json.loads(out[-1])["idle"] is True
    assert engine.url not in listed(sglang_router.url)
    assert CONTROL_KEY not in "".join(out)


def test_a_held_engine_does_not_join_when_it_becomes_ready(sglang_router, engine):
    cfg = config_for(engine, [sglang_router.url])
    membership = Membership(cfg, ENGINE_KEY, CONTROL_KEY)
    hold.hold("g0", "upgrade")
    assert admit(cfg, membership) == ", held out of the routers"
    assert engine.url not in listed(sglang_router.url)
    hold.release("g0")
    assert admit(cfg, membership) == ""
    wait_until(lambda: engine.url in listed(sglang_router.url), timeout=15, what="the join")
    membership.leave()
    assert engine.url not in listed(sglang_router.url)


def test_drain_refuses_when_too_few_peers_serve_and_changes_nothing(sglang_router, engine):
    join(sglang_router.url, engine)
    with running_engine() as peer:
        join(sglang_router.url, peer)
        cfg = config_for(engine, [sglang_router.url])
        with pytest.raises(TrafficError) as refused:
            drain(cfg, CONTROL_KEY, 5, "upgrade", min_peers=2)
        assert str(refused.value) == (
            f"not draining group g0: router {sglang_router.url} serves fake-model on 1 other "
            f"engine(s) ({peer.url}), and at least 2 must keep serving"
        )
        assert engine.url in listed(sglang_router.url)
        assert not hold.is_held("g0")
        # One peer serving is enough for min_peers=1.
        assert drain(cfg, CONTROL_KEY, 10, "upgrade", min_peers=1, poll=0.1).idle
        drain(config_for(peer, [sglang_router.url]), CONTROL_KEY, 10, "cleanup", poll=0.1)


def test_an_unhealthy_peer_does_not_count(sglang_router, engine):
    join(sglang_router.url, engine)
    with running_engine() as peer:
        join(sglang_router.url, peer)
        peer.healthy = False
        client = router_client(RouterTarget(impl="sglang", url=sglang_router.url), CONTROL_KEY)
        wait_until(
            lambda: peer.url not in client.serving("fake-model"), timeout=15, what="ejection"
        )
        assert engine.url in client.serving("fake-model")
        assert client.serving("another-model") == []
        with pytest.raises(TrafficError, match="on 0 other engine"):
            drain(config_for(engine, [sglang_router.url]), CONTROL_KEY, 5, "upgrade", min_peers=1)
        drain(config_for(peer, [sglang_router.url]), CONTROL_KEY, 10, "cleanup", poll=0.1)
        drain(config_for(engine, [sglang_router.url]), CONTROL_KEY, 10, "cleanup", poll=0.1)


def write_group(tmp_path, cfg: EngineConfig, *, old_env_key: bool = False) -> tuple[str, str]:
    """The group's settings and env file as the role writes them, and the root-only control
    key file; an older env file still held the control key itself."""
    (tmp_path / "g0.json").write_text(
        cfg.model_copy(update={"leave_grace_seconds": 0}).model_dump_json()
    )
    env = f"VLLM_API_KEY={ENGINE_KEY}\n"
    control = tmp_path / "router-control.env"
    if old_env_key:
        env += f"VLLM_FLEET_ROUTER_CONTROL_KEY={CONTROL_KEY}\n"
    else:
        control.write_text(f"VLLM_FLEET_ROUTER_CONTROL_KEY={CONTROL_KEY}\n")
    (tmp_path / "g0.env").write_text(env)
    return str(tmp_path / "g0.json"), str(control)


@pytest.mark.parametrize("old_env_key", [False, True])
def test_root_helpers_join_a_ready_group_and_leave_it_with_the_root_only_key(
    tmp_path, sglang_router, engine, old_env_key
):
    config, control = write_group(
        tmp_path, config_for(engine, [sglang_router.url]), old_env_key=old_env_key
    )
    assert main(["engine-join", config, "--control-key-file", control]) == 0
    wait_until(lambda: engine.url in listed(sglang_router.url), timeout=15, what="the join")
    assert main(["engine-leave", config, "--control-key-file", control]) == 0
    assert engine.url not in listed(sglang_router.url)


def test_the_join_helper_respects_a_hold_and_never_fails_the_unit(tmp_path, sglang_router, engine):
    config, control = write_group(tmp_path, config_for(engine, [sglang_router.url]))
    hold.hold("g0", "upgrade")
    assert main(["engine-join", config, "--control-key-file", control]) == 0
    assert engine.url not in listed(sglang_router.url)
    # No key at all (a host whose role has not written it yet): nothing joined, still 0.
    hold.release("g0")
    (tmp_path / "router-control.env").unlink()
    assert main(["engine-join", config, "--control-key-file", control]) == 0
    assert engine.url not in listed(sglang_router.url)
    # A router that is down is the watchdog's to retry: the unit still starts.
    down, control = write_group(tmp_path, config_for(engine, ["http://127.0.0.1:9"]))
    assert main(["engine-join", down, "--control-key-file", control]) == 0
