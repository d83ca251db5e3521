"""The lab's and Molecule's connection (podman under Mitogen, ansible.cfg's strategy) on a
throwaway container: a module runs inside the host (its namespaces and its cgroup, so a
slowed host slows the module too), files go in and come back intact, and a stopped host
fails the task with podman's own answer."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.lab import playbook

NAME = "vf-connection-probe"
IMAGE = "localhost/vllm-fleet-lab:bookworm"

PLAY = [
    {
        "hosts": NAME,
        "gather_facts": False,
        "tasks": [
            {"name": "cgroup", "ansible.builtin.command": "cat /proc/self/cgroup",
             "register": "cgroup", "changed_when": False},
            {"name": "mount namespace", "ansible.builtin.command": "readlink /proc/self/ns/mnt",
             "register": "mnt", "changed_when": False},
            {"name": "put", "ansible.builtin.copy": {"src": "{{ payload }}", "dest": "/root/payload",
                                                     "mode": "0640"}},
            {"name": "fetch", "ansible.builtin.fetch": {"src": "/root/payload", "flat": True,
                                                       "dest": "{{ payload }}.back"}},
            {"name": "report", "delegate_to": "localhost", "vars": {"ansible_connection": "local"},
             "ansible.builtin.copy": {"dest": "{{ payload }}.report", "mode": "0600",
                                      "content": "{{ {'cgroup': cgroup.stdout_lines, 'mnt': mnt.stdout} | to_json }}"}},
        ],
    }
]  # fmt: skip


@pytest.fixture
def probe_host(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    subprocess.run(["podman", "rm", "--force", NAME], capture_output=True, check=False)
    subprocess.run(
        ["podman", "run", "--detach", "--name", NAME, "--network", "none", IMAGE,
         "sleep", "infinity"],
        check=True, capture_output=True,
    )  # fmt: skip
    (tmp_path / "hosts.yml").write_text(
        yaml.safe_dump(
            {"all": {"hosts": {NAME: None},
                     "vars": {"ansible_connection": "podman",
                              "ansible_python_interpreter": "/usr/bin/python3"}}}
        )
    )  # fmt: skip
    (tmp_path / "play.yml").write_text(yaml.safe_dump(PLAY, sort_keys=False))
    yield NAME, tmp_path
    subprocess.run(["podman", "rm", "--force", NAME], capture_output=True, check=False)


def inspect(name: str, field: str) -> str:
    return subprocess.run(
        ["podman", "inspect", "--format", field, name], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_modules_run_inside_the_host_and_a_stopped_host_fails_the_task(
    probe_host: tuple[str, Path],
) -> None:
    name, work = probe_host
    payload = work / "payload"
    # Bytes a text round trip would mangle, and more than one pipe buffer.
    payload.write_bytes(bytes(range(256)) * 512)
    inventory, play = str(work / "hosts.yml"), str(work / "play.yml")

    run = playbook("-i", inventory, str(play), "-e", f"payload={payload}")
    assert run.returncode == 0, run.output[-3000:]
    container_id = inspect(name, "{{.ID}}")
    report = json.loads((work / "payload.report").read_text())
    # Every controller's path is the container's: podman update --cpus limits the module too.
    assert report["cgroup"], report
    assert all(container_id in line for line in report["cgroup"]), report["cgroup"]
    pid = inspect(name, "{{.State.Pid}}")
    assert report["mnt"] == str(Path(f"/proc/{pid}/ns/mnt").readlink())
    assert (work / "payload.back").read_bytes() == payload.read_bytes()
    mode = subprocess.run(
        ["podman", "exec", name, "stat", "-c", "%a", "/root/payload"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert mode == "640"

    subprocess.run(["podman", "stop", "--time", "1", name], check=True, capture_output=True)
    stopped = playbook("-i", inventory, str(play), "-e", f"payload={payload}")
    assert stopped.returncode != 0
    recap = stopped.recap()[name]
    assert recap["failed"] + recap["unreachable"] == 1, stopped.output[-3000:]
    # podman's answer, not runc's: the operator sees the container is not running.
    tail = stopped.output[-3000:]
    assert "running" in stopped.output and "exec failed" not in stopped.output, tail
