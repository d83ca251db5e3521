"""``vllm-fleet engine-run``: run one engine group as systemd's main process.

It starts vLLM and reports readiness to systemd (Type=notify) only once ``/health`` answers;
on SIGTERM vLLM drains. Joining the routers once ready and leaving them before the drain are
root's (``vllm-fleet engine-join`` / ``engine-leave``, vllm_fleet.engine.membership): this
process runs as the engine's user, which never holds the routers' control key.

It is also a child subreaper: inside a container on a cgroup-v1 host systemd is not told
when a unit's cgroup empties, so stops hang until TimeoutStopSec. Forwarding SIGTERM to
vLLM (which then drains for --shutdown-timeout) and reaping every descendant before
exiting makes stops clean there, and costs nothing elsewhere.

SIGUSR1 asks it to abort: the watchdog sends it to a group that stopped answering (an
engine core stalled behind an API server whose /health still says 200). A drain would
wait the whole shutdown timeout for requests that never finish; killed at once, their
connections close and the routers retry them on other engines.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from vllm_fleet.engine.config import (
    CredentialsMissing,
    EngineConfig,
    engine_argv,
    engine_env,
    engine_trust,
    probe_url,
)
from vllm_fleet.engine.membership import CONTROL_KEY_ENV
from vllm_fleet.engine.model_check import check_model
from vllm_fleet.sd_notify import notify
from vllm_fleet.tls.trust import TrustError

PR_SET_CHILD_SUBREAPER = 36
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
ABORT = signal.SIGUSR1
# EX_CONFIG: the journal shows status=78/CONFIG, which reads as what it is. Also for TLS
# settings the unit cannot serve (no credentials, an unreadable CA): a restart cannot help.
MODEL_INCOMPLETE_EXIT = 78
SETTINGS_UNUSABLE_EXIT = 78
# EX_SOFTWARE: vLLM ended without being asked to. Its API server exits 0 after its engine
# core died (an OOM kill of the model worker, say): with Restart=on-failure, passing that 0 on
# would leave the group down for good.
EXITED_UNASKED = 70
# EX_TEMPFAIL: aborted (ABORT) because the group hung; systemd or the watchdog restarts it.
ABORTED = 75
# A model missing 40 shards still gets one readable journal line.
MAX_PROBLEMS_LOGGED = 5


def log(message: str) -> None:
    print(f"engine-run: {message}", file=sys.stderr, flush=True)


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


def descendants_of(pid: int) -> list[int]:
    found = []
    for child in children_of(pid):
        found += [child, *descendants_of(child)]
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and everything under it (a stopped process dies of SIGKILL too)."""
    for target in [pid, *descendants_of(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(target, signal.SIGKILL)


def reap_all(grace: float, hurry: threading.Event | None = None) -> None:
    """Wait for adopted descendants; SIGKILL what is left after ``grace`` seconds, or at
    once when ``hurry`` is set (an abort during a drain)."""
    deadline = time.monotonic() + grace
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid:
            continue
        if time.monotonic() > deadline or (hurry is not None and hurry.is_set()):
            for child in children_of(os.getpid()):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
            deadline = time.monotonic() + 5
        time.sleep(0.1)


def start_deaf_thread(target: Callable[[], None], name: str, signals: set[int]) -> None:
    """Start a thread that never takes these signals. Python runs handlers in the main
    thread, which waits for vLLM in waitpid(): a signal the kernel hands to another thread
    would not interrupt it, and its handler would not run until vLLM exits (a hung vLLM:
    never). The thread is born with them blocked (a thread inherits its creator's mask)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        threading.Thread(target=target, name=name, daemon=True).start()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)


def wait_healthy(
    url: str,
    child: subprocess.Popen[bytes],
    stopping: threading.Event,
    verify: ssl.SSLContext | bool = True,
) -> bool:
    """Poll /health until 200; False if vLLM exits or the group is stopped first."""
    with httpx.Client(timeout=2.0, verify=verify) as client:
        while child.poll() is None and not stopping.is_set():
            with contextlib.suppress(httpx.HTTPError):
                if client.get(url).status_code == 200:
                    return True
            time.sleep(1.0)
    return False


def tokenizer_option(extra_args: list[str]) -> tuple[bool, Path | None]:
    """(skip the tokenizer check, where the tokenizer is) from vLLM's extra arguments.

    A ``--tokenizer`` that is not a path names a hub repository: vLLM resolves it from
    its own cache, which is not this check's to judge, so it is skipped.
    """
    tokenizer: str | None = None
    for i, arg in enumerate(extra_args):
        if arg == "--skip-tokenizer-init":
            return True, None
        if arg == "--tokenizer" and i + 1 < len(extra_args):
            tokenizer = extra_args[i + 1]
        elif arg.startswith("--tokenizer="):
            tokenizer = arg.split("=", 1)[1]
    if tokenizer is None:
        return False, None
    if tokenizer.startswith(("/", ".")):
        return False, Path(tokenizer)
    return True, None


def model_refusal(cfg: EngineConfig) -> str | None:
    """One line saying why vLLM must not start on cfg's model; None when it is complete."""
    skip, tokenizer = tokenizer_option(cfg.extra_args)
    problems = check_model(cfg.model_path, tokenizer, skip_tokenizer=skip)
    if not problems:
        return None
    shown = [p.message for p in problems[:MAX_PROBLEMS_LOGGED]]
    if len(problems) > MAX_PROBLEMS_LOGGED:
        shown.append(f"and {len(problems) - MAX_PROBLEMS_LOGGED} more")
    return (
        f"refusing to start vLLM: model {cfg.model_path} is incomplete: "
        + "; ".join(shown)
        + " (re-run the model_weights role, or `vllm-fleet model-check` the directory)"
    )


def run(config_path: Path) -> int:
    cfg = EngineConfig.model_validate_json(config_path.read_text())
    # Before anything else: vLLM on an incomplete model fails late and obscurely (or
    # serves garbage); this fails at once with the file named, in the journal.
    refusal = model_refusal(cfg)
    if refusal is not None:
        log(refusal)
        return MODEL_INCOMPLETE_EXIT
    state_dir = Path(os.environ.get("STATE_DIRECTORY", f"/var/lib/vllm-fleet/engines/{cfg.group}"))
    env = dict(os.environ)
    # vLLM needs its own key (VLLM_API_KEY), never the routers' control key (an older
    # settings file may still hold it).
    env.pop(CONTROL_KEY_ENV, None)
    env.update(engine_env(cfg, state_dir))
    for key in ("TMPDIR", "XDG_CACHE_HOME"):
        Path(env[key]).mkdir(parents=True, exist_ok=True)
    asked_to_stop = threading.Event()
    aborting = threading.Event()
    become_subreaper()
    try:
        argv = engine_argv(cfg, os.environ.get("CREDENTIALS_DIRECTORY"))
        trust = engine_trust(cfg)
    except (CredentialsMissing, TrustError) as err:
        log(str(err))
        return SETTINGS_UNUSABLE_EXIT
    child = subprocess.Popen(argv, env=env)

    def on_ready() -> None:
        if wait_healthy(f"{probe_url(cfg)}/health", child, asked_to_stop, trust):
            # The unit's ExecStartPost (root) joins the routers once this says ready.
            notify(f"READY=1\nSTATUS=serving {cfg.served_name} on port {cfg.port}")

    def abort(_signum: int, _frame: object) -> None:
        if not aborting.is_set():
            aborting.set()
            asked_to_stop.set()
            log("asked to abort (the group stopped answering): killing vLLM, no drain")
            # Once reaped, its pid may be another process's: what it left is reap_all's.
            if child.returncode is None:
                kill_tree(child.pid)

    def forward(signum: int, _frame: object) -> None:
        if aborting.is_set():
            return  # a stop ordered with the abort: the abort is already ending it
        if signum == signal.SIGTERM and not asked_to_stop.is_set():
            # The unit's ExecStop (root) has left the routers already.
            notify("STOPPING=1\nSTATUS=draining")
        asked_to_stop.set()
        child.send_signal(signum)
        # A stopped (SIGSTOP, hung) engine acts on nothing until it is continued.
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signal.SIGCONT)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    signal.signal(ABORT, abort)
    start_deaf_thread(on_ready, "readiness", {*FORWARDED, ABORT})
    returncode = child.wait()
    if not asked_to_stop.is_set():
        log(f"vLLM exited on its own (status {returncode}); failing so systemd restarts the group")
        reap_all(grace=5)
        return returncode if returncode > 0 else EXITED_UNASKED
    reap_all(grace=float(cfg.shutdown_timeout) + 5, hurry=aborting)
    if aborting.is_set():
        return ABORTED
    if returncode < 0 and -returncode in FORWARDED:
        return 0
    return returncode


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: vllm-fleet engine-run CONFIG.json", file=sys.stderr)
        return 2
    return run(Path(argv[0]))
