"""Action plugin: take (or release) the fleet's deploy lease on the task's host.

Run for each lease host (delegate_to). Reads the host's record with the module
vllm_fleet_deploy_lease_file, decides on the controller (vllm_fleet.deploy.lease.verdict:
this controller can tell whether one of its own runs has ended), then asks the host to swap
the record if it still holds what was read. Never reports a change: the lease is a run's
bookkeeping, released by the run's last play. In check mode it reads and refuses alike,
and writes nothing.
"""

from __future__ import annotations

import time
from typing import Any

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from vllm_fleet.deploy.lease import Lease, Verdict, this_run, verdict
from vllm_fleet.deploy.lock import LockError, playbook_process

display = Display()

MODULE = "vllm_fleet_deploy_lease_file"
WAIT_POLL_SECONDS = 5.0
ARGUMENTS = {
    "path": {"type": "path", "required": True},
    "state": {"type": "str", "default": "present", "choices": ["present", "absent"]},
    "checkout": {"type": "path", "required": True},
    "ttl_seconds": {"type": "int", "default": 21600},
    "wait_seconds": {"type": "int", "default": 0},
    "break_id": {"type": "str", "default": ""},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp: str | None = None, task_vars: dict | None = None) -> dict:
        self._vars = task_vars or {}
        result = super().run(tmp, self._vars)
        _, self._args = self.validate_argument_spec(argument_spec=ARGUMENTS)
        result["changed"] = False
        self._host = self._task.delegate_to or self._vars.get("inventory_hostname", "?")
        try:
            mine = this_run(playbook_process(), self._args["checkout"])
        except (LockError, ValueError) as err:
            return {**result, "failed": True, "msg": str(err)}
        if self._args["state"] == "absent":
            return {**result, **self._release(mine)}
        return {**result, **self._take(mine)}

    def _host_side(self, op: str, **extra: Any) -> dict:
        return self._execute_module(
            module_name=MODULE,
            module_args={"path": self._args["path"], "op": op, **extra},
            task_vars=self._vars,
        )

    def _release(self, mine: Lease) -> dict:
        if self._play_context.check_mode:
            return {"msg": "check mode: a check run holds no deploy lease"}
        released = self._host_side("release", expect=mine.id)
        if released.get("failed"):
            return released
        done = "released" if released.get("released") else "not this run's; left as it is"
        return {"msg": f"deploy lease on {self._host} {done}", "released": released["released"]}

    def _decide(self, mine: Lease) -> tuple[dict, Lease | None, Verdict]:
        """The host's record and the verdict on it, waiting up to wait_seconds for a refusal."""
        began = time.monotonic()
        told = False
        while True:
            read = self._host_side("read")
            current = None if read.get("failed") else Lease.from_record(read.get("lease"))
            if read.get("failed"):
                return read, current, Verdict(False, read.get("msg", "the lease was unreadable"))
            decision = verdict(current, mine, self._host, float(read["now"]),
                               break_id=self._args["break_id"])  # fmt: skip
            waited = time.monotonic() - began
            if decision.take or waited >= self._args["wait_seconds"]:
                return read, current, decision
            if not told:
                display.display(f"{decision.why}; waiting up to {self._args['wait_seconds']} s")
                told = True
            time.sleep(WAIT_POLL_SECONDS)

    def _take(self, mine: Lease) -> dict:
        read, current, decision = self._decide(mine)
        if not decision.take:
            return {"failed": True, "msg": decision.why, "lease": read.get("lease")}
        taken = self._host_side(
            "take",
            expect=current.id if current else "",
            record=mine.record(),
            ttl_seconds=self._args["ttl_seconds"],
        )
        if taken.get("failed"):
            return taken
        unwritten = " (check mode: not written)" if self._play_context.check_mode else ""
        return {
            "msg": f"deploy lease on {self._host}: {decision.why}{unwritten}",
            "lease": taken.get("lease"),
            "replaced": taken.get("replaced"),
        }
