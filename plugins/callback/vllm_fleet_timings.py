"""Seconds per task and per play, as JSON, to find where a run's time goes.

Enabled with ANSIBLE_CALLBACKS_ENABLED=vllm_fleet_timings; writes $VLLM_FLEET_TIMINGS_OUT
when the run ends. The suite's time budget work reads it (tests/lab keeps one per run).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: vllm_fleet_timings
type: aggregate
short_description: seconds per task and per play, as JSON
description:
  - Records when each task started and ended (first host start to last host result).
options:
  out:
    description: Where to write the JSON.
    env:
      - name: VLLM_FLEET_TIMINGS_OUT
requirements:
  - enabled in ANSIBLE_CALLBACKS_ENABLED
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "vllm_fleet_timings"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self._started = time.monotonic()
        self._play = ""
        self._tasks: list[dict[str, Any]] = []
        self._current: dict[str, Any] | None = None

    def _close(self) -> None:
        if self._current is not None:
            self._current["seconds"] = round(time.monotonic() - self._current["start"], 2)
            self._current["start"] = round(self._current["start"] - self._started, 2)
            self._tasks.append(self._current)
            self._current = None

    def v2_playbook_on_play_start(self, play: Any) -> None:
        self._close()
        self._play = play.get_name()

    def v2_playbook_on_task_start(self, task: Any, is_conditional: bool) -> None:
        self._close()
        self._current = {
            "play": self._play,
            "task": task.get_name(),
            "role": task._role.get_name() if task._role else "",
            "start": time.monotonic(),
        }

    def v2_playbook_on_handler_task_start(self, task: Any) -> None:
        self.v2_playbook_on_task_start(task, False)

    def v2_playbook_on_stats(self, stats: Any) -> None:
        self._close()
        out = os.environ.get("VLLM_FLEET_TIMINGS_OUT")
        if not out:
            return
        plays: dict[str, float] = {}
        for entry in self._tasks:
            plays[entry["play"]] = plays.get(entry["play"], 0.0) + entry["seconds"]
        Path(out).write_text(
            json.dumps(
                {
                    "seconds": round(time.monotonic() - self._started, 2),
                    "plays": {k: round(v, 1) for k, v in plays.items()},
                    "tasks": self._tasks,
                },
                indent=1,
            )
        )
