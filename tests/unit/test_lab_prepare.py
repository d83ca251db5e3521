"""The lab's prepare: the extra stacks' wheelhouses are built only when asked for."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.support.paths import ROOT
from vllm_fleet.lab import __main__ as lab
from vllm_fleet.lab import promtool, steps
from vllm_fleet.lab.paths import LabPaths


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every step replaced by a recorder: nothing is installed, downloaded or built."""
    seen: list[object] = []
    for name in ("host_packages", "collection", "image", "router_wheelhouses", "agent"):
        monkeypatch.setattr(steps, name, lambda _p, name=name: seen.append(name))
    monkeypatch.setattr(steps, "lab_secrets", lambda _p: seen.append("secrets"))
    monkeypatch.setattr(steps, "wheelhouse", lambda _p, stack: seen.append(("wheelhouse", stack)))
    monkeypatch.setattr(steps, "model", lambda _p: "revision")
    monkeypatch.setattr(lab, "check_pin", lambda _p, _r: None)
    monkeypatch.setattr(promtool, "prepare", lambda _p: seen.append("promtool"))
    return seen


def paths(tmp_path: Path) -> LabPaths:
    return LabPaths(repo=ROOT, cache=tmp_path)


def test_default_prepare_builds_only_the_lab_stack(calls: list[object], tmp_path: Path) -> None:
    timings = lab.prepare(paths(tmp_path), [])
    assert [c for c in calls if isinstance(c, tuple)] == [("wheelhouse", lab.LAB_STACK)]
    assert "wheelhouse-extra" not in timings


def test_wheelhouse_extra_builds_the_extra_stacks_on_demand(
    calls: list[object], tmp_path: Path
) -> None:
    lab.prepare(paths(tmp_path), ["wheelhouse-extra"])
    assert calls == [("wheelhouse", stack) for stack in lab.EXTRA_STACKS]
    calls.clear()
    lab.prepare(paths(tmp_path), ["wheelhouse-extra"], ["cpu-vllm-0.32.0"])
    assert calls == [("wheelhouse", "cpu-vllm-0.32.0")]


def test_extra_stacks_are_cpu_stacks_of_the_catalog() -> None:
    catalog = yaml.safe_load((ROOT / "catalog" / "stacks.yml").read_text())["fleet_stacks"]
    for stack in lab.EXTRA_STACKS:
        assert catalog[stack]["accelerator"] == "cpu"
        assert (ROOT / catalog[stack]["lock"]).is_file()


def test_every_dependency_of_the_agent_is_in_its_hash_lock():
    """Hosts install the agent with --no-deps --require-hashes: a dependency the package
    declares and the lock lacks would fail the install on every host."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {
        re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")
        for requirement in project["dependencies"]
    }
    lock = (ROOT / "catalog/locks/agent-deps.lock").read_text()
    locked = {
        line.split("==", 1)[0].lower()
        for line in lock.splitlines()
        if line and not line.startswith("#")
    }
    assert declared <= locked, declared - locked
