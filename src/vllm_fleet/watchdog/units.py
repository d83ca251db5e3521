"""The engine groups' systemd units, through systemctl (argv lists, bounded in time)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

Runner = Callable[..., subprocess.CompletedProcess[str]]


class UnitError(Exception):
    pass


@dataclass(frozen=True)
class UnitStatus:
    active_state: str  # active, activating, deactivating, inactive, failed, reloading
    sub_state: str = ""


class Units(Protocol):
    def status(self, unit: str) -> UnitStatus: ...

    def restart(self, unit: str) -> None:
        """Kill the group's processes, order a restart and return at once; the caller
        watches the unit start."""
        ...


class SystemctlUnits:
    def __init__(
        self, systemctl: str = "systemctl", timeout: float = 10.0, run: Runner = subprocess.run
    ) -> None:
        self.systemctl = systemctl
        self.timeout = timeout
        self._run = run

    def _call(self, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [self.systemctl, *args]
        try:
            return self._run(argv, capture_output=True, text=True, timeout=self.timeout)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise UnitError(f"{' '.join(argv)}: {err}") from None

    def _checked(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = self._call(*args)
        if done.returncode != 0:
            detail = " ".join((done.stderr or done.stdout).split())[:200]
            raise UnitError(f"systemctl {' '.join(args)}: exit {done.returncode}: {detail}")
        return done

    def status(self, unit: str) -> UnitStatus:
        # Key=Value lines: with --value, systemctl prints in its own order, not ours.
        done = self._checked("show", "--property=ActiveState,SubState", "--", unit)
        values = dict(line.partition("=")[::2] for line in done.stdout.splitlines())
        if not values.get("ActiveState"):
            raise UnitError(f"systemctl show {unit}: no ActiveState in {done.stdout!r}")
        return UnitStatus(values["ActiveState"], values.get("SubState", ""))

    def restart(self, unit: str) -> None:
        # A group the watchdog restarts has stopped answering: a graceful stop would wait
        # the whole shutdown timeout for requests that will never finish. engine-run, asked
        # to abort (SIGUSR1), kills vLLM at once, so its connections close and the routers
        # retry those requests on other engines; it reaps every process itself, so the stop
        # ends even where systemd is not told that a cgroup emptied (containers on cgroup
        # v1). Nothing to abort when the unit has already failed: that error is no error.
        self._call("kill", "--kill-whom=main", "--signal=SIGUSR1", "--", unit)
        # The watchdog decides about restarts; systemd's own start limit must not mask that.
        self._call("reset-failed", "--", unit)
        self._checked("restart", "--no-block", "--", unit)
