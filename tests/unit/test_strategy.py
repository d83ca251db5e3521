"""ansible.cfg runs every play under Mitogen (plugins/strategy/mitogen_linear.py): the tasks
of a run reach each host through one interpreter kept for the whole run, not one started per
task. Seen from the host: two commands of one play have the same parent process, where
Ansible's own linear strategy gives each its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.support.paths import ROOT

PLAY = [
    {
        "hosts": "localhost",
        "gather_facts": False,
        "tasks": [
            {"name": f"parent {n}", "ansible.builtin.command": "sh -c 'echo $PPID'",
             "register": f"parent{n}", "changed_when": False}
            for n in (1, 2)
        ]
        + [{"name": "cpus", "ansible.builtin.command":
            "python3 -c 'import os; print(len(os.sched_getaffinity(0)))'",
            "register": "cpus", "changed_when": False},
           {"name": "report", "ansible.builtin.debug":
            {"msg": "parents {{ parent1.stdout }} {{ parent2.stdout }} cpus {{ cpus.stdout }}"}}],
    }
]  # fmt: skip


def parents(tmp_path: Path, strategy: str | None) -> tuple[str, str, int]:
    """The parent process of two commands of one play, and how many CPUs a third may use."""
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump(PLAY, sort_keys=False))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    env.pop("ANSIBLE_STRATEGY", None)
    if strategy is not None:
        env["ANSIBLE_STRATEGY"] = strategy
    run = subprocess.run(
        # The controller's own interpreter, as for Ansible's implicit localhost.
        ["ansible-playbook", "-i", "localhost,", "-c", "local", str(play),
         "-e", f"ansible_python_interpreter={sys.executable}"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    line = next(x for x in run.stdout.splitlines() if "parents " in x)
    first, second, _, cpus = line.split("parents ", 1)[1].strip().strip("\"'").split()
    return first, second, int(cpus)


def test_the_configured_strategy_keeps_one_interpreter_for_the_run(tmp_path: Path) -> None:
    first, second, _ = parents(tmp_path, None)
    assert first == second, "ansible.cfg's strategy started an interpreter per task"


def test_what_a_task_starts_may_use_every_cpu(tmp_path: Path) -> None:
    """Mitogen's own policy would leave a task's processes one CPU of a 2-core controller."""
    _, _, cpus = parents(tmp_path, None)
    assert cpus == len(os.sched_getaffinity(0))


def test_ansibles_own_strategy_starts_one_per_task(tmp_path: Path) -> None:
    """The check above can fail: without Mitogen the parents differ."""
    first, second, _ = parents(tmp_path, "linear")
    assert first != second
