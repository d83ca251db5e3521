"""Real routers (sglang-router, vllm-router) in subprocesses, and a fake engine to route to.

The fake engine is a real HTTP server on 127.0.0.1 that speaks just enough OpenAI
(/health, /v1/models, /v1/completions); it can be told to fail, hang, reset the connection
of a request it has read (what a killed engine does to requests in flight) or refuse /health.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

CONTROL_KEY = "control-key-for-tests"
CLIENT_KEY = "client-key-for-tests"
ENGINE_KEY = "engine-key-for-tests"

LAUNCHER = """
import json, sys
settings = json.loads(sys.argv[2])
if sys.argv[1] == "sglang":
    from sglang_router.launch_router import launch_router
    from sglang_router.router_args import RouterArgs
    settings["control_plane_api_keys"] = [tuple(k) for k in settings["control_plane_api_keys"]]
else:
    from vllm_router.launch_router import launch_router
    from vllm_router.router_args import RouterArgs
launch_router(RouterArgs(**settings))
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(condition: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what or condition}"
        time.sleep(0.02)


@dataclass
class RouterProcess:
    impl: str
    url: str
    log: Path
    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _answers(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        httpx.get(url, timeout=0.5)
        return True
    return False


def start_router(
    impl: str,
    log: Path,
    port: int | None = None,
    extra: dict[str, object] | None = None,
    env: dict[str, str] | None = None,
) -> RouterProcess:
    """A real router on 127.0.0.1; sglang with a control-plane key and a client key.
    ``env``: variables on top of this process's (the unit's Environment= lines)."""
    port = port or free_port()
    settings: dict[str, object] = {
        "host": "127.0.0.1",
        "port": port,
        "prometheus_host": "127.0.0.1",
        "prometheus_port": free_port(),
        "health_check_interval_secs": 1,
        **(extra or {}),
    }
    if impl == "sglang":
        settings.setdefault("api_key", CLIENT_KEY)
        settings.setdefault("control_plane_api_keys", [["ops", "ops", CONTROL_KEY, "admin"]])
    else:
        settings["worker_startup_timeout_secs"] = 2
        settings["worker_startup_check_interval"] = 1
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, impl, json.dumps(settings)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
    router = RouterProcess(impl, f"http://127.0.0.1:{port}", log, process)
    try:
        wait_until(
            lambda: process.poll() is None and _answers(f"{router.url}/health"),
            timeout=30,
            what=f"{impl} router at {router.url} (log: {log})",
        )
    except BaseException:
        router.stop()
        raise
    return router


@contextlib.contextmanager
def running_router(
    impl: str,
    log: Path,
    extra: dict[str, object] | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[RouterProcess]:
    router = start_router(impl, log, extra=extra, env=env)
    try:
        yield router
    finally:
        router.stop()


@dataclass
class FakeEngine:
    """Behaviour switches the handler reads; ``url`` is set once serving."""

    served_name: str = "fake-model"
    api_key: str = ENGINE_KEY
    mode: str = "ok"  # ok | hang | error | reset
    healthy: bool = True
    url: str = ""
    completions: list[str] = field(default_factory=list)  # Authorization headers seen
    models: list[str] = field(default_factory=list)  # the "model" of each completion request
    running: int = 0  # vllm:num_requests_running on /metrics
    waiting: int = 0  # vllm:num_requests_waiting
    release: threading.Event = field(default_factory=threading.Event)


def _handler(engine: FakeEngine) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def _send(self, status: int, payload: object) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200 if engine.healthy else 503, {})
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": engine.served_name}]})
            elif self.path == "/metrics":
                labels = f'{{model_name="{engine.served_name}",engine="0"}}'
                body = (
                    "# TYPE vllm:num_requests_running gauge\n"
                    f"vllm:num_requests_running{labels} {engine.running}.0\n"
                    "# TYPE vllm:num_requests_waiting gauge\n"
                    f"vllm:num_requests_waiting{labels} {engine.waiting}.0\n"
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            request = json.loads(self.rfile.read(length) or b"{}")
            if self.path != "/v1/completions":
                self._send(404, {"error": "not found"})
                return
            engine.completions.append(self.headers.get("Authorization", ""))
            engine.models.append(str(request.get("model")))
            if self.headers.get("Authorization") != f"Bearer {engine.api_key}":
                self._send(401, {"error": "Unauthorized"})
            elif request.get("model") != engine.served_name:
                # As vLLM answers a name it does not serve (a client, or a watchdog, that
                # still uses the group's previous served name).
                message = f"The model `{request.get('model')}` does not exist."
                self._send(404, {"object": "error", "message": message, "code": 404})
            elif engine.mode == "hang":
                engine.release.wait(timeout=30)
            elif engine.mode == "error":
                self._send(500, {"error": "engine core died"})
            elif engine.mode == "reset":
                # Linger 0: close() sends RST, as the kernel does for a killed process's sockets.
                linger = struct.pack("ii", 1, 0)
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
                self.connection.close()
                self.close_connection = True
            else:
                self._send(
                    200,
                    {
                        "model": request.get("model"),
                        "choices": [{"index": 0, "text": " Paris"}],
                        "usage": {"completion_tokens": 1, "prompt_tokens": 5},
                    },
                )

    return Handler


@contextlib.contextmanager
def running_engine(
    engine: FakeEngine | None = None, tls: tuple[Path, Path] | None = None
) -> Iterator[FakeEngine]:
    """``tls``: (certificate, key) to serve HTTPS with, as vLLM's --ssl-certfile/--ssl-keyfile."""
    engine = engine or FakeEngine()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(engine))
    server.daemon_threads = True
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    scheme = "https" if tls is not None else "http"
    engine.url = f"{scheme}://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield engine
    finally:
        engine.release.set()
        server.shutdown()
        server.server_close()


def sglang_listing(router_url: str) -> list[dict[str, object]]:
    """GET /workers straight from the router, bypassing the client under test."""
    response = httpx.get(
        f"{router_url}/workers",
        headers={"Authorization": f"Bearer {CONTROL_KEY}"},
        timeout=5,
    )
    response.raise_for_status()
    return response.json()["workers"]
