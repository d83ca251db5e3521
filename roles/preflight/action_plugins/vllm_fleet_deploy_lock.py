"""Action plugin: take the controller's deploy lock for this ansible-playbook run.

Preflight's first task, run once on the controller: a second run that changes hosts, started
while one holds the lock, fails here before it touches any host, naming the run that holds
it. The lock frees itself when the holding ansible-playbook process exits (see
vllm_fleet.deploy.lock). Changes no host, and works the same with --check: a check run beside
a real one would report changes that are being made under it.
"""

from __future__ import annotations

from dataclasses import asdict

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from vllm_fleet.deploy.lock import Holder, LockError, acquire, playbook_process

display = Display()

ARGUMENTS = {
    "path": {"type": "path", "required": True},
    "wait_seconds": {"type": "int", "default": 0},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True

    def run(self, tmp: str | None = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars or {})
        _, args = self.validate_argument_spec(argument_spec=ARGUMENTS)
        result["changed"] = False
        wait_seconds = max(args["wait_seconds"], 0)

        def waiting(holder: Holder | None) -> None:
            who = holder.describe() if holder else "another run"
            display.display(
                f"deploy lock {args['path']} is held by {who}; waiting up to {wait_seconds} s"
            )

        try:
            outcome = acquire(args["path"], playbook_process(), wait_seconds, waiting)
        except LockError as err:
            result.update(failed=True, msg=str(err))
            return result
        except OSError as err:
            # An unwritable lock directory, say: a finding to fix, not a traceback.
            result.update(
                failed=True,
                msg=f"cannot take the deploy lock {args['path']}: {err}; set "
                "preflight_deploy_lock_path to a file in a directory this user can write",
            )
            return result
        state = "already held by this run" if outcome.already_held else "taken"
        result.update(
            msg=f"deploy lock {outcome.path} {state}: {outcome.holder.describe()}",
            path=str(outcome.path),
            holder=asdict(outcome.holder),
            waited_seconds=round(outcome.waited, 1),
        )
        return result
