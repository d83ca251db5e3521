"""The router's client port over TLS, for real: sglang-router started by the fleet's own
launcher (vllm_fleet.router.launch) from a unit's credentials directory, holding the host's
certificate and key from a fleet CA; the engine hosts' client (joins, leaves, the watchdog's
reconciliation) and verify's trust (vllm_fleet.tls.trust) against it."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
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
    free_port,
    running_engine,
    wait_until,
)
from vllm_fleet.router.client import RouterTarget, RouterUnreachable, router_client
from vllm_fleet.router.launch import CLIENT_KEY_ENV
from vllm_fleet.tls.ca import CA_CERT, init_ca, load_ca
from vllm_fleet.tls.trust import TrustError, fleet_trust


def credentials(directory: Path, ca_dir: Path) -> Path:
    """What the unit's LoadCredential= lines hand the router (roles/router)."""
    directory.mkdir(parents=True)
    (directory / "router.env").write_text(f"{CLIENT_KEY_ENV}={CLIENT_KEY}\n")
    (directory / "router-control-keys.json").write_text(
        json.dumps([{"id": "operator", "key": CONTROL_KEY}])
    )
    cert, key = host_certificate(load_ca(ca_dir), directory / "host", ["router01"], ["127.0.0.1"])
    (directory / "tls.crt").write_bytes(cert.read_bytes())
    (directory / "tls.key").write_bytes(key.read_bytes())
    return directory


def launch(tmp_path: Path, creds: Path, port: int) -> subprocess.Popen[bytes]:
    settings = {
        "impl": "sglang",
        "package": "sglang_router",
        "router_args": {
            "host": "127.0.0.1",
            "port": port,
            "prometheus_host": "127.0.0.1",
            "prometheus_port": free_port(),
            "health_check_interval_secs": 1,
        },
        "tls": {"cert": "tls.crt", "key": "tls.key", "cert_sha256": "0" * 64},
    }
    (tmp_path / "router.json").write_text(json.dumps(settings))
    env = {**os.environ, "CREDENTIALS_DIRECTORY": str(creds)}
    with (tmp_path / "router.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "vllm_fleet.router.launch", str(tmp_path / "router.json")],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, Path]]:
    """(https URL of a real router, the fleet CA's certificate, another CA's certificate)."""
    work = tmp_path_factory.mktemp("router-tls")
    init_ca(work / "fleet-ca")
    init_ca(work / "rogue-ca")
    port = free_port()
    router = launch(work, credentials(work / "creds", work / "fleet-ca"), port)
    url = f"https://127.0.0.1:{port}"
    trust = ssl.create_default_context(cafile=work / "fleet-ca" / CA_CERT)

    def answers() -> bool:
        try:
            return httpx.get(f"{url}/liveness", verify=trust, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(lambda: router.poll() is None and answers(), timeout=30, what=url)
        yield url, work / "fleet-ca" / CA_CERT, work / "rogue-ca" / CA_CERT
    finally:
        router.terminate()
        router.wait(timeout=10)


def test_an_engine_host_joins_and_leaves_over_https_trusting_the_fleet_ca(fleet) -> None:
    url, ca, _ = fleet
    client = router_client(RouterTarget(impl="sglang", url=url, ca_file=str(ca)), CONTROL_KEY)
    engine: FakeEngine
    with running_engine() as engine:
        assert client.join(engine.url, ENGINE_KEY, engine.served_name) is True
        wait_until(lambda: engine.url in client.workers(), what="the worker to be listed")
        # A client's request crosses the same TLS port to the engine.
        answer = httpx.post(
            f"{url}/v1/completions",
            headers={"Authorization": f"Bearer {CLIENT_KEY}"},
            json={"model": engine.served_name, "prompt": "x", "max_tokens": 1},
            verify=fleet_trust(url, str(ca)),
            timeout=10,
        )
        assert answer.status_code == 200, answer.text
        assert client.leave(engine.url) is True
        assert engine.url not in client.workers()
    client.close()


@pytest.mark.parametrize("trusting", ["another CA", "the system's CAs"])
def test_a_client_that_does_not_trust_the_fleet_ca_alone_is_refused_at_the_handshake(
    fleet, trusting: str
) -> None:
    url, _, rogue = fleet
    ca_file = str(rogue) if trusting == "another CA" else None
    client = router_client(RouterTarget(impl="sglang", url=url, ca_file=ca_file), CONTROL_KEY)
    with pytest.raises(RouterUnreachable, match="CERTIFICATE_VERIFY_FAILED") as refused:
        client.workers()
    # The refusal names the router and never the key the client would have sent.
    assert CONTROL_KEY not in str(refused.value)
    client.close()


def test_plain_http_gets_no_answer_on_the_client_port(fleet) -> None:
    url, ca, _ = fleet
    plain = url.replace("https://", "http://")
    client = router_client(RouterTarget(impl="sglang", url=plain, ca_file=str(ca)), CONTROL_KEY)
    with pytest.raises(RouterUnreachable):
        client.workers()
    client.close()


def test_the_launcher_refuses_to_start_without_the_hosts_key(tmp_path: Path) -> None:
    """A unit that lost its LoadCredential=tls.key does not fall back to plain HTTP."""
    init_ca(tmp_path / "ca")
    creds = credentials(tmp_path / "creds", tmp_path / "ca")
    (creds / "tls.key").unlink()
    port = free_port()
    router = launch(tmp_path, creds, port)
    assert router.wait(timeout=30) != 0
    log = (tmp_path / "router.log").read_text()
    assert "tls.key is missing" in log and "refusing to serve plain HTTP" in log
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/liveness", timeout=2)


def test_an_unreadable_fleet_ca_is_named(tmp_path: Path) -> None:
    with pytest.raises(TrustError, match=f"cannot read the fleet CA {tmp_path}/none.crt"):
        fleet_trust("https://router01:30000", str(tmp_path / "none.crt"))
    assert fleet_trust("http://router01:30000", str(tmp_path / "none.crt")) is True
