"""Lockstep: the served names' loads start each phase together; one that stops never blocks."""

from __future__ import annotations

import asyncio

import pytest

from vllm_fleet.verify.lockstep import Lockstep, alone

PHASES = ("calibration", "burst", "probes")


async def _walk(lockstep: Lockstep, name: str, log: list[str], delays: dict[str, float]) -> None:
    async with lockstep.party() as party:
        for phase in ("calibration", "burst"):
            await asyncio.sleep(delays.get(phase, 0))
            log.append(f"{name} reached {phase}")
            await party.reach(phase)
            log.append(f"{name} passed {phase}")


def test_no_party_passes_a_phase_before_every_party_reached_it():
    log: list[str] = []

    async def main() -> None:
        lockstep = Lockstep(2, PHASES)
        # a is quick, b slow: a must still wait for b at each phase.
        await asyncio.gather(
            _walk(lockstep, "a", log, {}),
            _walk(lockstep, "b", log, {"calibration": 0.05, "burst": 0.05}),
        )

    asyncio.run(main())
    for phase in ("calibration", "burst"):
        reached = max(log.index(f"{n} reached {phase}") for n in "ab")
        passed = min(log.index(f"{n} passed {phase}") for n in "ab")
        assert reached < passed, log


def test_a_party_that_leaves_early_or_fails_never_blocks_the_others():
    log: list[str] = []

    async def stops_after_smoke(lockstep: Lockstep) -> None:
        async with lockstep.party():
            log.append("c left before calibration")

    async def crashes(lockstep: Lockstep) -> None:
        async with lockstep.party() as party:
            await party.reach("calibration")
            raise RuntimeError("load crashed")

    async def main() -> None:
        lockstep = Lockstep(3, PHASES)
        results = await asyncio.wait_for(
            asyncio.gather(
                _walk(lockstep, "a", log, {"burst": 0.02}),
                stops_after_smoke(lockstep),
                crashes(lockstep),
                return_exceptions=True,
            ),
            timeout=5,
        )
        assert isinstance(results[2], RuntimeError)

    asyncio.run(main())
    assert log[-1] == "a passed burst", log


def test_a_lockstep_takes_no_more_parties_than_it_was_made_for():
    async def main() -> None:
        lockstep = Lockstep(1, PHASES)
        async with lockstep.party():
            with pytest.raises(RuntimeError, match="no room"):
                async with lockstep.party():
                    pass

    asyncio.run(main())


def test_alone_never_waits_and_its_clock_runs():
    async def main() -> float:
        async with alone(PHASES) as party:
            await asyncio.wait_for(party.reach("burst"), timeout=1)
            await asyncio.sleep(0.01)
            return party.clock()

    assert asyncio.run(main()) >= 0.01


def test_a_party_that_skips_a_phase_counts_as_past_it():
    """One name's load must not run (it goes straight to the probes) while the other's bursts:
    neither waits for the other at the phase one of them skipped."""
    log: list[str] = []

    async def skips_the_burst(lockstep: Lockstep) -> None:
        async with lockstep.party() as party:
            await party.reach("calibration")
            await party.reach("probes")
            log.append("skipper probes")

    async def main() -> None:
        lockstep = Lockstep(2, PHASES)

        async def bursts() -> None:
            async with lockstep.party() as party:
                for phase in PHASES:
                    await party.reach(phase)
                    log.append(f"burster {phase}")

        await asyncio.wait_for(asyncio.gather(skips_the_burst(lockstep), bursts()), timeout=5)

    asyncio.run(main())
    # Nobody probes while a load runs: the skipper's probes wait for the burster's burst.
    assert log.index("burster burst") < log.index("skipper probes"), log


def test_a_phase_out_of_order_is_refused():
    async def main() -> None:
        async with Lockstep(1, PHASES).party() as party:
            await party.reach("burst")
            with pytest.raises(RuntimeError, match="comes before"):
                await party.reach("calibration")

    asyncio.run(main())
