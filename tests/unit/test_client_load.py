"""The lab's client load: a client holding two keys rides through a client-key cut-over."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from vllm_fleet.lab.client_load import ClientLoad


def completion(text: str, finish_reason: str | None) -> dict[str, object]:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    return {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
            "choices": [choice]}  # fmt: skip


class Router(BaseHTTPRequestHandler):
    """Accepts one client key at a time (sglang-router's), answering plain and streamed
    completions."""

    key = "old-client-key"

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.headers.get("Authorization") != f"Bearer {Router.key}":
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if body.get("stream"):
            # vLLM's chunks: the last carries the finish reason, then [DONE].
            chunks = [completion("a", None), completion("b", "length")]
            payload = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
            payload += b"data: [DONE]\n\n"
            content_type = "text/event-stream"
        else:
            payload = json.dumps(completion("red", "length")).encode()
            content_type = "application/json"
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def router() -> Iterator[str]:
    Router.key = "old-client-key"
    server = ThreadingHTTPServer(("127.0.0.1", 0), Router)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def wait_for(condition, guard: float = 300) -> None:
    """Until ``condition()``; the guard only stops a hang, it sizes nothing."""
    deadline = time.monotonic() + guard
    while not condition():
        assert time.monotonic() < deadline, "the load stopped making requests"
        time.sleep(0.01)


def run_through_cutover(url: str, other_key: str | None) -> tuple[ClientLoad, float]:
    """The load, and when the router switched keys (monotonic). With the other key, the load
    runs until each of its three clients has met the new key (one may be between requests
    for a while when the cut comes)."""
    load = ClientLoad(url, "old-client-key", "m", plain=2, streams=1, other_key=other_key)
    clients = 3 if other_key else 0
    with load:
        wait_for(lambda: load.stats.plain_ok >= 5 and load.stats.streams_ok >= 1)
        cut = time.monotonic()
        Router.key = "new-client-key"  # the router restarted with the new key
        wait_for(
            lambda: (
                len(after(load, cut, "plain")) >= 10
                and after(load, cut, "stream")
                and load.stats.key_switches >= clients
            )
        )
    return load, cut


def after(load: ClientLoad, cut: float, kind: str) -> list:
    return [r for r in load.stats.requests if r.kind == kind and r.started > cut]


def test_a_client_holding_both_keys_follows_the_router_to_the_new_one(router):
    load, cut = run_through_cutover(router, "new-client-key")
    stats = load.stats
    assert stats.plain_failed == 0 and stats.streams_cut == stats.streams_refused == 0
    assert all(r.ok for r in after(load, cut, "plain") + after(load, cut, "stream"))
    # Each of the three clients switched once, on its first 401.
    assert stats.key_switches == 3


def test_a_client_with_one_key_is_refused_after_the_cutover(router):
    load, cut = run_through_cutover(router, None)
    assert not any(r.ok for r in after(load, cut, "plain") + after(load, cut, "stream"))
    assert load.stats.key_switches == 0
    assert all(f.startswith("HTTP 401") for f in load.stats.failures)


class Flaky(Router):
    """Answers every other plain request 503 (the SDK retries it), and cuts every stream
    after its first chunk: the connection closes before the finish reason."""

    calls = 0

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.write(b"data: " + json.dumps(completion("a", None)).encode() + b"\n\n")
            self.wfile.flush()
            self.close_connection = True
            return
        Flaky.calls += 1
        if Flaky.calls % 2:
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        payload = json.dumps(completion("red", "length")).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture
def flaky() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize("retries", [0, 2])
def test_the_sdk_retries_a_503_only_when_asked_and_a_cut_stream_is_counted_as_cut(flaky, retries):
    load = ClientLoad(flaky, "k", "m", plain=1, streams=1, retries=retries)
    with load:
        wait_for(lambda: len(load.stats.requests) >= 6 and load.stats.streams_cut >= 1)
    stats = load.stats
    assert stats.streams_ok == 0 and stats.streams_refused == 0 and stats.streams_cut >= 1
    if retries:
        assert stats.plain_failed == 0 and stats.plain_retried >= 1, stats.line()
    else:
        assert stats.plain_failed >= 1 and stats.plain_retried == 0, stats.line()
        assert all(f.startswith("HTTP 503") for f in stats.failures)


def test_nothing_listening_is_refused_not_cut():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    load = ClientLoad(f"http://127.0.0.1:{port}", "k", "m", plain=1, streams=1)
    with load:
        wait_for(lambda: load.stats.streams_refused >= 2 and load.stats.plain_failed >= 2)
    assert load.stats.streams_cut == load.stats.streams_ok == load.stats.plain_ok == 0
    assert all("APIConnectionError" in f for f in load.stats.failures)
