"""A bounded client load through the router while a fault is injected.

Non-streaming requests must all succeed (the router retries them on another engine);
a stream that already started on an engine that dies cannot be retried by either router,
so cut streams are counted separately. With ``retries`` the non-streaming clients retry a
refused connection or a 502/503/504 as the OpenAI SDK does by default (2 retries, backoff
from 0.5 s): the figure for faults no router can retry, such as the router itself dying.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class Request:
    """One client request (a non-streaming one with its retries), on the monotonic clock."""

    kind: str  # "plain" or "stream"
    started: float
    ended: float
    ok: bool


@dataclass
class LoadStats:
    plain_ok: int = 0
    plain_failed: int = 0
    plain_retried: int = 0  # succeeded, but only after a retry
    streams_ok: int = 0
    streams_cut: int = 0  # started, then broken off before [DONE]
    streams_refused: int = 0  # no response at all (nothing listening, connection reset)
    key_switches: int = 0  # 401s answered by retrying with the client's other key
    plain_seconds: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)

    def in_flight(self, at: float, kind: str | None = None) -> int:
        """Requests (of ``kind``) that had started and not yet ended at ``at``."""
        return sum(
            r.started <= at < r.ended for r in self.requests if kind is None or r.kind == kind
        )

    def failed_started_after(self, at: float) -> list[Request]:
        return [r for r in self.requests if r.started >= at and not r.ok]

    def served_before_and_after(self, at: float) -> bool:
        """The load overlapped ``at``: requests served before it and after it."""
        served = [r for r in self.requests if r.ok]
        return any(r.ended < at for r in served) and any(r.started > at for r in served)

    def line(self) -> str:
        worst = max(self.plain_seconds, default=0.0)
        retried = f", {self.plain_retried} after a client retry" if self.plain_retried else ""
        return (
            f"non-streaming {self.plain_ok} ok{retried} / {self.plain_failed} failed "
            f"(slowest {worst:.1f} s); streams {self.streams_ok} ok / {self.streams_cut} cut"
            f" / {self.streams_refused} refused"
        )


class ClientLoad:
    """``plain`` threads of short completions and ``streams`` threads of streamed ones."""

    def __init__(
        self,
        base_url: str,
        key: str,
        model: str,
        plain: int = 3,
        streams: int = 1,
        *,
        retries: int = 0,
        other_key: str | None = None,
    ) -> None:
        self.base_url = base_url
        self.retries = retries
        self.headers = {"Authorization": f"Bearer {key}"}
        # A client mid key rotation holds both keys and answers a 401 by retrying with the
        # other one (sglang-router takes one client key: its restart switches it).
        self.keys = [key] if other_key is None else [key, other_key]
        self.model = model
        self.stats = LoadStats()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._plain_loop, args=(i,), daemon=True) for i in range(plain)
        ] + [
            threading.Thread(target=self._stream_loop, args=(i,), daemon=True)
            for i in range(streams)
        ]

    def __enter__(self) -> ClientLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> LoadStats:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)
        return self.stats

    def _body(self, worker: int, n: int, stream: bool) -> dict[str, object]:
        return {
            "model": self.model,
            "prompt": f"Client {worker}, request {n}: list three colours.",
            "max_tokens": 32 if stream else 8,
            "temperature": 0,
            "stream": stream,
        }

    def _plain_loop(self, worker: int) -> None:
        with httpx.Client(base_url=self.base_url, headers=self.headers, timeout=90) as client:
            n = 0
            while not self._stop.is_set():
                n += 1
                started = time.monotonic()
                attempt = 0
                while True:
                    ok, detail, retryable = self._attempt(client, worker, n)
                    if ok or not retryable or attempt >= self.retries:
                        break
                    time.sleep(min(0.5 * 2**attempt, 8.0))
                    attempt += 1
                with self._lock:
                    ended = time.monotonic()
                    self.stats.requests.append(Request("plain", started, ended, ok))
                    self.stats.plain_seconds.append(ended - started)
                    if ok:
                        self.stats.plain_ok += 1
                        self.stats.plain_retried += attempt > 0
                    else:
                        self.stats.plain_failed += 1
                        self.stats.failures.append(detail)
                if not ok:
                    time.sleep(0.2)  # a client backs off rather than spin on a refusal

    def _attempt(self, client: httpx.Client, worker: int, n: int) -> tuple[bool, str, bool]:
        """One try: (ok, what went wrong, whether a client would retry it)."""
        try:
            response = client.post("/v1/completions", json=self._body(worker, n, False))
            if response.status_code == 401 and self._switch_key(client):
                response = client.post("/v1/completions", json=self._body(worker, n, False))
        except httpx.TransportError as err:
            return False, f"{type(err).__name__}: {err}", True
        ok = response.status_code == 200 and bool(response.json().get("choices"))
        detail = f"HTTP {response.status_code}: {response.text[:160]}"
        return ok, detail, response.status_code in (502, 503, 504)

    def _stream_loop(self, worker: int) -> None:
        with httpx.Client(base_url=self.base_url, headers=self.headers, timeout=90) as client:
            n = 0
            while not self._stop.is_set():
                n += 1
                started = time.monotonic()
                attempt = 0
                while True:
                    done, answered = self._stream_attempt(client, worker, n)
                    # Like the SDK: a request that got no response is retried; a stream
                    # broken off after it started is not (its tokens were delivered).
                    if done or answered or attempt >= self.retries:
                        break
                    time.sleep(min(0.5 * 2**attempt, 8.0))
                    attempt += 1
                with self._lock:
                    self.stats.requests.append(Request("stream", started, time.monotonic(), done))
                    if done:
                        self.stats.streams_ok += 1
                    elif answered:
                        self.stats.streams_cut += 1
                    else:
                        self.stats.streams_refused += 1
                if not done:
                    time.sleep(0.2)

    def _stream_attempt(
        self, client: httpx.Client, worker: int, n: int, *, switched: bool = False
    ) -> tuple[bool, bool]:
        """One try: (ended with [DONE], a response had started)."""
        done = answered = refused = False
        try:
            body = self._body(100 + worker, n, True)
            with client.stream("POST", "/v1/completions", json=body) as response:
                refused = response.status_code == 401
                answered = not refused
                for line in response.iter_lines() if answered else ():
                    if line.strip() == "data: [DONE]":
                        done = True
        except httpx.HTTPError:
            done = False
        if refused and not switched and self._switch_key(client):
            return self._stream_attempt(client, worker, n, switched=True)
        return done, answered or refused

    def _switch_key(self, client: httpx.Client) -> bool:
        """Present the other key from now on; False when there is no other key."""
        presented = client.headers.get("Authorization")
        others = [k for k in self.keys if f"Bearer {k}" != presented]
        if not others:
            return False
        client.headers["Authorization"] = f"Bearer {others[0]}"
        with self._lock:
            self.stats.key_switches += 1
        return True
