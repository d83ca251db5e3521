"""Events for the journal: one JSON object a line on stdout, with a syslog priority.

journald reads the ``<N>`` prefix as the line's priority (SyslogLevelPrefix= defaults to
on), so ``journalctl -p err -u vllm-fleet-watchdog`` finds the groups it gave up on.
"""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from vllm_fleet.watchdog.state import Level

PRIORITY: dict[Level, int] = {"error": 3, "warning": 4, "info": 6}


def format_event(
    level: Level,
    event: str,
    message: str,
    *,
    group: str | None = None,
    state: str | None = None,
    **fields: Any,
) -> str:
    record = {"event": event, "group": group, "state": state, "message": message, **fields}
    return f"<{PRIORITY[level]}>{json.dumps(record, default=str)}"


def emit(
    level: Level,
    event: str,
    message: str,
    *,
    group: str | None = None,
    state: str | None = None,
    out: TextIO | None = None,
    **fields: Any,
) -> None:
    stream = out or sys.stdout
    stream.write(format_event(level, event, message, group=group, state=state, **fields) + "\n")
    stream.flush()
