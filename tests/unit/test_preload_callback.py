"""plugins/callback/vllm_fleet_preload: once it has run in the controller's main process, a
worker forked from it templates the roles' filters without loading any plugin or module again
(without it, every worker imported the vllm_fleet package anew: about 0.7 s per task per host).

Each case runs in its own interpreter: Ansible's plugin loaders are process-wide state."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.paths import ROOT

# Loads the bundle's role plugin directories as a playbook's roles do, optionally preloads,
# then forks (as Ansible starts a worker) and templates a role filter in the child: prints the
# modules the child had to import.
SCRIPT = """
import json, os, sys
sys.path.insert(0, {callbacks!r})
from ansible.plugins.loader import add_all_plugin_dirs, init_plugin_loader
init_plugin_loader()
for role in sorted(os.listdir({roles!r})):
    add_all_plugin_dirs(os.path.join({roles!r}, role))
from vllm_fleet_preload import preload
if {preload}:
    preload()
read, write = os.pipe()
if os.fork() == 0:
    from ansible.template import Templar, trust_as_template
    before = set(sys.modules)
    templar = Templar(variables={{"url": "http://10.0.0.1:8000"}})
    port = templar.template(trust_as_template({template!r}))
    new = sorted(set(sys.modules) - before)
    os.write(write, json.dumps({{"port": port, "imported": new}}).encode())
    os._exit(0)
os.close(write)
print(os.read(read, 1 << 20).decode())
"""


def child_imports(preload: bool) -> list[str]:
    script = SCRIPT.format(
        callbacks=str(ROOT / "plugins" / "callback"),
        roles=str(ROOT / "roles"),
        preload=preload,
        # Any filter: the first one a process templates loads them all.
        template="{{ url | urlsplit('port') }}",
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert run.returncode == 0, run.stderr[-3000:]
    child = json.loads(run.stdout)
    assert child["port"] == 8000
    return child["imported"]


@pytest.mark.parametrize("preload", [False, True])
def test_a_forked_worker_loads_no_plugin_once_the_main_process_preloaded(preload):
    loaded = [m for m in child_imports(preload) if m.startswith(("vllm_fleet", "ansible.plugins"))]
    if preload:
        assert loaded == []
    else:
        # What the callback is for: without it the worker imports the roles' plugins and the
        # package behind them for its first filter.
        assert any(m.startswith("vllm_fleet.ansible.") for m in loaded), loaded
