"""The lab's and Molecule's connection: what one Ansible task costs through each way in.

    python bench/connection_bench.py                # 3 rounds of a 30-task playbook
    python bench/connection_bench.py --rounds 2 --tasks 12   # quick (make bench-check)

One throwaway container from the lab image, one playbook of small tasks (command, stat, copy,
template, fetch: the module, put and fetch paths), run side by side in one process, the arms
interleaved round by round (medians):

- ``collection``: containers.podman.podman under Ansible's linear strategy, as shipped (no
  pipelining: a temporary directory, the module copied in through a ``podman mount``, run,
  cleaned up: about four podman calls a task);
- ``mitogen``: podman under ansible.cfg's strategy (plugins/strategy/mitogen_linear.py), as the
  lab and Molecule's scenario plays run it: one interpreter in the container for the whole
  run, every module run in it.

Target: ``mitogen`` costs at most 0.3x of ``collection`` per task. A missed target is printed
as MISSED; only a failed playbook makes the exit status non-zero.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "localhost/vllm-fleet-lab:bookworm"
NAME = "vf-connection-bench"
TARGET = 0.3
ARMS = {
    "collection": {"ansible_connection": "containers.podman.podman"},
    "mitogen": {"ansible_connection": "podman"},
}
# ansible.cfg names Mitogen's strategy; the collection's arm runs under Ansible's own.
STRATEGY = {"collection": "linear", "mitogen": "mitogen_linear"}
# The kinds of task a converged site.yml is made of, in turn.
KINDS = [
    {"ansible.builtin.command": "true", "changed_when": False},
    {"ansible.builtin.stat": {"path": "/etc/hostname"}},
    {"ansible.builtin.copy": {"content": "x\n", "dest": "/root/bench-copy", "mode": "0644"}},
    {"ansible.builtin.template": {"src": "{{ template }}", "dest": "/root/bench-template",
                                  "mode": "0644"}},
    {"ansible.builtin.fetch": {"src": "/etc/os-release", "dest": "{{ fetched }}/", "flat": True}},
]  # fmt: skip


def write_playbook(work: Path, tasks: int) -> Path:
    (work / "bench.j2").write_text("{{ inventory_hostname }}\n")
    (work / "fetched").mkdir()
    play = {
        "hosts": NAME,
        "gather_facts": False,
        "vars": {"template": str(work / "bench.j2"), "fetched": str(work / "fetched")},
        "tasks": [KINDS[i % len(KINDS)] for i in range(tasks)],
    }
    path = work / "bench.yml"
    path.write_text(yaml.safe_dump([play], sort_keys=False))
    return path


def write_inventory(work: Path, arm: str) -> Path:
    path = work / f"{arm.replace(' ', '-')}.yml"
    host_vars = {"ansible_python_interpreter": "/usr/bin/python3", **ARMS[arm]}
    path.write_text(yaml.safe_dump({"all": {"hosts": {NAME: host_vars}}}))
    return path


def run(playbook: Path, inventory: Path, strategy: str) -> float:
    started = time.monotonic()
    proc = subprocess.run(
        ["ansible-playbook", "-i", str(inventory), str(playbook)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env={
            **os.environ,
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "ANSIBLE_STRATEGY": strategy,
        },
    )
    if proc.returncode != 0:
        sys.exit(f"{inventory.stem}: the playbook failed:\n{proc.stdout[-3000:]}{proc.stderr}")
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=30)
    args = parser.parse_args()
    subprocess.run(["podman", "rm", "--force", NAME], capture_output=True, check=False)
    subprocess.run(
        ["podman", "run", "--detach", "--name", NAME, "--network", "none", IMAGE,
         "sleep", "infinity"],
        check=True, capture_output=True,
    )  # fmt: skip
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            playbook = write_playbook(work, args.tasks)
            # One task alone: the playbook's own start, taken off every arm's per-task cost.
            (work / "single").mkdir()
            single = write_playbook(work / "single", 1)
            inventories = {arm: write_inventory(work, arm) for arm in ARMS}
            seconds: dict[str, list[float]] = {arm: [] for arm in ARMS}
            starts: dict[str, list[float]] = {arm: [] for arm in ARMS}
            for _ in range(args.rounds):
                for arm in ARMS:
                    starts[arm].append(run(single, inventories[arm], STRATEGY[arm]))
                    seconds[arm].append(run(playbook, inventories[arm], STRATEGY[arm]))
    finally:
        subprocess.run(["podman", "rm", "--force", NAME], capture_output=True, check=False)
    per_task = {
        arm: (statistics.median(seconds[arm]) - statistics.median(starts[arm])) / (args.tasks - 1)
        for arm in ARMS
    }
    cores = os.cpu_count()
    print(f"{args.tasks} tasks, {args.rounds} rounds, medians (one container, {cores} cores)")
    print(f"{'arm':12s} {'playbook s':>10s} {'per task s':>10s}")
    for arm in ARMS:
        print(f"{arm:12s} {statistics.median(seconds[arm]):10.1f} {per_task[arm]:10.3f}")
    ratio = per_task["mitogen"] / per_task["collection"]
    verdict = "met" if ratio <= TARGET else "MISSED"
    print(f"mitogen / collection per task: {ratio:.2f} (target <= {TARGET}: {verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
