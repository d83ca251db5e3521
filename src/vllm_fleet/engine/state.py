"""What a host's engine groups actually run, read from the host itself.

A playbook run that dies after rendering new settings but before restarting the group leaves
files on disk that the running process never read; the next run renders nothing new and would
see no change. So what must restart is decided here, from the host: a group whose unit is not
active, or whose settings, secrets, unit file or unit drop-ins were written after its process
started, runs something other than what its files say. Likewise a hold left by a run that never reached its
release (``upgrade ...`` or ``rollout ...`` reasons) is known from the hold file itself.

Read-only: it changes nothing, so it is safe in ``--check`` runs.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from vllm_fleet.router import hold

# Reasons the playbooks give their holds (roles/fleet_upgrade, vllm_fleet.router.traffic callers).
# Any other reason is an operator's own hold (maintenance): reported, never lifted by a run.
RUN_HOLD_PREFIXES = ("upgrade ", "rollout ")
UNIT_TEMPLATE = "vllm-engine@{group}.service"
STOPPED_STATES = frozenset({"inactive", "failed", "unknown"})

Runner = Callable[..., subprocess.CompletedProcess[str]]


@dataclass
class HoldInfo:
    reason: str
    since: float | None
    by_run: bool  # put there by a playbook run (not an operator)


@dataclass
class GroupState:
    group: str
    active_state: str
    # CLOCK_MONOTONIC microseconds when the unit's main process started; 0 when none runs.
    started_monotonic_us: int
    # The group's files (and the unit file) written after its process started.
    newer_than_process: list[str] = field(default_factory=list)
    hold: HoldInfo | None = None

    @property
    def pending_restart(self) -> bool:
        # "activating" is a start already under way (the watchdog's, say): not stale.
        return self.active_state in STOPPED_STATES or bool(self.newer_than_process)


@dataclass
class HostEngineState:
    groups: dict[str, GroupState]

    @property
    def pending_restart(self) -> list[str]:
        return sorted(g for g, s in self.groups.items() if s.pending_restart)

    @property
    def run_holds(self) -> list[str]:
        """Groups held by a run that did not finish (the deploy lock says none is running)."""
        return sorted(g for g, s in self.groups.items() if s.hold is not None and s.hold.by_run)

    @property
    def operator_holds(self) -> list[str]:
        return sorted(g for g, s in self.groups.items() if s.hold is not None and not s.hold.by_run)

    def to_json(self) -> str:
        data = {
            "groups": {name: asdict(state) for name, state in sorted(self.groups.items())},
            "pending_restart": self.pending_restart,
            "run_holds": self.run_holds,
            "operator_holds": self.operator_holds,
        }
        return json.dumps(data, indent=2, sort_keys=True)


def unit_process(unit: str, run: Runner = subprocess.run) -> tuple[str, int]:
    """(ActiveState, main process start on CLOCK_MONOTONIC in µs) of a unit."""
    done = run(
        [
            "systemctl",
            "show",
            "--property=ActiveState,ExecMainStartTimestampMonotonic",
            "--",
            unit,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    values = dict(line.partition("=")[::2] for line in done.stdout.splitlines())
    started = values.get("ExecMainStartTimestampMonotonic", "0") or "0"
    return values.get("ActiveState", "unknown") or "unknown", int(started)


def _mtime_monotonic_us(path: Path, wall_now: float, mono_now: float) -> int | None:
    """A file's mtime on CLOCK_MONOTONIC (µs), to compare with systemd's start timestamps."""
    try:
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        return None
    return int((mono_now - (wall_now - mtime)) * 1_000_000)


def read_hold(group: str) -> HoldInfo | None:
    path = hold.hold_path(group)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as err:
        return HoldInfo(reason=f"unreadable hold file: {err}", since=None, by_run=False)
    try:
        data = json.loads(text)
    except ValueError:
        data = {}
    if not isinstance(data, dict):
        data = {}
    reason = str(data.get("reason", ""))
    since = data.get("since")
    if not isinstance(since, int | float):
        since = path.stat().st_mtime
    return HoldInfo(reason=reason, since=float(since), by_run=reason.startswith(RUN_HOLD_PREFIXES))


def group_state(
    group: str,
    config_dir: Path,
    unit_file: Path,
    *,
    run: Runner = subprocess.run,
    wall_clock: Callable[[], float] = time.time,
    mono_clock: Callable[[], float] = time.monotonic,
) -> GroupState:
    active, started = unit_process(UNIT_TEMPLATE.format(group=group), run)
    wall_now, mono_now = wall_clock(), mono_clock()
    newer = []
    if started > 0:
        dropins = sorted(unit_file.parent.glob(f"{UNIT_TEMPLATE.format(group=group)}.d/*.conf"))
        for path in (
            config_dir / f"{group}.json",
            config_dir / f"{group}.env",
            unit_file,
            *dropins,
        ):
            written = _mtime_monotonic_us(path, wall_now, mono_now)
            if written is not None and written > started:
                newer.append(path.name)
    return GroupState(group, active, started, newer, read_hold(group))


def host_state(
    config_dir: Path, unit_file: Path, groups: list[str] | None = None, run: Runner = subprocess.run
) -> HostEngineState:
    """Every group configured in ``config_dir`` (and any named in ``groups``)."""
    names = {p.stem for p in config_dir.glob("*.json")} if config_dir.is_dir() else set()
    names.update(groups or [])
    return HostEngineState(
        {name: group_state(name, config_dir, unit_file, run=run) for name in sorted(names)}
    )
