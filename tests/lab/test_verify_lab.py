"""Post-deploy verification against the lab's real engines and router, and proof it can fail.

site.yml ends with verify (the fresh_lab run); playbooks/verify.yml re-runs it alone. The
failure proofs use real engines: one started with --no-enable-prefix-caching (the probe must
fail), and a wrong key (smoke must fail). Cross-talk's proof uses a fixture server that
swaps answers (tests/unit/test_verify_*.py): no real engine can be made to do that.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.lab import ROOT, in_host, playbook

VERIFIER = "router01"
WORK = "/var/lib/vllm-fleet/verify-test"
AGENT = "/opt/vllm-fleet/agent/bin/vllm-fleet"


def latest_report() -> tuple[Path, dict]:
    runs = sorted((ROOT / "reports").glob("2*T*Z"))
    assert runs, "no report directory under reports/"
    return runs[-1], json.loads((runs[-1] / "report.json").read_text())


def test_site_run_ended_with_a_passing_verification(fresh_lab):
    assert "verdict: PASS" in fresh_lab.output or "lab reused" in fresh_lab.output


# make test: the same playbook ends every site.yml (its verdict above); the load's sizing in
# tests/unit/test_verify_sizing.py.
@pytest.mark.full
def test_verify_playbook_reruns_alone_and_proves_concurrency(fresh_lab):
    run = playbook("playbooks/verify.yml")
    assert run.returncode == 0, run.output[-4000:]
    directory, report = latest_report()
    assert (directory / "report.md").read_text().startswith("#")
    assert report["verdict"] == "pass"
    assert len(report["fleet"]) == 2
    checks = {c["name"]: c for c in report["checks"]}
    crosstalk = checks["crosstalk"]["details"]
    sizing = crosstalk["sizing"]
    print(
        f"\nverify.yml: {run.seconds:.0f} s; cross-talk C={crosstalk['concurrency']} "
        f"({sizing['waves']} waves, {sizing['wave_seconds']} s each, {sizing['deadline_setting']} "
        f"{sizing['deadline_seconds']} s), peak running {crosstalk['peak_running']}, "
        f"totals {crosstalk['totals']}"
    )
    # Measured, not fixed: every slot of both engines (2 x max_num_seqs 16) filled, as many
    # waves as end within half the router's deadline, within its admission limit (2 x 32).
    assert sizing["slots"] == 32
    assert 32 <= crosstalk["concurrency"] == sizing["waves"] * 32 <= 64
    assert sizing["projected_seconds"] <= sizing["deadline_seconds"] / 2
    assert crosstalk["totals"]["contaminated"] == 0
    # Both engines were busy at once: the load really overlapped.
    assert all(v > 0 for v in crosstalk["peak_running"]["per_engine"].values())
    assert checks["prefix_cache router"]["status"] == "pass"


def write_config(engines: list[dict], name: str) -> str:
    config = {
        "engines": engines,
        "router": None,
        "crosstalk": {"prompts": 2, "concurrency": 4, "max_tokens": 8},
    }
    path = f"{WORK}/{name}.json"
    in_host(VERIFIER, "mkdir", "-p", "-m", "0700", WORK)
    in_host(VERIFIER, "sh", "-c", f"cat > {path}", stdin=json.dumps(config))
    return path


def env_file(engine_key: str) -> str:
    path = f"{WORK}/keys.env"
    line = f"VLLM_FLEET_ENGINE_API_KEY={engine_key}\n"
    in_host(VERIFIER, "sh", "-c", f"umask 077; cat > {path}", stdin=line)
    return path


def verify(config: str, keys: str, out: str) -> tuple[int, dict]:
    proc = in_host(
        VERIFIER,
        AGENT,
        "verify",
        f"--config={config}",
        f"--env-file={keys}",
        f"--out={WORK}/{out}",
        check=False,
    )
    report = json.loads(in_host(VERIFIER, "cat", f"{WORK}/{out}/report.json").stdout)
    print(f"\n{proc.stdout}")
    return proc.returncode, {c["name"]: c for c in report["checks"]}


def engine_entry(host: str, url: str) -> dict:
    settings = json.loads(in_host(host, "cat", "/etc/vllm-fleet/engines/g0.json").stdout)
    return {
        "host": host,
        "group": "g0",
        "url": url,
        "stack": settings["stack"],
        "model": "smollm2-135m",
        "served_name": "smollm2",
        "revision": Path(settings["model_path"]).name,
        "devices": settings["devices"],
        "max_num_seqs": 4,
        "dtype": "float32",
        "enable_prefix_caching": True,
    }


def test_a_wrong_key_makes_smoke_fail(fresh_lab):
    config = write_config([engine_entry("engine01", "http://engine01:8100")], "wrong-key")
    code, checks = verify(config, env_file("not-the-engine-key"), "wrong-key")
    smoke = checks["smoke engine01/g0"]
    items = {item["name"]: item for item in smoke["details"]["items"]}
    assert code == 1
    assert smoke["status"] == "fail"
    # Failed for the key, not for an unreachable engine: it is up, and it says 401.
    assert items["health"]["ok"]
    assert not items["models"]["ok"] and "401" in items["models"]["detail"]


NOPREFIX_UNIT = "vf-test-no-prefix-cache"
NOPREFIX_PORT = 8300


@pytest.fixture
def engine_without_prefix_caching(fresh_lab) -> Iterator[str]:
    """A second real engine on engine02, started with --no-enable-prefix-caching."""
    host = "engine02"
    settings = json.loads(in_host(host, "cat", "/etc/vllm-fleet/engines/g0.json").stdout)
    argv = [
        f"{settings['stack_dir']}/bin/vllm",
        "serve",
        settings["model_path"],
        "--served-model-name=smollm2",
        f"--port={NOPREFIX_PORT}",
        "--max-model-len=1024",
        "--max-num-seqs=4",
        "--dtype=float32",
        "--kv-cache-memory-bytes=268435456",
        "--enforce-eager",
        "--no-enable-prefix-caching",
    ]
    in_host(
        host,
        "systemd-run",
        f"--unit={NOPREFIX_UNIT}",
        "--property=EnvironmentFile=/etc/vllm-fleet/engines/g0.env",
        "--setenv=HF_HUB_OFFLINE=1",
        "--setenv=VLLM_CPU_OMP_THREADS_BIND=1",
        "--setenv=VLLM_CPU_NUM_OF_RESERVED_CPU=0",
        "--setenv=VLLM_NO_USAGE_STATS=1",
        *argv,
    )
    try:
        deadline = time.monotonic() + 300
        while in_host(
            host, "curl", "-sf", f"http://127.0.0.1:{NOPREFIX_PORT}/health", check=False
        ).returncode:
            assert time.monotonic() < deadline, "the engine without prefix caching never started"
            time.sleep(2)
        yield f"http://{host}:{NOPREFIX_PORT}"
    finally:
        in_host(host, "systemctl", "stop", NOPREFIX_UNIT, check=False)
        in_host(host, "systemctl", "reset-failed", NOPREFIX_UNIT, check=False)


# make test: fleet_verify's Molecule scenario fails the probe on an engine without it.
@pytest.mark.full
def test_an_engine_without_prefix_caching_fails_the_probe(engine_without_prefix_caching):
    engine = engine_entry("engine02", engine_without_prefix_caching)
    config = write_config([engine], "no-prefix-cache")
    key = (ROOT / ".lab/secrets/engine_api_key").read_text().strip()
    code, checks = verify(config, env_file(key), "no-prefix-cache")
    probe = checks["prefix_cache engine02/g0"]
    print(f"prefix probe: {probe['summary']}")
    assert code == 1
    assert probe["status"] == "fail"
    # Everything else about that engine is fine: only the cache check caught it.
    assert checks["smoke engine02/g0"]["status"] in ("pass", "warn")
