"""``vllm-fleet engine-run``: start one engine group as a child-subreaper main process.

Inside a container on a cgroup-v1 host systemd is not told when a unit's cgroup
empties, so stops hang until TimeoutStopSec. Being the main process, forwarding
SIGTERM to vLLM (which then drains for --shutdown-timeout) and reaping every
descendant before exiting makes stops clean there, and costs nothing elsewhere.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from vllm_fleet.engine_config import EngineConfig, engine_argv, engine_env

PR_SET_CHILD_SUBREAPER = 36
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Field 4 (ppid) follows the ')' that closes the command name.
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def reap_all(grace: float) -> None:
    """Wait for adopted descendants; SIGKILL what is left after ``grace`` seconds."""
    deadline = time.monotonic() + grace
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid:
            continue
        if time.monotonic() > deadline:
            for child in children_of(os.getpid()):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
            deadline = time.monotonic() + 5
        time.sleep(0.1)


def run(config_path: Path) -> int:
    cfg = EngineConfig.model_validate_json(config_path.read_text())
    state_dir = Path(os.environ.get("STATE_DIRECTORY", f"/var/lib/vllm-fleet/engines/{cfg.group}"))
    env = dict(os.environ)
    env.update(engine_env(cfg, state_dir))
    for key in ("TMPDIR", "XDG_CACHE_HOME"):
        Path(env[key]).mkdir(parents=True, exist_ok=True)
    become_subreaper()
    child = subprocess.Popen(engine_argv(cfg), env=env)

    def forward(signum: int, _frame: object) -> None:
        child.send_signal(signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    returncode = child.wait()
    reap_all(grace=float(cfg.shutdown_timeout) + 5)
    if returncode < 0 and -returncode in FORWARDED:
        return 0
    return returncode


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: vllm-fleet engine-run CONFIG.json", file=sys.stderr)
        return 2
    return run(Path(argv[0]))
