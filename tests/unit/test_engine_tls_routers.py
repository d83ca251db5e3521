"""The hop router -> engine over HTTPS, for real: both pinned routers (sglang-router 0.3.2,
vllm-router 0.1.17) started with the router unit's SSL_CERT_FILE (the fleet CA), an engine
serving HTTPS with a certificate from that CA (as vLLM does with --ssl-certfile/--ssl-keyfile),
joined by the engine hosts' own client; and the engine host's own callers (the watchdog's
probe) trusting the CA alone.

Why SSL_CERT_FILE and not sglang-router's ``ca_cert_paths``: that setting reaches only the
router's proxy client, and adds the CA to the system's; its health checker keeps its own
client, which marks an engine that only the fleet CA vouches for unhealthy within one check
(the test below shows it). SSL_CERT_FILE is what both routers' clients read; beside it they
read a CA directory (SSL_CERT_DIR, else the system's), so the unit names an empty one.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.tls import host_certificate
from tests.unit.router_fixtures import (
    CLIENT_KEY,
    CONTROL_KEY,
    ENGINE_KEY,
    FakeEngine,
    RouterProcess,
    running_engine,
    running_router,
    wait_until,
)
from vllm_fleet.router.client import RouterError, RouterTarget, router_client
from vllm_fleet.tls.ca import CA_CERT, init_ca, load_ca
from vllm_fleet.watchdog.groups import GroupSpec, probe_client

HEALTH_INTERVAL = 1  # seconds, the routers' health_check_interval_secs in router_fixtures


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The fleet CA, an engine certificate from it, and one from another CA."""
    work = tmp_path_factory.mktemp("engine-tls")
    init_ca(work / "fleet-ca")
    # Another name too: OpenSSL looks a CA up by its subject, so a namesake would only ever
    # be refused for the wrong reason (the fleet CA's key does not verify it).
    init_ca(work / "rogue-ca", name="another CA")
    # What a host's system CA directory would be to the router: one holding the other CA.
    system = work / "system-cas"
    system.mkdir()
    shutil.copy(work / "rogue-ca" / CA_CERT, system / "another-ca.pem")
    subprocess.run(["openssl", "rehash", str(system)], check=True)
    (work / "no-other-ca").mkdir()
    cert, key = host_certificate(
        load_ca(work / "fleet-ca"), work / "engine", ["engine01"], ["127.0.0.1"]
    )
    rogue_cert, rogue_key = host_certificate(
        load_ca(work / "rogue-ca"), work / "rogue", ["engine01"], ["127.0.0.1"]
    )
    return {
        "ca": work / "fleet-ca" / CA_CERT,
        "no_other_ca": work / "no-other-ca",
        "system_cas": system,
        "cert": cert,
        "key": key,
        "rogue_cert": rogue_cert,
        "rogue_key": rogue_key,
    }


@contextlib.contextmanager
def router_trusting(
    impl: str, log: Path, ca: Path, ca_dir: Path, **extra: object
) -> Iterator[RouterProcess]:
    """A router as its unit starts it with a fleet CA: SSL_CERT_FILE names the CA, and
    SSL_CERT_DIR the directory read beside it (the unit's: an empty one)."""
    settings: dict[str, object] = {"health_failure_threshold": 1, **extra}
    env = {"SSL_CERT_FILE": str(ca), "SSL_CERT_DIR": str(ca_dir)}
    with running_router(impl, log, extra=settings, env=env) as router:
        yield router


def join(router: RouterProcess, engine: FakeEngine) -> bool:
    """What the engine host's watchdog does; vllm-router's worker endpoints take no key."""
    key = CONTROL_KEY if router.impl == "sglang" else None
    client = router_client(RouterTarget(impl=router.impl, url=router.url), key, timeout=15)
    try:
        return client.join(engine.url, ENGINE_KEY, engine.served_name)
    except RouterError:
        return False
    finally:
        client.close()


def complete(router: RouterProcess, engine: FakeEngine) -> httpx.Response:
    # sglang-router takes the client key and presents the engine key itself; vllm-router
    # passes the client's Authorization through.
    key = CLIENT_KEY if router.impl == "sglang" else ENGINE_KEY
    return httpx.post(
        f"{router.url}/v1/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": engine.served_name, "prompt": "x", "max_tokens": 1},
        timeout=15,
    )


def stays_routable(router: RouterProcess, engine: FakeEngine, checks: int) -> list[int]:
    """Status of one request a health interval apart, ``checks`` times: a health checker that
    cannot verify the engine takes it out of rotation at its first check."""
    statuses = []
    for _ in range(checks):
        statuses.append(complete(router, engine).status_code)
        time.sleep(HEALTH_INTERVAL)
    return statuses


@pytest.mark.parametrize("impl", ["sglang", "vllm"])
def test_a_router_trusting_the_fleet_ca_routes_to_an_engine_on_https(
    impl: str, pki: dict[str, Path], tmp_path: Path
) -> None:
    with (
        running_engine(tls=(pki["cert"], pki["key"])) as engine,
        router_trusting(impl, tmp_path / "router.log", pki["ca"], pki["no_other_ca"]) as router,
    ):
        assert engine.url.startswith("https://")
        assert join(router, engine) is True
        wait_until(lambda: complete(router, engine).status_code == 200, timeout=30, what="routing")
        # Through several of the router's health checks: each one verifies the engine too.
        assert stays_routable(router, engine, checks=4) == [200] * 4
        assert engine.completions and all(a == f"Bearer {ENGINE_KEY}" for a in engine.completions)


def refused(router: RouterProcess, engine: FakeEngine) -> bool:
    """The engine never gets a request: refused at join, or never healthy."""
    join(router, engine)
    deadline = time.monotonic() + 4 * HEALTH_INTERVAL
    while time.monotonic() < deadline:
        if complete(router, engine).status_code == 200:
            return False
        time.sleep(HEALTH_INTERVAL / 2)
    return engine.completions == []


@pytest.mark.parametrize("impl", ["sglang", "vllm"])
def test_a_router_refuses_an_engine_whose_certificate_is_not_from_the_fleet_ca(
    impl: str, pki: dict[str, Path], tmp_path: Path
) -> None:
    with (
        running_engine(tls=(pki["rogue_cert"], pki["rogue_key"])) as engine,
        router_trusting(impl, tmp_path / "router.log", pki["ca"], pki["no_other_ca"]) as router,
    ):
        # No prompt and no engine key ever cross to it.
        assert refused(router, engine)


@pytest.mark.parametrize("impl", ["sglang", "vllm"])
def test_why_the_unit_names_an_empty_ca_directory(
    impl: str, pki: dict[str, Path], tmp_path: Path
) -> None:
    """The routers read a CA directory beside SSL_CERT_FILE (the system's, when the unit names
    none): a CA there would vouch for engines too."""
    with (
        running_engine(tls=(pki["rogue_cert"], pki["rogue_key"])) as engine,
        router_trusting(impl, tmp_path / "router.log", pki["ca"], pki["system_cas"]) as router,
    ):
        assert not refused(router, engine)


def test_sglang_routers_ca_setting_alone_leaves_the_engine_unhealthy(
    pki: dict[str, Path], tmp_path: Path
) -> None:
    """Why the unit sets SSL_CERT_FILE: ca_cert_paths reaches the proxy, not the health checks."""
    with (
        running_engine(tls=(pki["cert"], pki["key"])) as engine,
        running_router(
            "sglang",
            tmp_path / "router.log",
            extra={"health_failure_threshold": 1, "ca_cert_paths": [str(pki["ca"])]},
        ) as router,
    ):
        assert join(router, engine) is True
        wait_until(
            lambda: complete(router, engine).status_code == 503,
            timeout=10 * HEALTH_INTERVAL,
            what="the health checker to refuse the engine",
        )


def test_the_watchdogs_probe_trusts_the_fleet_ca_alone(pki: dict[str, Path]) -> None:
    with running_engine(tls=(pki["cert"], pki["key"])) as engine:
        spec = GroupSpec(
            group="g0",
            unit="vllm-engine@g0.service",
            probe_url=engine.url,
            advertise_url=engine.url,
            served_name=engine.served_name,
            api_key=ENGINE_KEY,
            ca_file=str(pki["ca"]),
        )
        with probe_client(spec, timeout=5) as client:
            assert client.get(f"{engine.url}/health").status_code == 200
    with running_engine(tls=(pki["rogue_cert"], pki["rogue_key"])) as rogue:
        spec = GroupSpec(
            group="g0",
            unit="vllm-engine@g0.service",
            probe_url=rogue.url,
            advertise_url=rogue.url,
            served_name=rogue.served_name,
            api_key=ENGINE_KEY,
            ca_file=str(pki["ca"]),
        )
        with (
            probe_client(spec, timeout=5) as client,
            pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"),
        ):
            client.get(f"{rogue.url}/health")
