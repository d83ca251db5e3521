"""One engine group's health as a pure state machine: observations in, actions out.

Every interval the service feeds ``step(now, probe, unit_state)``; time is a plain float
(monotonic seconds), so tests drive it without sleeping. States:

- STARTING: systemd is starting the unit (or the watchdog has just started); not a
  failure until ``max_start_seconds``, or until the unit ends ``failed`` (or ``inactive``
  after a restart the watchdog ordered). Engines are Type=notify and report ready only
  once /health answers, so an ``active`` unit is started: from then on failed probes
  count as they do for a running group.
- HEALTHY: the last probe answered and the unit is active. In rotation.
- FAILING: fewer than ``failure_threshold`` consecutive probe failures. Still in rotation:
  a slow probe under load should not drop capacity (and push that load onto the others).
- RESTARTING: a restart was ordered; waiting for the unit to begin starting.
- BACKOFF: a restart is due at ``restart_at`` (exponential backoff between restarts).
- GAVE_UP: the restart budget for the window is spent; out of rotation until the group
  answers again (an operator fixed it).
- STOPPED: someone stopped the unit (it is ``inactive`` and the watchdog did not order
  that); it is left stopped until systemd starts it again.
- RECONFIGURING: the group's settings (served name, port, key, advertise URL) changed while
  it ran (``settings_changed``). The process still running was started on the old ones, so
  probes made with the new ones say nothing about it: failures do not count and it is out
  of rotation until it answers on the new settings. Settings are rendered before the unit
  restarts (an upgrade drains the group in between, for up to a minute), so that restart is
  what it waits for: a transition begins a start as usual; a unit still ``active`` and not
  answering ``max_start_seconds`` after the change is restarted onto its settings.

Registration follows ``should_register``: in rotation (HEALTHY or FAILING) *and* the unit
exactly ``active``, never while ``activating``/``deactivating``: a stopping engine leaves
the routers itself and must not be re-added while it drains. ``Join``/``Leave`` mark the
moments that changes; the service's per-interval reconcile carries them out, and also
repairs registrations a restarted router lost.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from vllm_fleet.watchdog.probe import ProbeResult

Level = Literal["error", "warning", "info"]
TRANSITIONAL = ("activating", "deactivating")


class State(StrEnum):
    STARTING = "starting"
    HEALTHY = "healthy"
    FAILING = "failing"
    RESTARTING = "restarting"
    BACKOFF = "backoff"
    GAVE_UP = "gave_up"
    STOPPED = "stopped"
    RECONFIGURING = "reconfiguring"


IN_ROTATION = (State.HEALTHY, State.FAILING)
# States judged by probes of a process already running: new settings void those verdicts,
# and the group waits (again) for the restart that applies them.
AWAITS_RESTART = (State.HEALTHY, State.FAILING, State.BACKOFF, State.RECONFIGURING)


@dataclass(frozen=True)
class Policy:
    failure_threshold: int = 3
    max_start_seconds: float = 900.0
    backoff_initial_seconds: float = 10.0
    backoff_max_seconds: float = 300.0
    restart_budget: int = 3
    restart_window_seconds: float = 1800.0


@dataclass(frozen=True)
class Restart:
    reason: str


@dataclass(frozen=True)
class Join:
    pass


@dataclass(frozen=True)
class Leave:
    pass


@dataclass(frozen=True)
class Event:
    level: Level
    name: str
    message: str
    fields: dict[str, Any] = field(default_factory=dict)


Action = Restart | Join | Leave | Event


class GroupMachine:
    def __init__(self, policy: Policy, now: float) -> None:
        self.policy = policy
        self.state = State.STARTING
        self.since = now  # when the current state began
        self.started_at = now  # when the current start (ours or systemd's) began
        self.ordered_start = False  # the current start is a restart the watchdog ordered
        self.failures = 0  # consecutive failed probes while the unit is active
        self.restarts: deque[float] = deque()  # restarts ordered, within the window
        self.streak = 0  # restarts since the group was last healthy
        self.restart_at: float | None = None
        self.restart_reason = ""  # why the restart due at restart_at is due
        self.unit_state: str | None = None  # as last observed
        self._actions: list[Action] = []

    @property
    def should_register(self) -> bool:
        return self.state in IN_ROTATION and self.unit_state == "active"

    def backoff_seconds(self) -> float:
        """Delay before the next restart: none for the first, then initial * 2^(n-1)."""
        if self.streak == 0:
            return 0.0
        delay = self.policy.backoff_initial_seconds * 2 ** (self.streak - 1)
        return min(delay, self.policy.backoff_max_seconds)

    def restarts_in_window(self, now: float) -> int:
        while self.restarts and self.restarts[0] <= now - self.policy.restart_window_seconds:
            self.restarts.popleft()
        return len(self.restarts)

    def step(self, now: float, probe: ProbeResult, unit_state: str) -> list[Action]:
        registered = self.should_register
        first = self.unit_state is None
        self._actions = []
        # Probes of a unit that is not up are expected to fail; they count as nothing. Nor
        # do probes, made with new settings, of a process started on the old ones.
        counts = unit_state == "active" and self.state != State.RECONFIGURING
        self.failures = self.failures + 1 if not probe.ok and counts else 0
        if first and unit_state == "active":
            # Type=notify: an active engine has been ready before; judge it as running.
            self._enter(State.HEALTHY if probe.ok else State.FAILING, now)
            self._event_after_first_probe(probe)
        else:
            handler = {
                State.STARTING: self._starting,
                State.HEALTHY: self._running,
                State.FAILING: self._running,
                State.RESTARTING: self._restarting,
                State.BACKOFF: self._backoff,
                State.GAVE_UP: self._gave_up,
                State.STOPPED: self._stopped,
                State.RECONFIGURING: self._reconfiguring,
            }[self.state]
            handler(now, probe, unit_state)
        self.unit_state = unit_state
        actions, self._actions = self._actions, []
        if registered and not self.should_register:
            actions.insert(0, Leave())  # before any restart
        elif self.should_register and not registered:
            actions.append(Join())
        return actions

    def settings_changed(self, now: float, changed: list[str]) -> list[Action]:
        """The group's settings changed (``changed`` names the fields, never their values).

        Failures counted so far were probes made with the old settings: they are dropped, and
        a restart they made due (BACKOFF) is cancelled. A group judged by probes of its running
        process (HEALTHY, FAILING, BACKOFF) waits in RECONFIGURING for the restart that
        applies the new settings. One starting, restarting, stopped or given up on stays: its
        next start reads the new settings anyway, and the probes it is judged by use them.
        """
        registered = self.should_register
        self.failures = 0
        what = ", ".join(changed)
        if self.state in AWAITS_RESTART:
            cancelled = self.state == State.BACKOFF
            self.restart_at = None
            self.restart_reason = ""
            self._enter(State.RECONFIGURING, now)
            message = f"settings changed ({what}); waiting for the unit to restart on them"
            if cancelled:
                message += "; the pending restart is cancelled"
        else:
            message = f"settings changed ({what}); probing with the new ones"
        actions: list[Action] = [Event("info", "settings_changed", message, {"changed": changed})]
        if registered and not self.should_register:
            actions.insert(0, Leave())
        return actions

    # -- transitions ------------------------------------------------------------------

    def _enter(self, state: State, now: float) -> None:
        self.state = state
        self.since = now

    def _event(self, level: Level, name: str, message: str, **fields: Any) -> None:
        self._actions.append(Event(level, name, message, fields))

    def _event_after_first_probe(self, probe: ProbeResult) -> None:
        if probe.ok:
            self._event("info", "healthy", "answers probes", probe_seconds=round(probe.seconds, 3))
        else:
            self._event("warning", "probe_failed", f"probe failed: {probe.detail}", failures=1)

    def _become_healthy(self, now: float, name: str, message: str) -> None:
        self._enter(State.HEALTHY, now)
        self.ordered_start = False
        self.streak = 0
        self.restart_at = None
        self._event("info", name, message)

    def _begin_start(self, now: float, started_at: float, ordered: bool) -> None:
        self._enter(State.STARTING, now)
        self.started_at = started_at
        self.ordered_start = ordered

    def _running(self, now: float, probe: ProbeResult, unit_state: str) -> None:
        if unit_state in TRANSITIONAL:
            # systemd (an operator, Ansible, Restart=on-failure) is stopping or starting it.
            self._begin_start(now, now, ordered=False)
            self._event("info", "unit_transition", f"unit is {unit_state}; waiting for it")
        elif unit_state == "failed":
            self._fail(now, "unit failed")
        elif unit_state == "inactive" and not probe.ok:
            self._stop(now)
        elif probe.ok:
            if self.state == State.FAILING:
                self._become_healthy(now, "recovered", "answers probes again")
        elif self.failures >= self.policy.failure_threshold:
            self._fail(now, f"{self.failures} probes failed in a row, last: {probe.detail}")
        elif self.state == State.HEALTHY:
            self._enter(State.FAILING, now)
            self._event("warning", "probe_failed", f"probe failed: {probe.detail}", failures=1)

    def _starting(self, now: float, probe: ProbeResult, unit_state: str) -> None:
        if unit_state == "active" and probe.ok:
            took = now - self.started_at
            self._become_healthy(now, "healthy", f"answers probes {took:.0f}s after its start")
        elif unit_state == "active" and self.failures >= self.policy.failure_threshold:
            self._fail(now, f"started, but {self.failures} probes failed, last: {probe.detail}")
        elif unit_state == "failed":
            self._fail(now, "unit failed while starting")
        elif unit_state == "inactive":
            if self.ordered_start:
                self._fail(now, "unit is inactive after the restart")
            else:
                self._stop(now)
        elif now - self.started_at > self.policy.max_start_seconds:
            limit = self.policy.max_start_seconds
            self._fail(now, f"not answering probes {limit:.0f}s after its start")

    def _restarting(self, now: float, probe: ProbeResult, unit_state: str) -> None:
        # "inactive" here may be the gap between the stop and the start of our restart; and
        # "active" is the new process: the old one is deactivating within milliseconds.
        if unit_state in ("activating", "active"):
            self._begin_start(now, self.started_at, ordered=True)
            self._starting(now, probe, unit_state)
        elif unit_state == "failed":
            self._fail(now, "unit failed while restarting")
        elif now - self.started_at > self.policy.max_start_seconds:
            self._fail(now, f"unit did not start within {self.policy.max_start_seconds:.0f}s")

    def _backoff(self, now: float, probe: ProbeResult, unit_state: str) -> None:
        if probe.ok and unit_state == "active":
            self._become_healthy(now, "recovered", "answers probes again; restart cancelled")
        elif self.restart_at is not None and now >= self.restart_at:
            self._restart(now, f"{self.restart_reason} (after backoff)")

    def _gave_up(self, now: float, probe: ProbeResult, unit_state: str) -> None:
        if probe.ok and unit_state == "active":
            self.restarts.clear()
            self._become_healthy(
                now, "recovered", "answers probes again after the watchdog gave up; rejoining"
            )

    def _stopped(self, now: float, probe: ProbeResult, unit_state: str) -> None:
        if unit_state in ("activating", "active"):
            self._begin_start(now, now, ordered=False)
            self._starting(now, probe, unit_state)

    def _reconfiguring(self, now: float, probe: ProbeResult, unit_state: str) -> None:
        if unit_state in TRANSITIONAL:
            # The restart that applies the new settings (or any other start): judged as one.
            self._begin_start(now, now, ordered=False)
            self._event("info", "unit_transition", f"unit is {unit_state}; waiting for it")
        elif unit_state == "failed":
            self._fail(now, "unit failed")
        elif unit_state == "inactive" and not probe.ok:
            self._stop(now)
        elif probe.ok and unit_state == "active":
            self._become_healthy(now, "healthy", "answers probes on its new settings")
        elif now - self.since > self.policy.max_start_seconds:
            # Nobody restarted it onto them (a hand edit, a dead playbook run): the watchdog does.
            limit = self.policy.max_start_seconds
            self._fail(now, f"not answering on its new settings {limit:.0f}s after they changed")

    def _stop(self, now: float) -> None:
        self._enter(State.STOPPED, now)
        self.ordered_start = False
        self._event("warning", "stopped", "unit was stopped outside the watchdog; leaving it")

    def _fail(self, now: float, reason: str) -> None:
        used = self.restarts_in_window(now)
        if used >= self.policy.restart_budget:
            self._enter(State.GAVE_UP, now)
            window = self.policy.restart_window_seconds
            self._event(
                "error",
                "gave_up",
                f"{reason}; {used} restarts within {window:.0f}s already: not restarting, "
                "out of the routers until it answers again",
                restarts=used,
            )
            return
        delay = self.backoff_seconds()
        if delay <= 0:
            self._restart(now, reason)
            return
        self._enter(State.BACKOFF, now)
        self.restart_at = now + delay
        self.restart_reason = reason
        self._event("warning", "backoff", f"{reason}; restarting in {delay:.0f}s", delay=delay)

    def _restart(self, now: float, reason: str) -> None:
        self.restarts.append(now)
        self.streak += 1
        self.restart_at = None
        self.failures = 0  # they were the old process's
        self._enter(State.RESTARTING, now)
        self.started_at = now
        self.ordered_start = True
        self._actions.append(Restart(reason))
        self._event("warning", "restart", f"restarting the group: {reason}", attempt=self.streak)
