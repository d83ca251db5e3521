"""The fleet's deploy lease: one run that changes hosts at a time, whichever controller runs it.

The controller's lock (vllm_fleet.deploy.lock) keeps two runs of one checkout apart; two
operators with their own checkouts, or a GitOps job beside an operator, share only the hosts.
So preflight also takes a lease on the fleet's lease hosts (the routers by default): a record
in a file on each naming the run, with an expiry on that host's clock. A run finds it:

- free, expired, or its own: it takes (renews) it;
- held by a run of this controller that has ended without releasing it (a failed or killed
  run): it takes it over, since this controller can see that process is gone;
- held by a run the operator names in ``preflight_deploy_lease_break``: it takes it over;
- held by any other run: refused, naming the run, where it came from, and when it expires.

The last play of site.yml and upgrade.yml releases it. The decision is made here, on the
controller; the host side (roles/preflight/library/vllm_fleet_deploy_lease_file.py) only reads
the record and swaps it when it still holds what was read.
"""

from __future__ import annotations

import getpass
import os
import socket
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from vllm_fleet.deploy.lock import alive, cmdline, playbooks_of, start_ticks, utc_iso


@dataclass(frozen=True)
class Lease:
    """A run's claim on the fleet, as a lease host records it."""

    id: str  # controller:pid:start ticks, unique to one ansible-playbook process
    controller: str
    user: str
    pid: int
    start_ticks: int
    playbooks: list[str]
    checkout: str
    taken_at: float = 0.0  # the lease host's clock
    expires_at: float = 0.0

    @classmethod
    def from_record(cls, record: dict[str, Any] | None) -> Lease | None:
        if not record:
            return None
        try:
            return cls(
                id=str(record["id"]),
                controller=str(record.get("controller", "?")),
                user=str(record.get("user", "?")),
                pid=int(record.get("pid", 0)),
                start_ticks=int(record.get("start_ticks", 0)),
                playbooks=[str(p) for p in record.get("playbooks", [])],
                checkout=str(record.get("checkout", "?")),
                taken_at=float(record.get("taken_at", 0.0)),
                expires_at=float(record.get("expires_at", 0.0)),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def record(self) -> dict[str, Any]:
        """What this run asks the host to write (the host adds its own times)."""
        fields = asdict(self)
        del fields["taken_at"], fields["expires_at"]
        return fields

    def describe(self, now: float) -> str:
        what = f" ({' '.join(self.playbooks)})" if self.playbooks else ""
        left = max(self.expires_at - now, 0)
        return (
            f"ansible-playbook pid {self.pid}{what} by {self.user}@{self.controller} from "
            f"{self.checkout}, taken {utc_iso(self.taken_at)}, expires in {left / 60:.0f} min "
            f"(lease id {self.id})"
        )

    def ended_here(self) -> bool:
        """Whether this lease's run was on this controller and has ended."""
        return self.controller == socket.gethostname() and not alive(self.pid, self.start_ticks)


def this_run(owner: int, checkout: str) -> Lease:
    """The lease the ansible-playbook process ``owner`` asks for."""
    ticks = start_ticks(owner)
    if ticks is None:
        raise ValueError(f"the ansible-playbook process {owner} has exited")
    controller = socket.gethostname()
    return Lease(
        id=f"{controller}:{owner}:{ticks}",
        controller=controller,
        user=getpass.getuser(),
        pid=owner,
        start_ticks=ticks,
        playbooks=playbooks_of(cmdline(owner)),
        checkout=os.path.abspath(checkout),
    )


@dataclass(frozen=True)
class Verdict:
    take: bool
    why: str


def verdict(
    current: Lease | None,
    mine: Lease,
    host: str,
    now: float,
    *,
    break_id: str = "",
    ended: Callable[[Lease], bool] = Lease.ended_here,
) -> Verdict:
    """Whether ``mine`` may take the lease ``current`` that ``host`` holds at its time ``now``."""
    if current is None:
        return Verdict(True, "free")
    if current.id == mine.id:
        return Verdict(True, "renewed (this run took it earlier)")
    if current.expires_at <= now:
        return Verdict(True, f"taken over from an expired lease: {current.describe(now)}")
    if ended(current):
        return Verdict(True, f"taken over from a run of this controller that ended: {current.id}")
    if break_id and break_id == current.id:
        return Verdict(True, f"broken as preflight_deploy_lease_break asked: {current.id}")
    return Verdict(
        False,
        f"{host} holds the deploy lease of another run: {current.describe(now)}. Wait for that "
        "run to end (its last play releases the lease), or, once you know it is gone, run again "
        f"with -e preflight_deploy_lease_break={current.id}",
    )
