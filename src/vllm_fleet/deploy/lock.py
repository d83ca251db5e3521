"""The controller's deploy lock: one run that changes hosts at a time, per checkout.

Preflight's first task takes an flock on a file on the controller. The task runs in an
Ansible worker process that exits right after it, so a small holder process keeps the locked
descriptor open until the ansible-playbook process that took the lock is gone (success,
failure, Ctrl-C or SIGKILL alike); then the holder exits and the kernel frees the lock. The
file holds a JSON record of the run that holds it, to name it to a run that is refused.

Run as ``python -m vllm_fleet.deploy.lock hold LOCK_FD READY_FD PID TICKS``, it is that holder.
"""

from __future__ import annotations

import fcntl
import getpass
import json
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

# How often the holder looks for its run; the lock frees at most this long after the run ends.
HOLDER_POLL_SECONDS = 0.5
# A refused run polls this often while it waits (preflight_deploy_lock_wait_seconds > 0).
WAIT_POLL_SECONDS = 0.5
# A run that has ended leaves its holder alive for up to HOLDER_POLL_SECONDS; a run started
# right after it (vllm-fleet apply runs its playbooks back to back) waits that out.
ENDED_GRACE_SECONDS = 3.0
READY_TIMEOUT_SECONDS = 10.0
# ansible-playbook options whose value may end in .yml without being a playbook.
VALUE_OPTIONS = {
    "-i", "--inventory", "--inventory-file", "-e", "--extra-vars", "--vault-password-file",
    "--vault-pass-file", "--vault-id", "-l", "--limit", "-M", "--module-path", "--private-key",
    "--key-file",
}  # fmt: skip


def stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat from field 3 (state) on; the command name before it may hold spaces."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """When the process started (field 22, clock ticks since boot); None once it has exited.

    A zombie (Z) or dying (X) process has ended though its pid is not yet reaped: a run
    killed by SIGKILL is a zombie until its parent waits for it.
    """
    fields = stat_fields(pid)
    if fields is None or fields[0] in {"Z", "X"}:
        return None
    return int(fields[19])


def parent_of(pid: int) -> int:
    fields = stat_fields(pid)
    return int(fields[1]) if fields else 0


def alive(pid: int, ticks: int) -> bool:
    """Whether that process still runs; the start time tells a reused pid from it."""
    return start_ticks(pid) == ticks


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]


def is_playbook(argv: list[str]) -> bool:
    """ansible-playbook, run as a script or as ``python -m ansible playbook``."""
    if any(Path(arg).name == "ansible-playbook" for arg in argv[:3]):
        return True
    return "ansible" in argv[:4] and "playbook" in argv[:5]


def playbook_process(pid: int | None = None) -> int:
    """The ansible-playbook process this (worker) process belongs to.

    Ansible forks its workers from the ansible-playbook process, so it is normally the parent;
    the ancestors are searched in case something sits between them.
    """
    start = os.getppid() if pid is None else pid
    current = start
    while current > 1:
        if is_playbook(cmdline(current)):
            return current
        current = parent_of(current)
    if start <= 1:
        # The parent is gone (we were reparented): a holder would wait on the wrong process.
        raise LockError("the ansible-playbook process that runs this task has exited")
    return start


def playbooks_of(argv: list[str]) -> list[str]:
    """The playbooks on an ansible-playbook command line, without option values (-e may hold
    secrets, and the lock file is world-readable)."""
    found = []
    for index, arg in enumerate(argv):
        if arg.startswith("-") or not arg.endswith((".yml", ".yaml")):
            continue
        if index > 0 and argv[index - 1] in VALUE_OPTIONS:
            continue
        found.append(arg)
    return found


def utc_iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def started_epoch(ticks: int) -> float:
    """A process's start time as seconds since the epoch, from its ticks since boot."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return int(line.split()[1]) + ticks / os.sysconf("SC_CLK_TCK")
    return time.time()


@dataclass(frozen=True)
class Holder:
    """The run that holds the lock, as recorded in the lock file."""

    pid: int
    start_ticks: int
    user: str
    host: str
    playbooks: list[str]
    started_at: str
    locked_at: str
    holder_pid: int

    def describe(self) -> str:
        what = f" ({' '.join(self.playbooks)})" if self.playbooks else ""
        return (
            f"ansible-playbook pid {self.pid}{what}, started {self.started_at} "
            f"by {self.user}@{self.host}"
        )

    def is_run(self, pid: int, ticks: int) -> bool:
        """Whether that process on this controller is the run that holds the lock."""
        return (self.host, self.pid, self.start_ticks) == (socket.gethostname(), pid, ticks)

    def ended(self) -> bool:
        """Whether the run has ended; only checkable on the controller that holds the lock."""
        return self.host == socket.gethostname() and not alive(self.pid, self.start_ticks)


class LockError(Exception):
    pass


class LockBusy(LockError):
    def __init__(self, path: Path, holder: Holder | None, waited: float) -> None:
        self.path, self.holder, self.waited = path, holder, waited
        who = holder.describe() if holder else "a run whose record is missing or unreadable"
        waited_for = f"after waiting {waited:.0f} s, " if waited else ""
        super().__init__(
            f"{waited_for}another deploy holds the lock {path}: {who}. Wait for it to end "
            "(the lock frees itself when that process exits), then run again "
            "(or set preflight_deploy_lock_wait_seconds to wait for it)."
        )


def read_record(path: Path) -> Holder | None:
    """The holder's record; None while it is being written (or was never written)."""
    try:
        return Holder(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


@dataclass(frozen=True)
class Outcome:
    path: Path
    holder: Holder
    already_held: bool  # this run took it earlier (preflight imported twice)
    waited: float


def acquire(
    path: Path,
    owner: int,
    wait_seconds: float = 0,
    on_wait: Callable[[Holder | None], None] | None = None,
) -> Outcome:
    """Take the lock for the ansible-playbook process ``owner`` and start its holder.

    Raises LockBusy when another run holds it past wait_seconds.
    """
    path = Path(os.path.abspath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    owner_ticks = start_ticks(owner)
    if owner_ticks is None:
        raise LockError(f"the ansible-playbook process {owner} has exited")
    told = False
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
        else:
            try:
                holder = take(fd, owner, owner_ticks)
            finally:
                # The holder has its own copy of the descriptor; the lock stays with it.
                os.close(fd)
            return Outcome(path, holder, False, time.monotonic() - began)
        holder = read_record(path)
        if holder and holder.is_run(owner, owner_ticks):
            return Outcome(path, holder, True, time.monotonic() - began)
        waited = time.monotonic() - began
        # An ended run's holder lets go within its poll interval; an unwritten record is
        # a run that took the lock a moment ago.
        grace = ENDED_GRACE_SECONDS if holder is None or holder.ended() else 0
        if waited >= max(wait_seconds, grace):
            raise LockBusy(path, holder, waited if wait_seconds else 0)
        if on_wait and not told and wait_seconds:
            on_wait(holder)
            told = True
        time.sleep(WAIT_POLL_SECONDS)


def take(fd: int, owner: int, owner_ticks: int) -> Holder:
    """With the flock on fd: start the holder, then write the record naming this run."""
    # A stale record would name an ended run to whoever reads it meanwhile.
    os.ftruncate(fd, 0)
    holder_pid = start_holder(fd, owner, owner_ticks)
    now = time.time()
    holder = Holder(
        pid=owner,
        start_ticks=owner_ticks,
        user=getpass.getuser(),
        host=socket.gethostname(),
        playbooks=playbooks_of(cmdline(owner)),
        started_at=utc_iso(started_epoch(owner_ticks)),
        locked_at=utc_iso(now),
        holder_pid=holder_pid,
    )
    os.pwrite(fd, (json.dumps(asdict(holder)) + "\n").encode(), 0)
    return holder


def start_holder(fd: int, owner: int, owner_ticks: int) -> int:
    """Start the process that keeps fd (and so the lock) until ``owner`` exits; its pid.

    A fresh interpreter (fork and exec) rather than a bare fork of the worker: the worker may
    have threads, and the holder should carry none of Ansible's state. In its own session, no
    terminal's Ctrl-C reaches it; the worker exits after the task, so init adopts it as it would
    a double-forked daemon. The package's own directory leads its path, so it runs this code.
    """
    ready_r, ready_w = os.pipe()
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    argv = [sys.executable, "-m", "vllm_fleet.deploy.lock", "hold"]
    try:
        proc = subprocess.Popen(
            [*argv, str(fd), str(ready_w), str(owner), str(owner_ticks)],
            pass_fds=(fd, ready_w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            cwd="/",
            env=env,
        )
    finally:
        os.close(ready_w)
    try:
        # Confirmed, or the task would report a lock nobody holds.
        readable, _, _ = select.select([ready_r], [], [], READY_TIMEOUT_SECONDS)
        ready = bool(readable) and os.read(ready_r, 1) == b"1"
    finally:
        os.close(ready_r)
    if not ready:
        proc.kill()
        raise LockError(f"the deploy lock's holder process did not start (exit {proc.wait()})")
    _STARTED.append(proc)
    return proc.pid


# Popen objects of started holders: kept so none is collected (and warned about) while running.
_STARTED: list[subprocess.Popen[bytes]] = []


def hold(lock_fd: int, ready_fd: int, owner: int, owner_ticks: int) -> int:
    """The holder: keep lock_fd open while the run lives; exiting closes it and frees the lock."""
    os.write(ready_fd, b"1")
    os.close(ready_fd)
    while alive(owner, owner_ticks):
        time.sleep(HOLDER_POLL_SECONDS)
    os.close(lock_fd)
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 5 or argv[0] != "hold":
        print("usage: python -m vllm_fleet.deploy.lock hold LOCK_FD READY_FD PID TICKS")
        return 2
    lock_fd, ready_fd, owner, owner_ticks = (int(arg) for arg in argv[1:])
    return hold(lock_fd, ready_fd, owner, owner_ticks)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
