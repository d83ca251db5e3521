"""Several checks run at once, their load phases started together.

A fleet serving several names verifies them at the same time (each name on its own engines),
so a fleet of N models takes about as long to verify as one. Their cross-talk loads share
the routers and the verifier's own CPU, though: a burst sized from a calibration wave measured
alone could meet a neighbour's burst and run slower than measured. In lockstep, every name
calibrates together and bursts together, so each burst meets the neighbours its calibration
was measured with.

A party that ends early (a failed smoke, a load that must not run) leaves: the others never
wait for it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class Lockstep:
    """``phases`` in the order every party goes through them; a party may skip one (a load
    that must not run goes straight to the probes): reaching a later phase counts as having
    passed the earlier ones."""

    def __init__(self, parties: int, phases: tuple[str, ...]) -> None:
        self._parties = parties
        self._phases = phases
        # Each party's furthest phase (its index in phases); -1 before the first.
        self._at: list[int] = []
        self._gone: set[int] = set()
        self._changed = asyncio.Condition()
        self._start = time.monotonic()

    def clock(self) -> float:
        """Seconds since the lockstep began: one clock for every party's phase times."""
        return round(time.monotonic() - self._start, 3)

    @asynccontextmanager
    async def party(self) -> AsyncIterator[Party]:
        """One party's turn; it leaves when the block ends, however it ends."""
        if len(self._at) >= self._parties:
            raise RuntimeError(f"a lockstep of {self._parties} parties has no room for another")
        member = Party(self, len(self._at))
        self._at.append(-1)
        try:
            yield member
        finally:
            async with self._changed:
                self._gone.add(member.number)
                self._changed.notify_all()

    async def _reach(self, number: int, phase: str) -> None:
        index = self._phases.index(phase)
        if index < self._at[number]:
            raise RuntimeError(f"phase {phase!r} comes before {self._phases[self._at[number]]!r}")
        async with self._changed:
            self._at[number] = index
            self._changed.notify_all()
            await self._changed.wait_for(lambda: self._all_there(index))

    def _all_there(self, index: int) -> bool:
        there = sum(1 for n, at in enumerate(self._at) if at >= index or n in self._gone)
        return there >= self._parties


class Party:
    """One of the checks in a lockstep."""

    def __init__(self, lockstep: Lockstep, number: int) -> None:
        self._lockstep = lockstep
        self.number = number

    async def reach(self, phase: str) -> None:
        """Wait until every other party has reached ``phase`` too, or has left."""
        await self._lockstep._reach(self.number, phase)

    def clock(self) -> float:
        return self._lockstep.clock()


@asynccontextmanager
async def alone(phases: tuple[str, ...]) -> AsyncIterator[Party]:
    """A lockstep of one: reach never waits."""
    async with Lockstep(1, phases).party() as member:
        yield member
