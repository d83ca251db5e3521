"""The roles' filter plugins are shims over vllm_fleet.ansible, and every filter the roles and
playbooks use resolves, through Ansible's own plugin loader, to a builtin or to a shim.

A filter renamed or moved in the package but not in a task would otherwise surface only when
that task runs on a host (in Molecule or the lab, or in production).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator
from pathlib import Path

import jinja2.filters
import pytest
import yaml
from ansible.plugins.loader import filter_loader, init_plugin_loader

from tests.support.paths import ROOT

SHIMS = sorted(ROOT.glob("roles/*/filter_plugins/*.py"))
# Keys whose whole value Ansible evaluates as a Jinja expression (no braces).
EXPRESSION_KEYS = {"when", "that", "changed_when", "failed_when", "until"}
JINJA_BLOCK = re.compile(r"\{\{(.*?)\}\}|\{%(.*?)%\}", re.S)
QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
FILTER_USE = re.compile(r"\|\s*([A-Za-z_][\w.]*)")


def strings(node: object, key: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(node, str):
        yield key, node
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from strings(v, str(k))
    elif isinstance(node, list):
        for item in node:
            yield from strings(item, key)


def expressions(path: Path) -> Iterator[str]:
    text = path.read_text()
    if path.suffix == ".j2":
        for match in JINJA_BLOCK.finditer(text):
            yield match.group(1) or match.group(2)
        return
    for doc in yaml.safe_load_all(text):
        for key, value in strings(doc):
            if key in EXPRESSION_KEYS:
                yield value
            for match in JINJA_BLOCK.finditer(value):
                yield match.group(1) or match.group(2)


def used_filters() -> dict[str, set[str]]:
    files = [
        *ROOT.glob("roles/*/tasks/*.yml"),
        *ROOT.glob("roles/*/handlers/*.yml"),
        *ROOT.glob("roles/*/defaults/*.yml"),
        *ROOT.glob("roles/*/vars/*.yml"),
        *ROOT.glob("roles/*/templates/**/*.j2"),
        *ROOT.glob("playbooks/*.yml"),
        ROOT / "site.yml",
    ]
    used: dict[str, set[str]] = {}
    for path in files:
        for expression in expressions(path):
            for name in FILTER_USE.findall(QUOTED.sub("''", expression)):
                used.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return used


@pytest.mark.parametrize("shim", SHIMS, ids=lambda p: p.parts[-3])
def test_each_role_filter_file_is_a_shim_over_its_package_module(shim: Path) -> None:
    role = shim.parts[-3]
    text = shim.read_text()
    assert f"from vllm_fleet.ansible.{role} import FILTERS" in text
    assert len(text.splitlines()) <= 12, f"{shim}: logic belongs in vllm_fleet.ansible.{role}"
    module = importlib.import_module(f"vllm_fleet.ansible.{role}")
    assert module.FILTERS, f"vllm_fleet.ansible.{role} declares no filter"
    for name, function in module.FILTERS.items():
        assert name.startswith(f"{role}_"), f"{name}: a filter of {role} is named {role}_..."
        assert callable(function)


@pytest.fixture(scope="module")
def loader() -> object:
    """Ansible's filter loader (initialised once per process), seeing every role's shim."""
    init_plugin_loader()
    for shim in SHIMS:
        filter_loader.add_directory(str(shim.parent))
    return filter_loader


def test_every_filter_the_roles_and_playbooks_use_resolves(loader) -> None:
    used = used_filters()
    assert "vllm_engine_router_args" in used  # the scan does find the roles' own filters
    missing = {
        name: sorted(where)
        for name, where in used.items()
        if name not in jinja2.filters.FILTERS and not filter_loader.get(name)
    }
    assert not missing, f"filters no plugin provides: {missing}"


def test_the_scan_sees_a_filter_that_does_not_exist(tmp_path: Path, loader) -> None:
    task = tmp_path / "main.yml"
    task.write_text(
        "- name: Use a filter nobody provides\n"
        "  ansible.builtin.set_fact:\n"
        "    x: \"{{ 'a|b' | no_such_filter }}\"\n"
        "  when: y | other_missing_filter\n"
    )
    names = {n for e in expressions(task) for n in FILTER_USE.findall(QUOTED.sub("''", e))}
    assert names == {"no_such_filter", "other_missing_filter"}
    assert not filter_loader.get("no_such_filter")
