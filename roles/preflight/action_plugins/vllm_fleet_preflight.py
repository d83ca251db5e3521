"""The preflight role's action; its code and tests are vllm_fleet.ansible.preflight_action."""

from __future__ import annotations

from pathlib import Path

from vllm_fleet.ansible.preflight_action import PreflightAction


class ActionModule(PreflightAction):
    # The roles whose argument specs declare the known variables: this bundle's.
    roles_dir = Path(__file__).resolve().parents[2]
