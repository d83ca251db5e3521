"""Run a play of the project's roles on the controller with the real ansible-playbook."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from tests.support.paths import BIN, ROOT

RECAP = re.compile(r"changed=(\d+)")


def run_play(
    tmp_path: Path,
    play: Sequence[Mapping[str, object]],
    *args: str,
    inventory: str = "engine01,",
    local: bool = True,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Write ``play`` to tmp_path/play.yml and run it from tmp_path with the project's roles.

    ``local``: the inventory's hosts are this machine (connection local, this interpreter).
    ``env``: the environment to start from (default: this process's).
    """
    (tmp_path / "play.yml").write_text(yaml.safe_dump(list(play), sort_keys=False))
    environment = {
        **(os.environ if env is None else env),
        "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
        "ANSIBLE_NOCOLOR": "1",
    }
    connection = ["-c", "local", "-e", f"ansible_python_interpreter={sys.executable}"]
    return subprocess.run(
        [
            str(BIN / "ansible-playbook"), "-i", inventory, *(connection if local else []),
            str(tmp_path / "play.yml"), *args,
        ],
        capture_output=True, text=True, env=environment, cwd=tmp_path, check=False,
    )  # fmt: skip


def role_play(name: str, role: str, hosts: str, vars_file: Path | None = None) -> list[dict]:
    """One play applying ``role`` to ``hosts``, with its variables from ``vars_file``."""
    play: dict[str, object] = {"name": name, "hosts": hosts, "gather_facts": False}
    if vars_file is not None:
        play["vars_files"] = [str(vars_file)]
    play["roles"] = [{"role": role}]
    return [play]


def changed_count(stdout: str) -> int:
    """The last PLAY RECAP's changed= count; -1 when the run printed none."""
    counts = [int(n) for n in RECAP.findall(stdout)]
    return counts[-1] if counts else -1


def preflight_plugins_env(tmp_path: Path) -> dict[str, str]:
    """The environment for a bare play in tmp_path that uses preflight's action plugins and
    modules (the deploy lock and lease), this checkout's vllm_fleet on the controller."""
    (tmp_path / "ansible.cfg").write_text("[defaults]\n")
    return dict(
        os.environ,
        ANSIBLE_CONFIG=str(tmp_path / "ansible.cfg"),
        ANSIBLE_ACTION_PLUGINS=str(ROOT / "roles/preflight/action_plugins"),
        ANSIBLE_LIBRARY=str(ROOT / "roles/preflight/library"),
        ANSIBLE_NOCOLOR="1",
        # The plugins import vllm_fleet: this checkout's, not another installed one.
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
    )
