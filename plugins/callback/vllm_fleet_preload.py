"""Load the filter and test plugins once, in the controller's main process.

Ansible runs each task on each host in a worker forked from the main process, and a worker
loads every filter and test plugin the first time it templates a filter (the roles' filter
plugins import the vllm_fleet package). The main process does not load them first, so every
worker did it again: about 0.7 s of CPU per task per host, which was most of a converged
site.yml run's time. Loaded here, before each task's workers are forked, they inherit them.
"""

from __future__ import annotations

from typing import Any

from ansible.plugins.callback import CallbackBase
from ansible.plugins.loader import filter_loader, test_loader

DOCUMENTATION = """
name: vllm_fleet_preload
type: aggregate
short_description: load the Jinja filter and test plugins before the workers fork
description:
  - Before each task, makes sure the filter and test plugins are loaded in the main process
    (a role loaded since may have added a plugin directory, which empties the loader's cache),
    so the workers forked for the task inherit them instead of each loading them again.
requirements:
  - enabled in ANSIBLE_CALLBACKS_ENABLED
"""


def preload() -> None:
    """Fill the loaders' caches (each call is a no-op while they are full)."""
    for loader in (filter_loader, test_loader):
        for _ in loader.all():
            pass


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "vllm_fleet_preload"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_start(self, playbook: Any) -> None:
        preload()

    def v2_playbook_on_task_start(self, task: Any, is_conditional: bool) -> None:
        preload()

    def v2_playbook_on_handler_task_start(self, task: Any) -> None:
        preload()
