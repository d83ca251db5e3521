"""site.yml against a fresh lab: real systemd hosts, real vLLM engines, a real model."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess

import pytest
import yaml

from tests.lab.faults import control_key_of
from tests.support.lab import (
    CACHE,
    ENGINES,
    ROOT,
    engine_key,
    engine_settings,
    in_host,
    pinned_revision,
    playbook,
    smoke_in,
)
from vllm_fleet.weights.publish import publish


def test_first_run_deploys_and_smoke_passes(fresh_lab):
    assert fresh_lab.returncode == 0, fresh_lab.output[-5000:]
    recap = fresh_lab.recap()
    assert set(ENGINES) <= set(recap)
    assert all(recap[h]["failed"] == 0 and recap[h]["unreachable"] == 0 for h in recap)
    assert len(re.findall(r"smoke http://[0-9.]+:8100: PASS", fresh_lab.output)) == len(ENGINES)


def test_second_run_changes_nothing(second_run):
    again = second_run
    assert again.returncode == 0, again.output[-5000:]
    recap = again.recap()
    assert set(ENGINES) <= set(recap)
    assert {h: r["changed"] for h, r in recap.items()} == dict.fromkeys(recap, 0)
    print(f"\nidempotent re-run: {again.seconds:.0f} s")


def test_readme_curl_gets_an_answer_from_the_lab(fresh_lab):
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^(curl .*(?:\n  .*)*)$", readme, re.MULTILINE)
    assert commands, "README has no curl command"
    out = subprocess.run(
        commands[0], shell=True, cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    answer = json.loads(out)["choices"][0]["message"]["content"]
    assert "Paris" in answer


def test_each_engine_serves_on_its_own_core_offline_as_its_user(fresh_lab):
    for index, host in enumerate(ENGINES):
        assert engine_settings(host)["devices"] == [index]
        main = in_host(host, "systemctl", "show", "-p", "MainPID", "--value", "vllm-engine@g0")
        child = in_host(host, "pgrep", "-P", main.stdout.strip()).stdout.split()[0]
        environ = in_host(host, "cat", f"/proc/{child}/environ").stdout.split("\0")
        assert f"VLLM_CPU_OMP_THREADS_BIND={index}" in environ
        assert "HF_HUB_OFFLINE=1" in environ
        serving = in_host(host, "ps", "-o", "user:16=,args=", "-p", child).stdout.split()
        assert serving[0] == "vllm" and serving[3] == "serve", serving
        assert serving[4].startswith("/srv/models/smollm2-135m/"), serving


def test_the_keys_stay_out_of_command_lines_output_and_journal(fresh_lab, second_run):
    secrets = ROOT / ".lab/secrets"
    keys = [engine_key()] + [
        (secrets / name).read_text().strip() for name in ("router_client_key", "router_control_key")
    ]
    # Each engine host's own control key, derived from the fleet's.
    keys += [control_key_of(host) for host in ENGINES]
    # Really -vvv: every task's module arguments are shown (where a key would leak).
    assert "module_args:" in second_run.output
    for key in keys:
        assert key not in fresh_lab.output
        assert key not in second_run.output, "a key in site.yml's -vvv output"
    # The reports the fleet wrote on the controller (preflight, plan, verify, deploy records).
    for report in (ROOT / "reports").rglob("*"):
        if report.is_file():
            text = report.read_bytes()
            assert not any(key.encode() in text for key in keys), report
    for host in [*ENGINES, "router01"]:
        cmdlines = in_host(
            host,
            "python3",
            "-c",
            "import glob\nfor p in glob.glob('/proc/[0-9]*/cmdline'):\n"
            "    try: print(open(p, 'rb').read().replace(b'\\0', b' ').decode())\n"
            "    except OSError: pass",
        ).stdout
        assert ("serve /srv/models/" in cmdlines) == (host != "router01")
        journal = in_host(host, "journalctl", "--no-pager", "-o", "cat").stdout
        for key in keys:
            assert key not in cmdlines
            assert key not in journal
        # Root's, but for the engine key (the watchdog's group reads it to probe) and the
        # watchdog's own key.
        key_files = (
            {
                "/etc/vllm-fleet/router.env": "600 root:root",
                "/etc/vllm-fleet/router-control-keys.json": "600 root:root",
                "/var/lib/vllm-fleet/verify/verify.env": "600 root:root",
            }
            if host == "router01"
            else {
                "/etc/vllm-fleet/engines/g0.env": "640 root:vllm-fleet-watchdog",
                "/etc/vllm-fleet/watchdog.env": "600 vllm-fleet-watchdog:vllm-fleet-watchdog",
                "/etc/vllm-fleet/router-control.env": "600 root:root",
            }
        )
        for path, expected in key_files.items():
            mode = in_host(host, "stat", "-c", "%a %U:%G", path).stdout.strip()
            assert mode == expected, path
        # Every file on the host holding a key: readable by its owner (and group) only.
        holders = in_host(
            host, "grep", "-rlsF", "-f", "-", *KEY_SEARCH_DIRS, stdin="\n".join(keys) + "\n",
            check=False,
        ).stdout.split()  # fmt: skip
        assert set(key_files) <= set(holders), holders
        for path in holders:
            mode, owner = in_host(host, "stat", "-c", "%a %U:%G", path).stdout.split()
            print(f"\n{host}: {path} holds a key: {mode} {owner}")
            assert int(mode, 8) & 0o027 == 0, f"{host}:{path} is {mode} {owner}"


# Where a key could be left on a host (the journal is read through journalctl above).
KEY_SEARCH_DIRS = ["/etc", "/opt", "/srv", "/var/lib", "/var/tmp", "/tmp", "/root", "/home", "/run"]


def test_a_wrong_key_makes_smoke_fail(fresh_lab):
    in_host("engine01", "sh", "-c", "umask 077; echo VLLM_API_KEY=not-the-key > /tmp/wrong.env")
    result = smoke_in("engine01", env_file="/tmp/wrong.env")
    assert result.returncode == 1
    assert "[FAIL] models: HTTP 401" in result.stdout


@pytest.fixture
def corrupt_revision(tmp_path):
    """A new revision published to the mirror, then one byte of its weights flipped."""
    source = tmp_path / "model"
    shutil.copytree(CACHE / "converted" / "smollm2-135m", source)
    (source / "NOTICE").write_text("revision used by the corruption test\n")
    mirror_dir = CACHE / "mirror" / "models" / "smollm2-135m"
    revision = publish("smollm2-135m", source, mirror_dir)
    weights = mirror_dir / revision / "model.safetensors"
    expected = hashlib.sha256(weights.read_bytes()).hexdigest()
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))
    actual = hashlib.sha256(bytes(data)).hexdigest()
    yield revision, expected, actual
    shutil.rmtree(mirror_dir / revision)
    # The good files the failed fetch kept for a resume: the next successful run would remove
    # them (and report it as a change); later tests start from the converged lab instead.
    for host in ENGINES:
        in_host(host, "rm", "-rf", f"/srv/models/smollm2-135m/.staging-{revision}")


# make test: tests/unit/test_weights_faults.py (a corrupt or failed fetch keeps the previous
# revision current) and model_weights' scenario (a flipped byte found by both hashes).
@pytest.mark.full
def test_corrupt_weights_fail_the_run_and_the_previous_revision_keeps_serving(
    fresh_lab, corrupt_revision, tmp_path
):
    revision, expected, actual = corrupt_revision
    models = yaml.safe_load((ROOT / "inventories/lab/group_vars/all/models.yml").read_text())
    models["fleet_models"]["smollm2-135m"]["revision"] = revision
    override = tmp_path / "override.yml"
    override.write_text(yaml.safe_dump(models))

    run = playbook("site.yml", "-e", f"@{override}")

    assert run.returncode != 0
    assert f"model.safetensors: sha256 mismatch: expected {expected}, got {actual}" in run.output
    old = pinned_revision()
    staging = f"/srv/models/smollm2-135m/.staging-{revision}"
    for host in ENGINES:
        listing = in_host(host, "ls", "-A", "/srv/models/smollm2-135m").stdout.split()
        # Served: only the old revision. Staged for a resume: the files that verified, never
        # the corrupt one.
        assert sorted(listing) == sorted(["current", old, f".staging-{revision}"]), listing
        staged = in_host(host, "ls", "-A", staging).stdout.split()
        assert "config.json" in staged
        assert "model.safetensors" not in staged
        assert in_host(host, "readlink", "/srv/models/smollm2-135m/current").stdout.strip() == old
        assert str(engine_settings(host)["model_path"]).endswith(old)
        smoke = smoke_in(host)
        assert smoke.returncode == 0, smoke.stdout


# make test-all: a group that fails to start goes through fleet_upgrade's rescue (journal,
# rollback), which make test proves with test_upgrade_lab.py's broken target under load.
@pytest.mark.full
def test_a_group_that_cannot_start_fails_with_its_journal_and_recovers(fresh_lab, tmp_path):
    bad = tmp_path / "bad.yml"
    group = engine_settings("engine02")
    bad.write_text(
        yaml.safe_dump(
            {
                "vllm_engine_start_timeout": 30,
                "fleet_engine_groups": [
                    {
                        "name": "g0",
                        "model": "smollm2-135m",
                        "devices": group["devices"],
                        "port": group["port"],
                        "max_model_len": group["max_model_len"],
                        "max_num_seqs": group["max_num_seqs"],
                        "kv_cache_bytes": group["kv_cache_bytes"],
                        "dtype": group["dtype"],
                        "enforce_eager": True,
                        "extra_args": ["--no-such-flag"],
                    }
                ],
            }
        )
    )
    broken = playbook("site.yml", "--limit", "engine02", "-e", f"@{bad}")
    assert broken.returncode != 0
    assert "engine group g0 (vllm-engine@g0.service) did not start and answer" in broken.output
    assert "unrecognized arguments: --no-such-flag" in broken.output

    restored = playbook("site.yml", "--limit", "engine02")
    assert restored.returncode == 0, restored.output[-5000:]
    assert re.search(r"smoke http://[0-9.]+:8100: PASS", restored.output)


# An apt source that refuses every connection: apt-get update fails (exit 100) on this host.
UNREACHABLE_SOURCE = "deb http://127.0.0.1:9/debian bookworm main\n"
APT_AIRGAP = "/etc/apt/sources.list.d/vllm-fleet-airgap.list"


def test_a_converged_host_whose_mirror_is_gone_needs_no_apt(fresh_lab):
    """Every package the roles install is there: a re-run asks dpkg and never apt's index,
    so a host whose mirror is gone (or an air-gapped one whose image brought its packages)
    converges with no change. apt's lists are made older than any valid time, and a source
    that refuses connections is added: any index update would fail the run."""
    host = "engine02"
    in_host(host, "sh", "-c", f"printf '{UNREACHABLE_SOURCE}' > {APT_AIRGAP}")
    try:
        # As Ansible's apt module sees it (python-apt raises on any failed fetch).
        broken = in_host(host, "apt-get", "update", "-qq", "--error-on=any", check=False)
        assert broken.returncode != 0, "the lab's check needs an index update to fail"
        # Older than any cache_valid_time: the apt module would update the index first.
        stale = "touch -d '3 days ago' /var/lib/apt/lists /var/lib/apt/lists/*_Packages*"
        in_host(host, "sh", "-c", stale + "; rm -f /var/lib/apt/periodic/update-success-stamp")
        tags = "runtime,firewall,watchdog,node_exporter"
        run = playbook("site.yml", "--limit", host, "--tags", tags)
        assert run.returncode == 0, run.output[-5000:]
        assert run.recap()[host]["changed"] == 0, run.recap()
    finally:
        in_host(host, "rm", "-f", APT_AIRGAP)


def test_a_bad_inventory_is_refused_before_any_host_changes(fresh_lab):
    run = playbook(
        "site.yml", "-e", "fleet_engine_stak=cpu-vllm-0.32.0", "-e", "vllm_engine_start_timeout=5"
    )
    assert run.returncode != 0
    assert (
        "fleet_engine_stak='<not shown>': unknown variable did you mean 'fleet_engine_stack'?"
        in run.output
    )
    assert "Engine hosts - accelerator stack, runtime" not in run.output
    assert {h: r["changed"] for h, r in run.recap().items()} == dict.fromkeys(run.recap(), 0)
    for host in ENGINES:
        assert smoke_in(host).returncode == 0


def test_preflight_plans_the_lab_from_the_installed_config(fresh_lab):
    run = playbook("playbooks/preflight.yml", "--check")
    assert run.returncode == 0, run.output[-3000:]
    # 1.5 GiB / 46080 bytes per token (SmolLM2-135M, float32 KV), read from the host's config.json
    assert (
        "| engine01 | g0 | cpu-vllm-0.32.0 | 0 | 46080 | 1.50 GiB | 34952 | 17.07 | 2048"
        in run.output
    )
    # MemoryMax: the bfloat16 weights served in float32, the KV cache and 4 GiB of overhead
    # (the YAML callback wraps the row before its last cells).
    assert "| 16 | 6.00 GiB |" in run.output


def test_each_engine_runs_under_the_memory_bound_preflight_planned(fresh_lab):
    for host in ENGINES:
        settings = engine_settings(host)
        shown = in_host(host, "systemctl", "show", "-p", "MemoryMax", "--value", "vllm-engine@g0")
        assert int(shown.stdout) == settings["memory_max_bytes"], (host, shown.stdout)
        # weights (float32) + KV cache + the 4 GiB overhead
        assert settings["memory_max_bytes"] > settings["kv_cache_bytes"] + 4 * 1024**3


@pytest.fixture
def bare_host(tmp_path):
    """A fresh systemd container from the base image, in an inventory of its own."""
    name = "vf-e2e-checkmode"
    subprocess.run(["podman", "rm", "--force", name], capture_output=True, check=False)
    subprocess.run(
        ["podman", "run", "-d", "--name", name, "--systemd=always",
         "localhost/vllm-fleet-lab:bookworm", "/lib/systemd/systemd"],
        capture_output=True, check=True,
    )  # fmt: skip
    inventory = tmp_path / "inventory"
    shutil.copytree(ROOT / "inventories/lab/group_vars", inventory / "group_vars")
    (inventory / "host_vars").mkdir()
    shutil.copy(
        ROOT / "inventories/lab/host_vars/engine01.yml", inventory / "host_vars" / f"{name}.yml"
    )
    (inventory / "hosts.yml").write_text(
        yaml.safe_dump(
            {"all": {"vars": {"ansible_connection": "podman",
                              "ansible_python_interpreter": "/usr/bin/python3"},
                     # A one-host fleet: it reaches itself on loopback.
                     "children": {"engines": {"hosts": {name: {"fleet_address": "127.0.0.1"}}},
                                  "monitoring": {"hosts": {name: None}},
                                  "node_exporter": {"hosts": {name: None}}}}}
        )
    )  # fmt: skip
    in_host(name, "systemctl", "is-system-running", "--wait", check=False)
    yield name, inventory
    subprocess.run(["podman", "rm", "--force", name], capture_output=True, check=False)


# make test: the drift case runs site.yml --check --diff on the lab and asserts it changed
# nothing there.
@pytest.mark.full
def test_check_mode_on_a_bare_host_reports_changes_and_makes_none(fresh_lab, bare_host):
    name, inventory = bare_host
    # The key goes in a 0600 vars file, never on a command line.
    key_file = inventory / "key.yml"
    key_file.touch(mode=0o600)
    secrets = ROOT / ".lab/secrets"
    keys = {
        "fleet_engine_api_key": engine_key(),
        "fleet_router_client_key": (secrets / "router_client_key").read_text().strip(),
        "fleet_router_control_key": (secrets / "router_control_key").read_text().strip(),
    }
    key_file.write_text(yaml.safe_dump(keys))
    run = playbook("-i", str(inventory), "site.yml", "--check", "--diff", "-e", f"@{key_file}")
    assert run.returncode == 0, run.output[-5000:]
    assert run.recap()[name]["changed"] > 0
    state = in_host(
        name, "sh", "-c", "ls -A /opt /srv; ls /etc/vllm-fleet /etc/prometheus; id vllm",
        check=False,
    )  # fmt: skip
    assert state.stdout.split() == ["/opt:", "/srv:"]
    assert state.stderr.count("No such file or directory") == 2
    assert "no such user" in state.stderr
