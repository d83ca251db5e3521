"""Which engines a router serves, sampled over time (for upgrade tests and benches)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from vllm_fleet.router.client import RouterError, RouterTarget, router_client


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
    """Polls the router's healthy workers every ``interval`` seconds (either router: the
    client asks the router which it is, so a router replaced by the other is followed)."""

    def __init__(
        self, router_url: str, control_key: str, urls: list[str], interval: float = 0.25
    ) -> None:
        self.rotation = Rotation(urls=[u.rstrip("/") for u in urls])
        self._target = RouterTarget(impl="sglang", url=router_url)
        self._control_key = control_key
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
        client = router_client(self._target, self._control_key, timeout=2.0)
        try:
            while not self._stop.is_set():
                try:
                    served = set(client.healthy())
                    state = {url: url in served for url in self.rotation.urls}
                    self.rotation.samples.append((time.monotonic() - self._started, state))
                except (RouterError, KeyError):
                    self.rotation.errors += 1
                self._stop.wait(self._interval)
        finally:
            client.close()
