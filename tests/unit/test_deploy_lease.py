"""The deploy lease across controllers, with real ansible-playbook runs and the real module.

Each run here has its own controller lock (as a second checkout would), so only the lease on
the (local) lease host keeps them apart: a second run is refused naming the first, the first
releases it at its end, a run of this controller that died is taken over, another
controller's lease holds until it expires or is broken by its id, and --check writes nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.playbook import preflight_plugins_env
from vllm_fleet.deploy.lease import Lease, verdict

PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
# Only a guard against a run that hangs (the checks wait for what a run writes or for it to
# end), large enough for a loaded 2-core machine.
DEADLINE = 300.0


def lease_task(state: str) -> dict[str, object]:
    return {
        "name": f"Lease {state}",
        "vllm_fleet_deploy_lease": {
            "path": "{{ lease }}",
            "checkout": "{{ checkout }}",
            "state": state,
            "ttl_seconds": "{{ ttl | default(600) }}",
            "break_id": "{{ break_id | default('') }}",
        },
        "register": f"lease_{state}",
    }


PLAY = [
    {
        "name": "Lease test",
        "hosts": "localhost",
        "gather_facts": False,
        "tasks": [
            {
                "name": "Own controller lock (a checkout of its own)",
                "vllm_fleet_deploy_lock": {"path": "{{ lock }}"},
            },
            lease_task("present"),
            # As when a run imports preflight twice: its own lease is renewed.
            lease_task("present"),
            {
                "name": "Hold it until the test says go",
                "ansible.builtin.wait_for": {"path": "{{ go }}", "timeout": 60},
                "check_mode": False,
                "when": "go is defined",
            },
            {**lease_task("absent"), "when": "release | default(true) | bool"},
        ],
    }
]


class Bench:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.lease = tmp / "host" / "deploy.lease"
        self.play = tmp / "play.yml"
        self.play.write_text(yaml.safe_dump(PLAY, sort_keys=False))
        self.env = preflight_plugins_env(tmp)
        self.procs: list[subprocess.Popen[str]] = []
        self.runs = 0

    def start(self, *extra: str, go: Path | None = None) -> subprocess.Popen[str]:
        self.runs += 1
        argv = [
            PLAYBOOK, "-v", "-i", "localhost,", "-c", "local", str(self.play),
            "-e", f"ansible_python_interpreter={sys.executable}",
            "-e", f"lease={self.lease}", "-e", f"checkout=/srv/checkout-{self.runs}",
            "-e", f"lock={self.tmp}/lock-{self.runs}",
            *(["-e", f"go={go}"] if go else []), *extra,
        ]  # fmt: skip
        proc = subprocess.Popen(
            argv, cwd=self.tmp, env=self.env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    def run(self, *extra: str) -> tuple[int, str]:
        out, _ = self.start(*extra).communicate(timeout=DEADLINE)
        return self.procs[-1].returncode, out

    def record(self) -> dict[str, object] | None:
        try:
            return json.loads(self.lease.read_text())
        except (OSError, ValueError):
            return None

    def wait_held_by(self, pid: int) -> dict[str, object]:
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            record = self.record()
            if record and record["pid"] == pid:
                return record
            time.sleep(0.2)
        pytest.fail(f"run {pid} never took the lease")

    def foreign(self, expires_in: float) -> str:
        """A lease from another controller's run (whose process this one cannot see)."""
        self.lease.parent.mkdir(exist_ok=True)
        now = time.time()
        lease_id = "ctl-b.example:4242:99"
        self.lease.write_text(json.dumps({
            "id": lease_id, "controller": "ctl-b.example", "user": "ops", "pid": 4242,
            "start_ticks": 99, "playbooks": ["site.yml"], "checkout": "/home/ops/fleet",
            "taken_at": now - 60, "expires_at": now + expires_in,
        }))  # fmt: skip
        return lease_id

    def finish(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def bench(tmp_path: Path) -> Iterator[Bench]:
    b = Bench(tmp_path)
    yield b
    b.finish()


def test_a_run_from_another_checkout_is_refused_naming_the_holder_which_releases_at_its_end(
    bench: Bench,
):
    go = bench.tmp / "go"
    first = bench.start(go=go)
    held = bench.wait_held_by(first.pid)
    assert held["checkout"] == "/srv/checkout-1"
    assert held["expires_at"] > held["taken_at"] + 500  # type: ignore[operator]
    assert bench.lease.stat().st_mode & 0o777 == 0o644

    code, out = bench.run()
    assert code != 0
    assert "holds the deploy lease of another run" in out
    assert f"ansible-playbook pid {first.pid}" in out
    assert "/srv/checkout-1" in out
    assert f"preflight_deploy_lease_break={held['id']}" in out
    assert bench.record()["id"] == held["id"], "a refused run leaves the holder's lease"  # type: ignore[index]

    go.touch()
    out, _ = first.communicate(timeout=DEADLINE)
    assert first.returncode == 0, out
    assert "renewed (this run took it earlier)" in out
    assert "changed=0" in out, "the lease is bookkeeping, never a change"
    assert bench.record() is None, "the holder released it"


def test_a_run_of_this_controller_that_died_is_taken_over(bench: Bench):
    code, out = bench.run("-e", "release=false")
    assert code == 0, out
    dead = bench.record()
    assert dead is not None

    code, out = bench.run()
    assert code == 0, out
    assert f"taken over from a run of this controller that ended: {dead['id']}" in out


def test_another_controllers_lease_holds_until_it_expires_or_is_broken_by_its_id(bench: Bench):
    lease_id = bench.foreign(expires_in=3600)
    code, out = bench.run()
    assert code != 0
    assert "by ops@ctl-b.example from /home/ops/fleet" in out
    assert "expires in 60 min" in out
    assert bench.record()["id"] == lease_id  # type: ignore[index]

    code, out = bench.run("-e", "break_id=ctl-b.example:1:1")
    assert code != 0, "breaking another id than the holder's breaks nothing"

    code, out = bench.run("-e", f"break_id={lease_id}")
    assert code == 0, out
    assert f"broken as preflight_deploy_lease_break asked: {lease_id}" in out

    bench.foreign(expires_in=-1)
    code, out = bench.run()
    assert code == 0, out
    assert "taken over from an expired lease" in out


def test_a_check_run_refuses_alike_and_writes_nothing(bench: Bench):
    code, out = bench.run("--check")
    assert code == 0, out
    assert not bench.lease.exists()

    bench.foreign(expires_in=3600)
    before = bench.lease.read_text()
    code, out = bench.run("--check")
    assert code != 0
    assert "holds the deploy lease of another run" in out
    assert bench.lease.read_text() == before


def renewal_play(foreign: str | None) -> list[dict[str, object]]:
    """Take the lease, keep a copy, (another controller takes it,) renew it as each batch of
    a serial play does: the role's own renew_lease tasks."""
    write_foreign = {
        "name": "Another controller takes the lease (this run's expired)",
        "ansible.builtin.copy": {"content": foreign, "dest": "{{ lease }}", "mode": "0644"},
    }
    return [
        {
            "name": "Renewal",
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [
                {**lease_task("present"), "vars": {"ttl": 600}},
                {
                    "name": "Keep the lease as preflight took it",
                    "ansible.builtin.copy": {
                        "src": "{{ lease }}", "dest": "{{ lease }}.taken", "remote_src": True,
                        "mode": "0644",
                    },
                },
                *([write_foreign] if foreign else []),
                {
                    "name": "A batch starts",
                    "ansible.builtin.include_role": {"name": "preflight",
                                                     "tasks_from": "renew_lease"},
                    "vars": {
                        "preflight_deploy_lease_hosts": ["localhost"],
                        "preflight_deploy_lease_path": "{{ lease }}",
                        "preflight_deploy_lease_seconds": 900,
                        "preflight_checkout": "{{ checkout }}",
                    },
                },
                {"name": "The batch runs", "ansible.builtin.debug": {"msg": "batch ran"}},
            ],
        }
    ]  # fmt: skip


def run_renewal(bench: Bench, foreign: str | None) -> tuple[int, str]:
    bench.play.write_text(yaml.safe_dump(renewal_play(foreign), sort_keys=False))
    env = dict(bench.env, ANSIBLE_ROLES_PATH=str(Path(__file__).parents[2] / "roles"))
    argv = [
        PLAYBOOK, "-i", "localhost,", "-c", "local", str(bench.play),
        "-e", f"ansible_python_interpreter={sys.executable}", "-e", "ansible_become=false",
        "-e", f"lease={bench.lease}", "-e", "checkout=/srv/checkout-1",
    ]  # fmt: skip
    proc = subprocess.run(
        argv, cwd=bench.tmp, env=env, text=True, capture_output=True, timeout=DEADLINE, check=False
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_each_batch_renews_the_lease_and_a_run_that_lost_it_stops(bench: Bench):
    code, out = run_renewal(bench, None)
    assert code == 0, out
    taken = json.loads(Path(f"{bench.lease}.taken").read_text())
    renewed = bench.record()
    assert renewed is not None and renewed["id"] == taken["id"]
    # Renewed from now for preflight_deploy_lease_seconds: a run longer than one lease keeps it.
    assert renewed["expires_at"] > taken["expires_at"] + 250  # type: ignore[operator]
    assert "batch ran" in out

    foreign = json.dumps({
        "id": "ctl-b.example:4242:99", "controller": "ctl-b.example", "user": "ops",
        "pid": 4242, "start_ticks": 99, "playbooks": ["site.yml"],
        "checkout": "/home/ops/fleet", "taken_at": time.time(),
        "expires_at": time.time() + 3600,
    })  # fmt: skip
    code, out = run_renewal(bench, foreign)
    assert code != 0
    assert "holds the deploy lease of another run" in out
    assert "by ops@ctl-b.example from /home/ops/fleet" in out
    assert "batch ran" not in out, "the batch stopped before it changed anything"
    assert bench.record()["id"] == "ctl-b.example:4242:99"  # type: ignore[index]


def mine(pid: int = 1) -> Lease:
    return Lease(f"ctl-a:{pid}:5", "ctl-a", "ops", pid, 5, ["site.yml"], "/srv/a")


def test_the_verdict_takes_only_a_free_own_expired_dead_or_named_lease():
    other = Lease("ctl-b:7:9", "ctl-b", "ops", 7, 9, [], "/srv/b", 100.0, 200.0)
    alive_elsewhere = {"ended": lambda lease: False}
    assert verdict(None, mine(), "r1", 150.0, **alive_elsewhere).take
    assert verdict(mine(), mine(), "r1", 150.0, **alive_elsewhere).take
    refused = verdict(other, mine(), "router01", 150.0, **alive_elsewhere)
    assert not refused.take
    assert refused.why.startswith("router01 holds the deploy lease of another run")
    assert verdict(other, mine(), "r1", 200.0, **alive_elsewhere).take  # expired
    assert verdict(other, mine(), "r1", 150.0, ended=lambda lease: True).take
    assert verdict(other, mine(), "r1", 150.0, break_id="ctl-b:7:9", **alive_elsewhere).take
    assert not verdict(other, mine(), "r1", 150.0, break_id="ctl-b:7:8", **alive_elsewhere).take


def test_a_lease_record_that_is_not_one_reads_as_none():
    assert Lease.from_record(None) is None
    assert Lease.from_record({"id": "x", "pid": "not a pid"}) is None
    assert Lease.from_record({"pid": 3}) is None
