"""A bounded client load through the router while a fault is injected.

Each client is the OpenAI SDK, as the fleet's users run it. Non-streaming requests must all
succeed (the router retries them on another engine); a stream that already started on an
engine that dies cannot be retried by either router, so cut streams are counted separately.
``retries`` is the SDK's ``max_retries``: 0 (each failure counted) unless a row measures
faults no router can retry, such as the router itself dying, where the SDK's default of 2
retries (a refused connection, 408/409/429/5xx, backoff from 0.5 s) is what a client sees.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import httpx2
import openai

T = TypeVar("T")


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
        self.base_url = base_url.rstrip("/") + "/v1"
        self.retries = retries
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

    def _client(self) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.base_url, api_key=self.keys[0], max_retries=self.retries, timeout=90
        )

    def _prompt(self, worker: int, n: int) -> str:
        return f"Client {worker}, request {n}: list three colours."

    def _plain_loop(self, worker: int) -> None:
        client = self._client()
        n = 0
        while not self._stop.is_set():
            n += 1
            started = time.monotonic()
            client, (ok, detail, retries) = self._keyed(client, self._attempt, worker, n)
            with self._lock:
                ended = time.monotonic()
                self.stats.requests.append(Request("plain", started, ended, ok))
                self.stats.plain_seconds.append(ended - started)
                if ok:
                    self.stats.plain_ok += 1
                    self.stats.plain_retried += retries > 0
                else:
                    self.stats.plain_failed += 1
                    self.stats.failures.append(detail)
            if not ok:
                time.sleep(0.2)  # a client backs off rather than spin on a refusal
        client.close()

    def _attempt(self, client: openai.OpenAI, worker: int, n: int) -> tuple[bool, str, int]:
        """One request with the SDK's retries: (ok, what went wrong, retries taken). A 401
        is raised for the caller to switch keys, once."""
        try:
            raw = client.completions.with_raw_response.create(
                model=self.model, prompt=self._prompt(worker, n), max_tokens=8, temperature=0
            )
            completion = raw.parse()
        except openai.APIStatusError as err:
            self._raise_to_switch_keys(err, client)
            return False, f"HTTP {err.status_code}: {err.response.text[:160]}", 0
        except openai.APIError as err:
            return False, f"{type(err).__name__}: {err}", 0
        return bool(completion.choices), "HTTP 200 without choices", raw.retries_taken

    def _stream_loop(self, worker: int) -> None:
        client = self._client()
        n = 0
        while not self._stop.is_set():
            n += 1
            started = time.monotonic()
            client, (done, answered) = self._keyed(client, self._stream_attempt, worker, n)
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
        client.close()

    def _stream_attempt(self, client: openai.OpenAI, worker: int, n: int) -> tuple[bool, bool]:
        """One streamed request: (it ended with a finish reason, a response had started).
        The SDK retries a request that got no response; a stream broken off after it
        started is not retried (its tokens were delivered)."""
        prompt = self._prompt(100 + worker, n)
        try:
            stream = client.completions.create(
                model=self.model, prompt=prompt, max_tokens=32, temperature=0, stream=True
            )
        except openai.APIStatusError as err:
            self._raise_to_switch_keys(err, client)
            return False, True
        except openai.APIError:
            return False, False
        finished = False
        try:
            with stream:
                for chunk in stream:
                    finished = finished or any(c.finish_reason for c in chunk.choices)
        except (openai.APIError, httpx2.HTTPError):
            return False, True
        return finished, True

    def _keyed(
        self,
        client: openai.OpenAI,
        attempt: Callable[[openai.OpenAI, int, int], T],
        worker: int,
        n: int,
    ) -> tuple[openai.OpenAI, T]:
        """``attempt``, once more with the other key after a 401 to the first: (the client
        to use from now on, the attempt's outcome)."""
        try:
            return client, attempt(client, worker, n)
        except openai.AuthenticationError:
            client = self._switched(client)
            return client, attempt(client, worker, n)

    def _raise_to_switch_keys(self, err: openai.APIStatusError, client: openai.OpenAI) -> None:
        """A 401 to a client that still presents its first key is raised: the loop switches
        to the other key once."""
        if err.status_code == 401 and len(self.keys) > 1 and client.api_key == self.keys[0]:
            raise err

    def _switched(self, client: openai.OpenAI) -> openai.OpenAI:
        """The client presenting the other key from now on."""
        with self._lock:
            self.stats.key_switches += 1
        return client.with_options(api_key=self.keys[1])
