"""Samples every engine's ``vllm:num_requests_running`` in the background during a load phase.

The peak is the concurrency the fleet actually reached: requests sent "together" can still
be served one after another (a connection pool limit, a router queue), and only the engines
can tell.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from types import TracebackType

import httpx

from vllm_fleet.verify import engine_metrics


@dataclass
class RunningPeaks:
    per_engine: dict[str, float] = field(default_factory=dict)
    fleet_sum: float = 0.0  # peak of the per-tick sum over engines
    samples: int = 0
    errors: int = 0

    def as_dict(self) -> dict[str, object]:
        return {
            "per_engine": self.per_engine,
            "fleet_sum": self.fleet_sum,
            "samples": self.samples,
            "errors": self.errors,
        }


class RunningSampler:
    """``async with RunningSampler(...) as sampler:`` samples until the block ends."""

    def __init__(
        self, client: httpx.AsyncClient, engines: dict[str, str], interval_s: float
    ) -> None:
        self._client = client
        self._engines = engines  # label -> base URL
        self._interval = interval_s
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.peaks = RunningPeaks(per_engine=dict.fromkeys(engines, 0.0))

    async def __aenter__(self) -> RunningSampler:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            values = await asyncio.gather(*(self._read(url) for url in self._engines.values()))
            self._record(dict(zip(self._engines, values, strict=True)))
            remaining = self._interval - (time.perf_counter() - started)
            if remaining > 0:
                # Wakes early when the load phase ends.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), remaining)

    async def _read(self, url: str) -> float | None:
        try:
            families = await engine_metrics.fetch_families(self._client, url)
        except (httpx.HTTPError, ValueError):
            return None
        return engine_metrics.value(families, engine_metrics.RUNNING)

    def _record(self, values: dict[str, float | None]) -> None:
        self.peaks.samples += 1
        tick_sum = 0.0
        for label, running in values.items():
            if running is None:
                self.peaks.errors += 1
                continue
            self.peaks.per_engine[label] = max(self.peaks.per_engine[label], running)
            tick_sum += running
        self.peaks.fleet_sum = max(self.peaks.fleet_sum, tick_sum)
