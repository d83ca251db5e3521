#!/usr/bin/python
"""Ansible module: read, take or release the deploy lease file on a host (the host's Python)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_fleet_deploy_lease_file
short_description: The host side of the fleet's deploy lease (compare-and-swap on one file)
description:
  - Runs with the host's own Python before anything of the fleet is installed (stdlib only).
  - The decision whether a run may take the lease is the controller's (action plugin
    C(vllm_fleet_deploy_lease)); this module only reads the record, or replaces it when it
    still holds what the controller read (I(expect)), under an flock on I(path).lock, so two
    controllers that read the same record cannot both take it.
  - "Expiry uses the host's clock: C(taken_at) and C(expires_at) are written here."
  - In check mode it reads only.
options:
  path: {description: The lease file., type: path, required: true}
  op: {description: What to do., type: str, required: true, choices: [read, take, release]}
  expect: {description: "The id of the lease the controller read (empty: none); a take or release that finds another changes nothing and fails (take) or does nothing (release).", type: str, default: ""}
  record: {description: "This run's record (take): id, controller, user, pid, start_ticks, playbooks, checkout.", type: dict}
  ttl_seconds: {description: "How long the lease holds without a renewal (take).", type: int, default: 21600}
"""

import fcntl
import json
import os
import time

from ansible.module_utils.basic import AnsibleModule


def read_lease(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as handle:
            lease = json.load(handle)
    except (OSError, ValueError):
        return None
    return lease if isinstance(lease, dict) and lease.get("id") else None


def write_lease(path: str, lease: dict) -> None:
    """Whole or not at all: a crash mid-write leaves the previous record."""
    staging = f"{path}.new"
    with open(staging, "w", encoding="utf-8") as handle:
        json.dump(lease, handle)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    # No secret in it (no -e values); readable so an operator sees who holds the fleet.
    os.chmod(staging, 0o644)
    os.replace(staging, path)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "op": {"type": "str", "required": True, "choices": ["read", "take", "release"]},
            "expect": {"type": "str", "default": ""},
            "record": {"type": "dict"},
            "ttl_seconds": {"type": "int", "default": 21600},
        },
        required_if=[("op", "take", ["record"])],
        supports_check_mode=True,
    )
    path, op, expect = module.params["path"], module.params["op"], module.params["expect"]
    if op == "read" or module.check_mode:
        module.exit_json(changed=False, lease=read_lease(path), now=time.time())
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    with open(f"{path}.lock", "a", encoding="utf-8") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        current = read_lease(path)
        current_id = current["id"] if current else ""
        now = time.time()
        if op == "release":
            released = bool(expect) and current_id == expect
            if released:
                os.unlink(path)
            # Bookkeeping of a run, not host configuration: never a change (like the
            # controller's lock), so a converged fleet's second run reports none.
            module.exit_json(changed=False, released=released, lease=current, now=now)
        mine = module.params["record"]["id"]
        if current_id not in {expect, mine}:
            module.fail_json(
                msg="another run took the deploy lease between reading and taking it",
                lease=current,
                now=now,
            )
        lease = dict(module.params["record"], taken_at=now)
        lease["expires_at"] = now + module.params["ttl_seconds"]
        write_lease(path, lease)
    module.exit_json(changed=False, lease=lease, replaced=current, now=now)


if __name__ == "__main__":
    main()
