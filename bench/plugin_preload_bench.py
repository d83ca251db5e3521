"""What a task costs the controller with and without plugins/callback/vllm_fleet_preload.

    python bench/plugin_preload_bench.py                # 3 rounds of 30 tasks on 4 hosts
    python bench/plugin_preload_bench.py --rounds 2 --tasks 12   # quick (make bench-check)

Ansible forks a worker for each task and host. Unless the main process has loaded the filter
plugins, each worker loads all of them (the bundle's roles' filters import the vllm_fleet
package) the first time it templates a filter. One playbook of tasks that template a filter
(skipped ones and debug ones: no module runs, so what is left is the controller's own cost),
on four local hosts with the bundle's roles' filter plugins on the path, run side by side with
the callback enabled and not, the arms interleaved round by round (medians).

Target: with the preload a task costs at most 0.5x of one without. A missed target is printed
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
TARGET = 0.5
HOSTS = 4
# Both arms enable a callback, so they differ in the preload alone.
ARMS = {
    "without": "vllm_fleet_timings",
    "with vllm_fleet_preload": "vllm_fleet_timings,vllm_fleet_preload",
}
# A conditional and a message, each templating a filter, as most of a role's tasks do.
KINDS = [
    {"ansible.builtin.command": "true", "when": "(fleet_accelerator | default('')) == 'cuda'"},
    {"ansible.builtin.debug": {"msg": "{{ inventory_hostname | upper }}"}},
]


def write_files(work: Path, tasks: int) -> tuple[Path, Path]:
    play = [
        {
            "name": "Bench",
            "hosts": "all",
            "gather_facts": False,
            "tasks": [{"name": f"task {i}", **KINDS[i % len(KINDS)]} for i in range(tasks)],
        }
    ]
    playbook = work / "bench.yml"
    playbook.write_text(yaml.safe_dump(play, sort_keys=False))
    inventory = work / "hosts.yml"
    hosts = {f"bench{i}": {"ansible_connection": "local"} for i in range(HOSTS)}
    inventory.write_text(
        yaml.safe_dump(
            {"all": {"hosts": hosts, "vars": {"ansible_python_interpreter": sys.executable}}}
        )
    )
    return playbook, inventory


def run_arm(playbook: Path, inventory: Path, callbacks: str) -> float:
    filters = sorted(str(p) for p in (ROOT / "roles").glob("*/filter_plugins"))
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_FILTER_PLUGINS": os.pathsep.join(filters),
        "ANSIBLE_CALLBACKS_ENABLED": callbacks,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory)]
    started = time.monotonic()
    run = subprocess.run(
        [*argv, "-f", str(HOSTS), str(playbook)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.monotonic() - started
    if run.returncode != 0:
        sys.exit(f"{callbacks}: the playbook failed\n{run.stdout[-3000:]}{run.stderr[-3000:]}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=30)
    args = parser.parse_args()
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory() as tmp:
        playbook, inventory = write_files(Path(tmp), args.tasks)
        for _ in range(args.rounds):
            for arm, callbacks in ARMS.items():
                times[arm].append(run_arm(playbook, inventory, callbacks))
    per_task = {arm: statistics.median(t) / args.tasks for arm, t in times.items()}
    print(f"{args.tasks} tasks x {HOSTS} local hosts, {args.rounds} rounds (median):")
    for arm, seconds in per_task.items():
        print(f"  {arm:26s} {seconds:6.3f} s per task")
    ratio = per_task["with vllm_fleet_preload"] / per_task["without"]
    verdict = "met" if ratio <= TARGET else "MISSED"
    print(f"with/without: {ratio:.2f}x (target <= {TARGET}x): {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
