"""How much cross-talk load a fleet can take inside its deadline, sized from one measured wave.

A wave is as many concurrent requests as the target has sequence slots: one full batch.
Requests beyond the slots queue behind it, so a burst of W waves ends after about W times one
wave's time. The router (fleet_router.request_timeout_seconds) and verify itself
(fleet_verify_timeout) cut a request that runs longer than their deadline, and a cut request
is an error the fleet did not make: the burst must end well inside the tighter deadline. Fixed
numbers cannot do that; a slow machine and a fast one need different loads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from vllm_fleet.verify.config import VerifyConfig

# The last wave of a burst must end within deadline / MARGIN. Queued waves are not strictly
# one after another (a queued wave's prefill competes with the running wave's decode; a
# router spreads a burst unevenly), and one wave's time is a single sample.
MARGIN = 2.0
# The settings an operator changes, named as the inventory spells them.
ROUTER_TIMEOUT = "fleet_router.request_timeout_seconds"
VERIFY_TIMEOUT = "fleet_verify_timeout"
CONCURRENCY = "fleet_verify_crosstalk.concurrency"
MAX_CONCURRENCY = "fleet_verify_crosstalk.max_concurrency"
MAX_TOKENS = "fleet_verify_crosstalk.max_tokens"
ADMISSION = "fleet_router.admission_factor x the engines' max_num_seqs"


@dataclass(frozen=True)
class Limit:
    """A number an operator set, with the setting's name (messages tell what to change)."""

    value: float
    setting: str

    def __str__(self) -> str:
        return f"{self.setting} = {self.value:g}"


@dataclass(frozen=True)
class Limits:
    deadline: Limit  # the tighter of the deadlines a cross-talk request runs under
    cap: Limit  # the most requests a sized burst sends at once
    admission: Limit | None = None  # the router refuses requests beyond it (bare 429)

    @classmethod
    def of(cls, cfg: VerifyConfig) -> Limits:
        own = Limit(cfg.timeout_seconds, VERIFY_TIMEOUT)
        the_deadline, admitted = own, None
        if cfg.router is not None:
            router = Limit(cfg.router.request_timeout_seconds, ROUTER_TIMEOUT)
            the_deadline = router if router.value <= own.value else own
            if cfg.router.admission_factor is not None:
                admitted = Limit(cfg.router.admission_factor * cfg.fleet_max_num_seqs, ADMISSION)
        the_cap = Limit(cfg.crosstalk.max_concurrency, MAX_CONCURRENCY)
        if admitted is not None and admitted.value < the_cap.value:
            the_cap = admitted
        return cls(the_deadline, the_cap, admitted)


def split(total: int, slots: list[int]) -> list[int]:
    """``total`` requests over endpoints in proportion to their slots.

    Each endpoint's share fills its own batch wave after wave; an even split would leave a
    small engine's requests queuing while a large one idles.
    """
    counts = [0] * len(slots)
    for _ in range(total):
        emptiest = min(range(len(slots)), key=lambda i: (counts[i] / slots[i], i))
        counts[emptiest] += 1
    return counts


def waves_of(counts: list[int], slots: list[int]) -> int:
    """Waves the busiest endpoint needs: the burst ends with that endpoint's last wave."""
    return max(math.ceil(c / s) for c, s in zip(counts, slots, strict=True))


@dataclass(frozen=True)
class Sizing:
    slots: int  # sequence slots behind the target: one wave
    wave_seconds: float  # the slowest request of the measured wave
    deadline: Limit
    cap: Limit
    concurrency: int  # C (a refused configured C stays as asked; a too-slow wave gives 0)
    waves: int
    source: str  # "measured", or the setting C came from
    problem: str | None = None  # why the burst must not run (the check fails with it)

    @property
    def budget_seconds(self) -> float:
        return self.deadline.value / MARGIN

    def as_dict(self) -> dict[str, Any]:
        return {
            "slots": self.slots,
            "wave_seconds": round(self.wave_seconds, 3),
            "deadline_seconds": self.deadline.value,
            "deadline_setting": self.deadline.setting,
            "budget_seconds": round(self.budget_seconds, 3),
            "concurrency": self.concurrency,
            "waves": self.waves,
            "projected_seconds": round(self.waves * self.wave_seconds, 3),
            "source": self.source,
            "cap": self.cap.value,
            "cap_setting": self.cap.setting,
        }


def size(
    slots: list[int],
    wave_seconds: float,
    limits: Limits,
    configured: int | None = None,
    *,
    max_tokens: int = 0,
    wanted_waves: int = 2,
) -> Sizing:
    """C for a burst over endpoints with these slots, given one full wave's measured time.

    A configured C is used as it is, or refused; otherwise C is ``wanted_waves`` whole waves
    (every slot filled, the rest queued), fewer where the last would not end inside the
    budget or the cap allows fewer.
    """
    total = sum(slots)
    base = Sizing(total, wave_seconds, limits.deadline, limits.cap, 0, 0, "measured")
    budget = base.budget_seconds
    if wave_seconds > budget:
        return replace(base, problem=_wave_too_slow(base, max_tokens))
    fit = math.floor(budget / max(wave_seconds, 1e-6))  # whole waves inside the budget
    if configured is not None:
        return _configured(base, slots, configured, fit, limits.admission)
    waves = max(1, min(wanted_waves, fit, int(limits.cap.value) // total))
    # A cap below the slots wins (the operator limited the load): one partial wave.
    concurrency = min(waves * total, int(limits.cap.value))
    return replace(base, concurrency=concurrency, waves=waves_of(split(concurrency, slots), slots))


def _configured(
    base: Sizing, slots: list[int], concurrency: int, fit: int, admitted: Limit | None
) -> Sizing:
    waves = waves_of(split(concurrency, slots), slots)
    sized = replace(base, concurrency=concurrency, waves=waves, source=CONCURRENCY)
    if admitted is not None and concurrency > admitted.value:
        return replace(
            sized,
            problem=f"{CONCURRENCY} = {concurrency} exceeds the router's admission limit of "
            f"{admitted.value:g} ({admitted.setting}): the router refuses the excess with 429. "
            f"Set it to at most {admitted.value:g}, or to null to size it from the measurement",
        )
    if waves > fit:
        return replace(
            sized,
            problem=f"{CONCURRENCY} = {concurrency} queues {waves} waves of {base.slots} "
            f"requests; at {base.wave_seconds:.1f} s a wave (measured) the last would end "
            f"after ~{waves * base.wave_seconds:.1f} s, beyond half of {base.deadline} s. Set "
            f"it to at most {fit * base.slots} (or to null to size it from the "
            f"measurement), or raise {base.deadline.setting}",
        )
    return sized


def _wave_too_slow(base: Sizing, max_tokens: int) -> str:
    return (
        f"one full wave ({base.slots} concurrent requests, one per sequence slot) took "
        f"{base.wave_seconds:.1f} s (measured), more than half of {base.deadline} s: under "
        f"load requests would be cut at the deadline. Raise {base.deadline.setting} (to at "
        f"least {math.ceil(base.wave_seconds * MARGIN)} s), or lower the engines' max_num_seqs "
        f"or {MAX_TOKENS} (now {max_tokens})"
    )
