"""The host's ``vllm-fleet smoke`` runs verify's smoke (one implementation) on one endpoint."""

from __future__ import annotations

import asyncio

from tests.fixtures.openai_fixture_server import FixtureOptions, FixtureServer
from vllm_fleet.verify.smoke import report_lines, smoke_endpoint

KEY = "fixture-engine-key"


def smoke(server: FixtureServer, key: str = KEY):
    return asyncio.run(smoke_endpoint(server.url, key, "smollm2", timeout=10.0))


def test_an_honest_engine_passes_every_item():
    with FixtureServer(FixtureOptions(api_key=KEY)) as server:
        result = smoke(server)
    names = [item["name"] for item in result.details["items"]]
    assert names == [
        "health", "models", "chat", "completion", "stream", "auth: no key", "auth: wrong key",
    ]  # fmt: skip
    assert result.status == "pass", report_lines(result)
    lines = report_lines(result)
    assert lines[0].startswith(f"smoke {server.url}: PASS (7/7 ok")
    assert all(line.startswith("  [ok] ") for line in lines[1:])


def test_an_engine_that_serves_without_a_key_fails_and_says_so():
    with FixtureServer(FixtureOptions(api_key=KEY, enforce_auth=False)) as server:
        result = smoke(server)
    assert result.status == "fail"
    failed = [line for line in report_lines(result) if line.startswith("  [FAIL] ")]
    assert [line.split(":")[0] for line in failed] == ["  [FAIL] auth", "  [FAIL] auth"]


def test_a_wrong_key_fails_the_api_items_not_only_auth():
    with FixtureServer(FixtureOptions(api_key=KEY)) as server:
        result = smoke(server, key="not-the-engine-key")
    failed = {item["name"] for item in result.details["items"] if not item["ok"]}
    assert {"models", "chat", "completion", "stream"} <= failed


def test_an_unreachable_engine_fails_health_with_the_reason():
    with FixtureServer(FixtureOptions(api_key=KEY)) as server:
        url = server.url
    result = asyncio.run(smoke_endpoint(url, KEY, "smollm2", timeout=2.0))
    assert result.status == "fail"
    health = result.details["items"][0]
    assert health["name"] == "health" and health["detail"].startswith("unreachable (")
