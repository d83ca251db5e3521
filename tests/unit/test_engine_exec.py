"""engine-run as a main process: forwards SIGTERM and reaps every descendant.

The stack's ``bin/vllm`` here is a fixture process tree (a parent that leaves an
orphaned grandchild behind), standing in for vLLM's API server and engine core.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.unit.conftest import make_model

FIXTURE_VLLM = textwrap.dedent(
    """\
    #!{python}
    import os, signal, subprocess, sys, time
    state = os.environ["FIXTURE_STATE"]
    # A grandchild that outlives this process, as an engine core can.
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(state + "/argv", "w").write(" ".join(sys.argv[1:]))
    open(state + "/env", "w").write(os.environ.get("VLLM_CPU_OMP_THREADS_BIND", ""))
    open(state + "/grandchild", "w").write(str(grandchild.pid))
    def stop(signum, frame):
        open(state + "/got", "w").write(str(signum))
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    open(state + "/ready", "w").write("1")
    while not os.path.exists(state + "/die"):
        time.sleep(0.05)
    # As vLLM's API server does once its engine core is gone: a clean exit, unasked.
    sys.exit(0)
    """
)


def write_stack(tmp_path: Path) -> Path:
    stack = tmp_path / "stack"
    (stack / "bin").mkdir(parents=True)
    vllm = stack / "bin" / "vllm"
    vllm.write_text(FIXTURE_VLLM.format(python=sys.executable))
    vllm.chmod(0o755)
    return stack


def wait_for(path: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def start_engine_run(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path, dict]:
    state = tmp_path / "state"
    state.mkdir()
    cfg = {
        "group": "g0",
        "accelerator": "cpu",
        "stack": "s",
        "stack_dir": str(write_stack(tmp_path)),
        # engine-run refuses incomplete models before starting vLLM: give it a complete one.
        "model_path": str(make_model(tmp_path / "model")),
        "served_name": "m",
        "port": 8100,
        "devices": [0, 1],
        "max_model_len": 128,
        "max_num_seqs": 2,
        "kv_cache_bytes": 1 << 20,
        "shutdown_timeout": 0,
    }
    config = tmp_path / "g0.json"
    config.write_text(json.dumps(cfg))
    env = dict(os.environ, FIXTURE_STATE=str(state), STATE_DIRECTORY=str(tmp_path / "statedir"))
    # Its log in a file: a test that fails shows what engine-run said (exit_status()).
    with (tmp_path / "engine-run.log").open("wb") as log:
        wrapper = subprocess.Popen(
            [sys.executable, "-m", "vllm_fleet.cli", "engine-run", str(config)],
            env=env,
            stderr=log,
        )
    wait_for(state / "ready")
    return wrapper, state, cfg


def exit_status(wrapper: subprocess.Popen[bytes], tmp_path: Path) -> int:
    """engine-run's exit status; 30 s is a bound for a hang, far above the second it takes."""
    try:
        return wrapper.wait(timeout=30)
    except subprocess.TimeoutExpired:
        wrapper.kill()
        raise AssertionError((tmp_path / "engine-run.log").read_text()[-3000:]) from None


def test_sigterm_is_forwarded_and_orphans_are_reaped(tmp_path):
    wrapper, state, cfg = start_engine_run(tmp_path)
    grandchild = int((state / "grandchild").read_text())
    argv = (state / "argv").read_text()
    assert argv.startswith(f"serve {cfg['model_path']} --served-model-name m")
    assert (state / "env").read_text() == "0-1"

    wrapper.send_signal(signal.SIGTERM)
    assert wrapper.wait(timeout=30) == 0
    assert (state / "got").read_text() == str(int(signal.SIGTERM))
    # The orphaned grandchild was adopted by the wrapper and killed after the grace time.
    assert not pid_alive(grandchild)


def test_an_abort_kills_a_stopped_engine_at_once_and_fails_the_unit(tmp_path):
    wrapper, state, _ = start_engine_run(tmp_path)
    grandchild = int((state / "grandchild").read_text())
    vllm = [
        int(p) for p in Path(f"/proc/{wrapper.pid}/task/{wrapper.pid}/children").read_text().split()
    ]
    # The hung engine: stopped, it would act on no SIGTERM and drain nothing.
    for pid in [*vllm, grandchild]:
        os.kill(pid, signal.SIGSTOP)
    wrapper.send_signal(signal.SIGUSR1)
    # A stop systemd orders right after the abort changes nothing.
    wrapper.send_signal(signal.SIGTERM)
    # 75, not the 0 of a drain that ended after its grace: it was aborted.
    assert exit_status(wrapper, tmp_path) == 75
    assert not any(pid_alive(pid) for pid in [*vllm, grandchild])


def blocked_signals(pid: int, tid: int) -> set[int]:
    status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
    mask = int(
        next(line for line in status.splitlines() if line.startswith("SigBlk:")).split()[1], 16
    )
    return {n for n in range(1, 65) if mask >> (n - 1) & 1}


def test_only_the_main_thread_can_take_the_signals_it_handles(tmp_path):
    """Python runs signal handlers in the main thread, which waits for vLLM in waitpid(): a
    signal the kernel hands to another thread would not wake it, and a hung vLLM would never
    be aborted (1 run in about 20 under load hung so before every other thread was made to
    block them)."""
    wrapper, _, _ = start_engine_run(tmp_path)
    handled = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1}
    tasks = [int(t.name) for t in Path(f"/proc/{wrapper.pid}/task").iterdir()]
    others = [tid for tid in tasks if tid != wrapper.pid]
    try:
        assert others, "engine-run runs its readiness check in a thread"
        assert not handled & blocked_signals(wrapper.pid, wrapper.pid)
        for tid in others:
            assert handled <= blocked_signals(wrapper.pid, tid), tid
    finally:
        wrapper.send_signal(signal.SIGTERM)
        exit_status(wrapper, tmp_path)


def test_an_abort_during_a_drain_kills_what_is_left_at_once(tmp_path):
    wrapper, state, _ = start_engine_run(tmp_path)
    grandchild = int((state / "grandchild").read_text())
    wrapper.send_signal(signal.SIGTERM)
    # vLLM (the fixture) has exited; engine-run is waiting out the grace for its orphan.
    wait_for(state / "got")
    wrapper.send_signal(signal.SIGUSR1)
    assert exit_status(wrapper, tmp_path) == 75
    assert not pid_alive(grandchild)


def test_vllm_exiting_unasked_with_status_0_is_a_failure_systemd_restarts(tmp_path):
    wrapper, state, _ = start_engine_run(tmp_path)
    grandchild = int((state / "grandchild").read_text())
    (state / "die").write_text("1")
    # Not 0: with Restart=on-failure a 0 here would leave the group down for good.
    assert wrapper.wait(timeout=30) == 70
    assert not (state / "got").exists()
    assert not pid_alive(grandchild)
