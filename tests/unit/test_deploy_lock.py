"""The deploy lock with real ansible-playbook processes on the controller: a second run is
refused at once while one holds it, the lock frees itself however the holder's run ends
(SIGKILL too), a run may wait for it, --check takes and honours it, and no holder process is
left behind.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.playbook import preflight_plugins_env
from vllm_fleet.deploy.lock import playbooks_of, start_ticks

PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
# Only a guard against a run that hangs: the checks below wait for what a run prints or
# for it to end, never for a time sized to one machine's speed (a loaded 2-core machine took
# over 30 s to start a second ansible-playbook beside the unit tests' other workers).
DEADLINE = 300.0
# How long the second run waits for the lock: it ends on its own after this, so a wait for
# its "waiting" line needs no deadline of its own.
WAIT = 120


def lock_task(name: str) -> dict[str, object]:
    return {
        "name": name,
        "vllm_fleet_deploy_lock": {"path": "{{ lock }}", "wait_seconds": "{{ wait | default(0) }}"},
        "run_once": True,
        "delegate_to": "localhost",
    }


PLAY = [
    {
        "name": "Lock test",
        "hosts": "localhost",
        "gather_facts": False,
        "tasks": [
            lock_task("Take the lock"),
            # As when a run imports preflight twice: the run that holds the lock passes again.
            lock_task("Take it again"),
            {
                "name": "Hold it until the test says go",
                "ansible.builtin.wait_for": {"path": "{{ go }}", "timeout": 60},
                "check_mode": False,
                "when": "go is defined",
            },
        ],
    }
]


class Bench:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.lock = tmp / "locks" / "deploy.lock"
        self.play = tmp / "play.yml"
        self.play.write_text(yaml.safe_dump(PLAY, sort_keys=False))
        self.env = preflight_plugins_env(tmp)
        self.procs: list[subprocess.Popen[str]] = []
        self.holders: set[int] = set()
        self.gos: list[Path] = []

    def argv(self, *extra: str) -> list[str]:
        return [
            PLAYBOOK, "-v", "-i", "localhost,", "-c", "local", str(self.play),
            "-e", f"ansible_python_interpreter={sys.executable}", "-e", f"lock={self.lock}",
            *extra,
        ]  # fmt: skip

    def start(self, *extra: str, hold: bool = False) -> subprocess.Popen[str]:
        """A run in the background; with hold, it keeps the lock until release()."""
        if hold:
            go = self.tmp / f"go-{len(self.gos)}"
            self.gos.append(go)
            extra = (*extra, "-e", f"go={go}")
        proc = subprocess.Popen(
            self.argv(*extra), cwd=self.tmp, env=self.env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    def run(self, *extra: str) -> tuple[int, str, float]:
        started = time.monotonic()
        out, _ = self.start(*extra).communicate(timeout=DEADLINE * 2)
        self.remember()
        return self.procs[-1].returncode, out, time.monotonic() - started

    def release(self) -> None:
        for go in self.gos:
            go.touch()

    def record(self) -> dict[str, object] | None:
        try:
            return json.loads(self.lock.read_text())
        except (OSError, ValueError):
            return None

    def remember(self) -> None:
        if (record := self.record()) is not None:
            self.holders.add(int(record["holder_pid"]))  # type: ignore[call-overload]

    def wait_held_by(self, pid: int) -> dict[str, object]:
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            record = self.record()
            if record and record["pid"] == pid:
                self.remember()
                return record
            time.sleep(0.1)
        pytest.fail(f"run {pid} never took the lock")

    def lock_is_free(self) -> bool:
        fd = os.open(self.lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            os.close(fd)  # also lets go of the lock if this took it
        return True

    def finish(self) -> None:
        self.release()
        for proc in self.procs:
            if proc.poll() is None:
                proc.communicate(timeout=DEADLINE * 2)
        # Every holder ends soon after its run.
        deadline = time.monotonic() + 10
        while any(start_ticks(pid) is not None for pid in self.holders):
            assert time.monotonic() < deadline, f"holder processes left: {self.holders}"
            time.sleep(0.1)


@pytest.fixture
def bench(tmp_path: Path) -> Iterator[Bench]:
    bench = Bench(tmp_path)
    try:
        yield bench
    finally:
        bench.finish()
    assert bench.holders, "no run recorded a holder"


def refusal(bench: Bench, pid: int) -> str:
    return f"another deploy holds the lock {bench.lock}: ansible-playbook pid {pid} ({bench.play})"


def test_a_second_run_is_refused_at_once_and_the_lock_passes_on_after_the_first(bench):
    first = bench.start(hold=True)
    record = bench.wait_held_by(first.pid)
    assert record["playbooks"] == [str(bench.play)]

    rc, out, _ = bench.run()
    # Refused while the first still runs: it did not wait for it.
    assert first.poll() is None
    assert rc != 0
    assert refusal(bench, first.pid) in out
    assert "Wait for it to end (the lock frees itself when that process exits)" in out

    bench.release()
    out, _ = first.communicate(timeout=DEADLINE)
    assert first.returncode == 0, out
    assert "already held by this run" in out

    rc, out, _ = bench.run()
    assert rc == 0, out
    assert f"deploy lock {bench.lock} taken" in out
    assert bench.record()["pid"] == bench.procs[-1].pid  # type: ignore[index]


def test_the_lock_frees_itself_when_the_holding_run_is_killed(bench):
    first = bench.start(hold=True)
    bench.wait_held_by(first.pid)
    # SIGKILL, and not reaped yet: a zombie run counts as ended.
    os.kill(first.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not bench.lock_is_free():
        assert time.monotonic() < deadline, "the lock outlived its killed run"
        time.sleep(0.1)
    first.wait()

    rc, out, _ = bench.run()
    assert rc == 0, out
    assert f"deploy lock {bench.lock} taken" in out


def test_a_run_told_to_wait_takes_the_lock_when_the_first_ends(bench):
    first = bench.start(hold=True)
    bench.wait_held_by(first.pid)
    second = bench.start("-e", f"wait={WAIT}")
    lines: list[str] = []
    assert second.stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(second.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    waiting = f"is held by ansible-playbook pid {first.pid} ({bench.play})"
    # Until the second run says it waits, or ends (it gives up after WAIT s of waiting).
    while not any(waiting in line for line in lines):
        assert second.poll() is None, "".join(lines)
        time.sleep(0.1)

    bench.release()
    assert second.wait(timeout=DEADLINE) == 0, "".join(lines)
    reader.join(timeout=DEADLINE)
    assert f"deploy lock {bench.lock} taken" in "".join(lines)
    bench.remember()
    assert bench.record()["pid"] == second.pid  # type: ignore[index]


def test_check_mode_takes_the_lock_and_is_refused_by_it(bench):
    first = bench.start("--check", hold=True)
    bench.wait_held_by(first.pid)
    # Both at once: a real run and a check run, refused alike.
    real, check = bench.start(), bench.start("--check")
    for proc in (real, check):
        out, _ = proc.communicate(timeout=DEADLINE)
        assert proc.returncode != 0, out
        assert refusal(bench, first.pid) in out
    assert first.poll() is None


def test_the_record_names_playbooks_never_option_values():
    argv = [
        "/venv/bin/python", "/venv/bin/ansible-playbook", "-i", "inventories/x/hosts.yml",
        "-e", "fleet_hf_token=secret.yml", "-e@vars.yml", "--extra-vars=@more.yml", "site.yml",
    ]  # fmt: skip
    assert playbooks_of(argv) == ["site.yml"]
