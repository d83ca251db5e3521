"""Testinfra hosts for a Molecule scenario, addressed through podman directly.

testinfra does not map ansible_connection=podman and falls back to its slow ansible
backend; naming the containers as podman:// hosts is about ten times faster.
"""

from __future__ import annotations

import os
from pathlib import Path

import testinfra
import yaml


def podman_hosts() -> list[str]:
    inventory = yaml.safe_load(Path(os.environ["MOLECULE_INVENTORY_FILE"]).read_text())
    return [f"podman://{name}" for name in inventory["all"]["hosts"]]


def podman_host(name: str) -> testinfra.host.Host:
    """One platform of a scenario whose platforms play different parts (router, engine)."""
    target = f"podman://{name}"
    if target not in podman_hosts():
        raise LookupError(f"{name} is not a platform of this scenario: {podman_hosts()}")
    return testinfra.get_host(target)
