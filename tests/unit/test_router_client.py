"""router_client against the real routers (subprocesses on 127.0.0.1) and a fake engine."""

from __future__ import annotations

import httpx
import pytest
from pydantic import ValidationError

from tests.unit.router_fixtures import (
    CLIENT_KEY,
    CONTROL_KEY,
    ENGINE_KEY,
    FakeEngine,
    RouterProcess,
    free_port,
    running_engine,
    running_router,
    sglang_listing,
    start_router,
    wait_until,
)
from vllm_fleet.router.client import (
    RouterError,
    RouterTarget,
    RouterUnreachable,
    identify,
    router_client,
)


@pytest.fixture(scope="module")
def sglang_router(tmp_path_factory):
    log = tmp_path_factory.mktemp("sglang") / "router.log"
    with running_router("sglang", log) as router:
        yield router


@pytest.fixture(scope="module")
def vllm_router(tmp_path_factory):
    log = tmp_path_factory.mktemp("vllm") / "router.log"
    with running_router("vllm", log) as router:
        yield router


@pytest.fixture
def engine():
    with running_engine() as served:
        yield served


def sglang(router: RouterProcess, key: str | None = CONTROL_KEY):
    return router_client(RouterTarget(impl="sglang", url=router.url), key)


def vllm(router: RouterProcess):
    return router_client(RouterTarget(impl="vllm", url=router.url), None)


def listed_urls(router: RouterProcess) -> list[str]:
    return [str(w["url"]) for w in sglang_listing(router.url)]


def test_sglang_join_adds_once_with_the_engine_key(sglang_router, engine: FakeEngine):
    client = sglang(sglang_router)
    assert client.join(engine.url, ENGINE_KEY, engine.served_name) is True
    wait_until(lambda: engine.url in client.workers(), what="the worker to be listed")
    assert client.join(engine.url, ENGINE_KEY, engine.served_name) is False
    assert client.join(engine.url + "/", ENGINE_KEY, engine.served_name) is False
    assert listed_urls(sglang_router).count(engine.url) == 1
    worker = next(w for w in sglang_listing(sglang_router.url) if w["url"] == engine.url)
    assert worker["model_id"] == engine.served_name
    # Routed traffic reaches the engine with the engine's key, not the client's.
    response = httpx.post(
        f"{sglang_router.url}/v1/completions",
        headers={"Authorization": f"Bearer {CLIENT_KEY}"},
        json={"model": engine.served_name, "prompt": "x", "max_tokens": 1},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    assert engine.completions[-1] == f"Bearer {ENGINE_KEY}"


def test_sglang_leave_removes_and_unknown_is_a_no_op(sglang_router, engine: FakeEngine):
    client = sglang(sglang_router)
    client.join(engine.url, ENGINE_KEY, engine.served_name)
    wait_until(lambda: engine.url in client.workers(), what="the worker to be listed")
    assert client.leave(engine.url) is True
    wait_until(lambda: engine.url not in listed_urls(sglang_router), what="the removal")
    assert client.leave(engine.url) is False
    assert client.leave("http://127.0.0.1:1") is False


def test_sglang_repeated_join_while_the_add_is_pending_queues_nothing(sglang_router):
    # Nothing listens there: the router keeps retrying the add in the background.
    dead = f"http://127.0.0.1:{free_port()}"
    client = sglang(sglang_router)
    assert client.join(dead, ENGINE_KEY, "m") is True
    assert dead not in client.workers()
    assert client.join(dead, ENGINE_KEY, "m") is False
    # A fresh client (a restarted watchdog) cannot know the pending add and queues again.
    assert sglang(sglang_router).join(dead, ENGINE_KEY, "m") is True
    assert dead not in listed_urls(sglang_router)


@pytest.mark.parametrize("key", ["wrong-key", None, CLIENT_KEY])
def test_sglang_without_the_control_key_is_refused(sglang_router, key):
    client = sglang(sglang_router, key)
    with pytest.raises(RouterError) as raised:
        client.workers()
    message = str(raised.value)
    assert sglang_router.url in message
    assert "list workers" in message
    assert "HTTP 401" in message
    assert CONTROL_KEY not in message
    assert not key or key not in message
    with pytest.raises(RouterError, match="HTTP 401"):
        client.join("http://127.0.0.1:1", ENGINE_KEY, "m")


def test_unreachable_router_is_a_router_error():
    target = RouterTarget(impl="sglang", url=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(RouterError, match=r"list workers failed: ConnectError"):
        router_client(target, CONTROL_KEY, timeout=1).workers()


def test_vllm_join_and_leave(vllm_router, engine: FakeEngine):
    client = vllm(vllm_router)
    assert client.join(engine.url, ENGINE_KEY, engine.served_name) is True
    assert client.workers().count(engine.url) == 1
    assert client.join(engine.url + "/", ENGINE_KEY, engine.served_name) is False
    assert client.workers().count(engine.url) == 1
    assert client.leave(engine.url) is True
    assert engine.url not in client.workers()
    assert client.leave(engine.url) is False


def test_vllm_leave_uses_the_registered_spelling(vllm_router, engine: FakeEngine):
    # Registered by someone else with a trailing slash: removing the bare URL would be a no-op.
    response = httpx.post(
        f"{vllm_router.url}/add_worker", params={"url": engine.url + "/"}, timeout=10
    )
    assert response.status_code == 200, response.text
    client = vllm(vllm_router)
    assert client.workers().count(engine.url) == 1
    assert client.leave(engine.url) is True
    assert httpx.get(f"{vllm_router.url}/list_workers").json()["urls"] == []


def test_vllm_join_of_an_unhealthy_engine_is_a_router_error(vllm_router):
    with running_engine(FakeEngine(healthy=False)) as sick:
        client = router_client(RouterTarget(impl="vllm", url=vllm_router.url), None, timeout=15)
        with pytest.raises(RouterError, match=r"add worker .* HTTP 400"):
            client.join(sick.url, ENGINE_KEY, sick.served_name)
        assert sick.url not in client.workers()


def test_router_target_forbids_unknown_fields():
    with pytest.raises(ValidationError):
        RouterTarget.model_validate({"impl": "sglang", "url": "http://r:30000", "key": "x"})
    with pytest.raises(ValidationError):
        RouterTarget.model_validate({"impl": "nginx", "url": "http://r:30000"})


def test_a_router_replaced_by_the_other_implementation_is_followed(tmp_path, engine: FakeEngine):
    """fleet_router.impl changes: each router restarts as the other implementation at the
    same address before the engine hosts' settings say so. The client asks the router what
    it is after a failure, and repeats the operation with the right client."""
    port = free_port()
    client = router_client(RouterTarget(impl="sglang", url=f"http://127.0.0.1:{port}"), CONTROL_KEY)
    for impl in ("vllm", "sglang", "vllm"):
        router = start_router(impl, tmp_path / f"{impl}.log", port=port)
        try:
            assert identify(router.url) == impl
            assert client.join(engine.url, ENGINE_KEY, engine.served_name) is True
            wait_until(lambda: engine.url in client.healthy(), what=f"the worker on {impl}")
            # What a drain checks before it moves a group: its model's other engines serve.
            assert client.serving(engine.served_name) == [engine.url]
            assert client.leave(engine.url) is True
            # A router may apply the removal after it answers (seen under load).
            wait_until(lambda: engine.url not in client.workers(), what=f"the removal on {impl}")
            # vllm-router answers sglang's join (POST /workers) too; its listing has no
            # worker ids, which the removal needs: by then the client has asked.
            assert client.impl == impl
        finally:
            router.stop()


def test_a_refusal_is_not_taken_for_the_other_implementation(sglang_router):
    """A wrong control key stays a refusal: the router is sglang, so nothing is retried."""
    client = sglang(sglang_router, "not-the-control-key-at-all")
    with pytest.raises(RouterError, match="HTTP 401"):
        client.workers()
    assert client.impl == "sglang"


def test_an_unreachable_router_is_not_asked_again():
    """No answer says nothing of which router it is; asking would wait once more."""
    target = RouterTarget(impl="vllm", url=f"http://127.0.0.1:{free_port()}")
    client = router_client(target, None, timeout=1)
    with pytest.raises(RouterUnreachable):
        client.workers()
    assert client.impl == "vllm"


def test_identify_says_nothing_of_an_address_where_no_router_answers():
    assert identify(f"http://127.0.0.1:{free_port()}", timeout=1) is None
