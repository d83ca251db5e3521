"""Holding an engine group out of the routers.

An upgrade drains a group, restarts it on its new configuration and checks it directly
before clients reach it again. While a hold file exists for a group, neither the engine
(on becoming ready) nor the host's watchdog (reconciling registrations) adds it to a
router, and the watchdog removes it if it is listed. The file lives on disk, not in /run:
a host that reboots mid-upgrade keeps an unverified group out of rotation.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

HOLD_DIR_ENV = "VLLM_FLEET_HOLD_DIR"
DEFAULT_HOLD_DIR = Path("/var/lib/vllm-fleet/hold")


def hold_dir() -> Path:
    return Path(os.environ.get(HOLD_DIR_ENV) or DEFAULT_HOLD_DIR)


def hold_path(group: str) -> Path:
    return hold_dir() / group


def is_held(group: str) -> bool:
    return hold_path(group).exists()


def held_since(group: str) -> float | None:
    """When the hold was put in place (epoch seconds); None when the group is not held.

    The file's mtime rather than its "since": ``hold`` rewrites the file each time it holds,
    and the upgrade role writes new groups' holds itself, without a "since".
    """
    try:
        return hold_path(group).stat().st_mtime
    except OSError:  # absent, or unreadable: is_held says not held then too
        return None


def hold(group: str, reason: str) -> bool:
    """Put the hold in place; True if it was not there before."""
    path = hold_path(group)
    existed = path.exists()
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    path.write_text(json.dumps({"reason": reason, "since": time.time()}) + "\n")
    return not existed


def release(group: str) -> bool:
    """Remove the hold; True if there was one."""
    try:
        hold_path(group).unlink()
    except FileNotFoundError:
        return False
    return True
