"""The per-group state machine, driven with injected time (no sleeping, no I/O)."""

from __future__ import annotations

import pytest

from vllm_fleet.watchdog.probe import ProbeResult
from vllm_fleet.watchdog.state import (
    Event,
    GroupMachine,
    Join,
    Leave,
    Policy,
    Restart,
    State,
)

OK = ProbeResult(True, 0.02, "1 completion tokens")
BAD = ProbeResult(False, 5.0, "ReadTimeout: timed out")
POLICY = Policy(
    failure_threshold=3,
    max_start_seconds=600,
    backoff_initial_seconds=10,
    backoff_max_seconds=300,
    restart_budget=3,
    restart_window_seconds=1800,
)


def kinds(actions):
    return [type(a).__name__ if not isinstance(a, Event) else a.name for a in actions]


def events(actions, level=None):
    return [a for a in actions if isinstance(a, Event) and (level is None or a.level == level)]


def healthy_machine(policy=POLICY, now=0.0):
    machine = GroupMachine(policy, now)
    actions = machine.step(now, OK, "active")
    assert kinds(actions) == ["healthy", "Join"]
    assert actions[1] == Join()
    return machine


def test_an_active_answering_group_is_healthy_and_joined_at_once():
    machine = healthy_machine()
    assert machine.state == State.HEALTHY
    assert machine.should_register
    assert machine.step(2, OK, "active") == []


def test_failures_below_the_threshold_keep_the_group_in_rotation():
    machine = healthy_machine()
    actions = machine.step(2, BAD, "active")
    assert kinds(actions) == ["probe_failed"]
    assert events(actions)[0].level == "warning"
    assert machine.state == State.FAILING
    assert machine.should_register
    assert machine.step(4, BAD, "active") == []
    assert machine.failures == 2
    assert kinds(machine.step(6, OK, "active")) == ["recovered"]
    assert machine.state == State.HEALTHY
    assert machine.failures == 0


def test_threshold_failures_leave_before_restarting():
    machine = healthy_machine()
    machine.step(2, BAD, "active")
    machine.step(4, BAD, "active")
    actions = machine.step(6, BAD, "active")
    assert kinds(actions) == ["Leave", "Restart", "restart"]
    assert isinstance(actions[0], Leave)
    assert isinstance(actions[1], Restart)
    assert "3 probes failed in a row" in actions[1].reason
    assert "ReadTimeout" in actions[1].reason
    assert machine.state == State.RESTARTING
    assert not machine.should_register


def test_a_restart_is_followed_through_the_units_states():
    machine = healthy_machine()
    for t in (2, 4, 6):
        machine.step(t, BAD, "active")
    # The drain, then the gap between stop and start of the restart job: just waiting.
    assert machine.step(8, BAD, "deactivating") == []
    assert machine.step(10, BAD, "inactive") == []
    assert machine.state == State.RESTARTING
    assert machine.step(12, BAD, "activating") == []
    assert machine.state == State.STARTING
    actions = machine.step(200, OK, "active")
    assert kinds(actions) == ["healthy", "Join"]
    assert "194s after its start" in events(actions)[0].message


def test_startup_grace_then_a_failed_start():
    machine = GroupMachine(POLICY, 0)
    assert machine.step(0, BAD, "activating") == []
    assert machine.state == State.STARTING
    assert machine.step(600, BAD, "activating") == []
    assert machine.failures == 0  # a unit that is not up yet fails nothing
    actions = machine.step(601, BAD, "activating")
    assert kinds(actions) == ["Restart", "restart"]
    assert "600s after its start" in actions[0].reason


@pytest.mark.parametrize("unit_state", ["failed", "inactive"])
def test_a_unit_that_dies_while_we_wait_is_a_failed_start_at_once(unit_state):
    machine = healthy_machine()
    for t in (2, 4, 6):
        machine.step(t, BAD, "active")
    machine.step(8, BAD, "activating")
    assert machine.state == State.STARTING
    actions = machine.step(10, BAD, unit_state)
    # The second restart in a row waits backoff_initial_seconds.
    assert kinds(actions) == ["backoff"]
    assert machine.state == State.BACKOFF
    assert machine.restart_at == 20


def test_a_failed_unit_is_restarted_immediately():
    machine = healthy_machine()
    actions = machine.step(2, BAD, "failed")
    assert kinds(actions) == ["Leave", "Restart", "restart"]
    assert actions[1].reason == "unit failed"


def test_the_backoff_doubles_up_to_the_maximum():
    policy = Policy(
        failure_threshold=1,
        max_start_seconds=5,
        backoff_initial_seconds=10,
        backoff_max_seconds=50,
        restart_budget=100,
        restart_window_seconds=10_000,
    )
    machine = GroupMachine(policy, 0)
    now = 0.0
    delays = []
    for _ in range(6):
        actions = machine.step(now, BAD, "failed")
        if machine.state == State.BACKOFF:
            delays.append(machine.restart_at - now)
            now = machine.restart_at
            actions = machine.step(now, BAD, "failed")
        else:
            delays.append(0)
        assert kinds(actions) == ["Restart", "restart"]
        now += 2
        machine.step(now, BAD, "activating")  # the restart got going, then failed again
        now += 2
    assert delays == [0, 10, 20, 40, 50, 50]


def test_backoff_delays_the_restart_and_an_answer_cancels_it():
    machine = healthy_machine()
    machine.step(2, BAD, "failed")  # restart 1, immediate
    machine.step(4, BAD, "failed")  # failed again: backoff
    assert machine.state == State.BACKOFF
    assert machine.step(13, BAD, "failed") == []
    actions = machine.step(14, BAD, "failed")
    assert kinds(actions) == ["Restart", "restart"]
    assert actions[0].reason == "unit failed while restarting (after backoff)"
    machine.step(16, BAD, "failed")  # a third failure: 20 s backoff
    assert machine.restart_at == 36
    assert kinds(machine.step(18, OK, "active")) == ["recovered", "Join"]
    # Healthy again: the next failure restarts at once.
    assert kinds(machine.step(20, BAD, "failed")) == ["Leave", "Restart", "restart"]


def no_backoff(budget=3, window=100.0):
    return Policy(
        failure_threshold=1,
        max_start_seconds=600,
        backoff_initial_seconds=0,
        backoff_max_seconds=0,
        restart_budget=budget,
        restart_window_seconds=window,
    )


def test_the_budget_gives_up_loudly_and_keeps_the_group_out():
    machine = GroupMachine(no_backoff(), 0)
    for t in (0, 10, 20):
        assert kinds(machine.step(t, BAD, "failed")) == ["Restart", "restart"]
    actions = machine.step(30, BAD, "failed")
    assert kinds(actions) == ["gave_up"]
    assert events(actions)[0].level == "error"
    assert events(actions)[0].fields == {"restarts": 3}
    assert machine.state == State.GAVE_UP
    # Stays given up, whatever the unit does, while probes fail.
    assert machine.step(500, BAD, "failed") == []
    assert machine.step(502, BAD, "activating") == []
    assert not machine.should_register


def test_the_budget_window_slides():
    machine = GroupMachine(no_backoff(), 0)
    for t in (0, 50, 90):
        machine.step(t, BAD, "failed")
    assert machine.restarts_in_window(99) == 3
    # At 101 the restart at 0 has left the 100 s window: one more is allowed.
    assert kinds(machine.step(101, BAD, "failed")) == ["Restart", "restart"]
    assert list(machine.restarts) == [50, 90, 101]
    assert kinds(machine.step(120, BAD, "failed")) == ["gave_up"]


def test_a_zero_budget_never_restarts():
    machine = GroupMachine(no_backoff(budget=0), 0)
    assert kinds(machine.step(0, BAD, "failed")) == ["gave_up"]


def test_a_given_up_group_that_answers_again_rejoins_with_a_fresh_budget():
    machine = GroupMachine(no_backoff(budget=1), 0)
    machine.step(0, BAD, "failed")
    machine.step(10, BAD, "failed")
    assert machine.state == State.GAVE_UP
    # Answering while the unit is not up (yet) is not enough.
    assert machine.step(20, OK, "activating") == []
    actions = machine.step(22, OK, "active")
    assert kinds(actions) == ["recovered", "Join"]
    assert events(actions)[0].level == "info"
    assert "gave up" in events(actions)[0].message
    assert machine.restarts_in_window(22) == 0
    assert kinds(machine.step(24, BAD, "failed")) == ["Leave", "Restart", "restart"]


def test_stopping_units_are_not_joined():
    machine = healthy_machine()
    # A stopping engine still answers while it drains: out of the routers regardless.
    actions = machine.step(2, OK, "deactivating")
    assert kinds(actions) == ["Leave", "unit_transition"]
    assert machine.state == State.STARTING
    assert not machine.should_register
    assert machine.step(4, OK, "deactivating") == []
    assert machine.step(6, OK, "activating") == []
    assert not machine.should_register
    assert kinds(machine.step(8, OK, "active")) == ["healthy", "Join"]


def test_a_starting_unit_is_not_joined_even_if_it_answers():
    machine = GroupMachine(POLICY, 0)
    assert machine.step(0, OK, "activating") == []
    assert not machine.should_register
    assert kinds(machine.step(2, OK, "active")) == ["healthy", "Join"]


def test_a_unit_stopped_outside_the_watchdog_is_left_stopped():
    machine = healthy_machine()
    machine.step(2, BAD, "deactivating")
    actions = machine.step(4, BAD, "inactive")
    assert kinds(actions) == ["stopped"]
    assert machine.state == State.STOPPED
    assert machine.step(1000, BAD, "inactive") == []
    # Started again by someone: watched as a start.
    assert machine.step(1002, BAD, "activating") == []
    assert machine.state == State.STARTING
    assert kinds(machine.step(1004, OK, "active")) == ["healthy", "Join"]


def test_an_inactive_unit_at_watchdog_start_is_not_started():
    machine = GroupMachine(POLICY, 0)
    assert kinds(machine.step(0, BAD, "inactive")) == ["stopped"]


def test_an_active_group_failing_at_watchdog_start_counts_from_one():
    machine = GroupMachine(POLICY, 0)
    actions = machine.step(0, BAD, "active")
    assert kinds(actions) == ["probe_failed", "Join"]
    assert machine.state == State.FAILING
    machine.step(2, BAD, "active")
    assert kinds(machine.step(4, BAD, "active")) == ["Leave", "Restart", "restart"]


def test_a_restarted_group_that_is_active_but_hung_fails_after_the_threshold():
    machine = healthy_machine()
    for t in (2, 4, 6):
        machine.step(t, BAD, "active")
    assert machine.state == State.RESTARTING
    # Came up (ready) quickly, but completions still hang: no 600 s grace for that.
    assert machine.step(8, BAD, "active") == []
    assert machine.state == State.STARTING
    assert machine.step(10, BAD, "active") == []
    assert kinds(machine.step(12, BAD, "active")) == ["backoff"]


def test_a_restart_that_never_starts_times_out():
    machine = healthy_machine()
    for t in (2, 4, 6):
        machine.step(t, BAD, "active")
    assert machine.step(300, BAD, "deactivating") == []
    assert kinds(machine.step(607, BAD, "deactivating")) == ["backoff"]


# -- settings that change under a running group ---------------------------------------
# The settings are rendered before the unit restarts (an upgrade drains the group in
# between): probes with the new ones fail on the process still running the old ones.

NOT_SERVED = ProbeResult(False, 0.01, "HTTP 404: The model `new-model` does not exist.")


def test_new_settings_wait_for_the_restart_without_counting_failures():
    machine = healthy_machine()
    machine.step(2, BAD, "active")
    assert machine.failures == 1
    actions = machine.settings_changed(3, ["served_name"])
    assert kinds(actions) == ["Leave", "settings_changed"]
    assert events(actions)[0].level == "info"
    assert events(actions)[0].fields == {"changed": ["served_name"]}
    assert "served_name" in events(actions)[0].message
    assert machine.state == State.RECONFIGURING
    assert machine.failures == 0
    assert not machine.should_register  # not on the new settings yet
    # The old process answers the new name with 404 for as long as the drain takes.
    for t in range(4, 64, 2):
        assert machine.step(t, NOT_SERVED, "active") == []
    assert machine.failures == 0
    assert machine.state == State.RECONFIGURING
    # The restart that applies them: watched as any start, then back in rotation.
    assert kinds(machine.step(64, BAD, "deactivating")) == ["unit_transition"]
    assert machine.state == State.STARTING
    assert machine.step(66, BAD, "activating") == []
    assert kinds(machine.step(90, OK, "active")) == ["healthy", "Join"]


def test_a_restart_missed_between_two_probes_is_followed_by_the_first_answer():
    machine = healthy_machine()
    machine.settings_changed(2, ["api_key"])
    actions = machine.step(4, OK, "active")
    assert kinds(actions) == ["healthy", "Join"]
    assert "new settings" in events(actions)[0].message
    assert machine.state == State.HEALTHY


def test_new_settings_nobody_restarts_onto_are_applied_by_a_restart():
    machine = healthy_machine()
    machine.settings_changed(10, ["probe_url", "advertise_url"])
    assert machine.step(610, NOT_SERVED, "active") == []
    actions = machine.step(612, NOT_SERVED, "active")
    assert kinds(actions) == ["Restart", "restart"]
    assert "600s after they changed" in actions[0].reason


def test_a_unit_that_fails_or_stops_while_reconfiguring_is_handled_as_usual():
    machine = healthy_machine()
    machine.settings_changed(2, ["served_name"])
    assert kinds(machine.step(4, BAD, "failed")) == ["Restart", "restart"]
    machine = healthy_machine()
    machine.settings_changed(2, ["served_name"])
    assert kinds(machine.step(4, BAD, "inactive")) == ["stopped"]


def test_new_settings_cancel_a_restart_old_failures_made_due():
    machine = healthy_machine()
    machine.step(2, BAD, "failed")  # restart 1, immediate
    machine.step(4, BAD, "failed")  # failed again: backoff until 14
    assert machine.state == State.BACKOFF
    actions = machine.settings_changed(5, ["served_name"])
    assert kinds(actions) == ["settings_changed"]
    assert "cancelled" in events(actions)[0].message
    assert machine.state == State.RECONFIGURING
    assert machine.restart_at is None
    assert machine.step(14, NOT_SERVED, "active") == []
    assert kinds(machine.step(16, OK, "active")) == ["healthy", "Join"]


@pytest.mark.parametrize("unit_state", ["activating", "inactive"])
def test_a_group_not_running_keeps_its_state_and_is_probed_with_the_new_settings(unit_state):
    machine = GroupMachine(POLICY, 0)
    machine.step(0, BAD, unit_state)
    before = machine.state
    actions = machine.settings_changed(2, ["served_name"])
    assert kinds(actions) == ["settings_changed"]
    assert machine.state == before


def test_a_starting_group_drops_failures_counted_with_the_old_settings():
    machine = GroupMachine(POLICY, 0)
    machine.step(0, BAD, "activating")
    machine.step(2, NOT_SERVED, "active")
    machine.step(4, NOT_SERVED, "active")
    assert machine.failures == 2  # one more and it restarts
    machine.settings_changed(5, ["served_name"])
    assert machine.failures == 0
    assert machine.state == State.STARTING
    assert machine.step(6, BAD, "active") == []
    assert kinds(machine.step(8, OK, "active")) == ["healthy", "Join"]
