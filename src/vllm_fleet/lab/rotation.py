"""Which engines a router serves, sampled over time (for upgrade tests and benches)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class Rotation:
    """Samples of (seconds since start, {worker URL: served}) from the router's listing."""

    urls: list[str]
    samples: list[tuple[float, dict[str, bool]]] = field(default_factory=list)
    errors: int = 0

    def min_serving(self) -> int:
        return min((sum(s.values()) for _, s in self.samples), default=0)

    def unavailable_seconds(self) -> dict[str, float]:
        """Per URL, the time between samples that did not find it served."""
        out = dict.fromkeys(self.urls, 0.0)
        for (t0, state), (t1, _) in zip(self.samples, self.samples[1:], strict=False):
            for url in self.urls:
                if not state.get(url, False):
                    out[url] += t1 - t0
        return out


class RotationSampler:
    """Polls sglang-router's ``GET /workers`` (control key) every ``interval`` seconds."""

    def __init__(
        self, router_url: str, control_key: str, urls: list[str], interval: float = 0.25
    ) -> None:
        self.rotation = Rotation(urls=[u.rstrip("/") for u in urls])
        self._url = f"{router_url.rstrip('/')}/workers"
        self._headers = {"Authorization": f"Bearer {control_key}"}
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rotation", daemon=True)

    def __enter__(self) -> RotationSampler:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        with httpx.Client(headers=self._headers, timeout=2.0) as client:
            while not self._stop.is_set():
                try:
                    workers = client.get(self._url).json()["workers"]
                    served = {str(w["url"]).rstrip("/"): bool(w["is_healthy"]) for w in workers}
                    state = {url: served.get(url, False) for url in self.rotation.urls}
                    self.rotation.samples.append((time.monotonic() - self._started, state))
                except (httpx.HTTPError, ValueError, KeyError):
                    self.rotation.errors += 1
                self._stop.wait(self._interval)
