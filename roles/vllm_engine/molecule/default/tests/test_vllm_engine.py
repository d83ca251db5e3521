"""A real vLLM engine runs under systemd as vllm_engine configured it."""

import json

from tests.molecule_hosts import podman_hosts

testinfra_hosts = podman_hosts()

UNIT = "vllm-engine@g0.service"
KEY = "molecule-only-engine-key-3f9c2a"
CHAT = json.dumps(
    {"model": "smollm2", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4}
)


def engine_address(host):
    """Where the group listens: the host's primary address (vllm_engine_bind_host)."""
    return json.loads(host.file("/etc/vllm-fleet/engines/g0.json").content_string)["host"]


def curl_status(host, path, key=None, body=None):
    url = f"http://{engine_address(host)}:8100{path}"
    args = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", url]
    if body is not None:
        args += ["-H", "Content-Type: application/json", "-d", body]
    if key is not None:
        args += ["-H", f"Authorization: Bearer {key}"]
    return host.check_output(" ".join(f"'{a}'" for a in args))


def engine_pids(host):
    return host.check_output("pgrep -u vllm").split()


def test_unit_is_running_and_enabled(host):
    unit = host.service("vllm-engine@g0")
    assert unit.is_running
    assert unit.is_enabled


def test_smoke_passes_from_the_agent(host):
    out = host.check_output(
        "vllm-fleet smoke --config /etc/vllm-fleet/engines/g0.json "
        "--env-file /etc/vllm-fleet/engines/g0.env"
    )
    assert "PASS" in out


def test_requests_without_or_with_a_wrong_key_are_refused(host):
    assert curl_status(host, "/v1/models") == "401"
    assert curl_status(host, "/v1/chat/completions", key="wrong-key", body=CHAT) == "401"
    assert curl_status(host, "/v1/chat/completions", key=KEY, body=CHAT) == "200"


def test_secrets_files_are_private(host):
    env = host.file("/etc/vllm-fleet/engines/g0.env")
    # The watchdog's group reads the key to probe with; the engine's user does not.
    assert (env.user, env.group, env.mode) == ("root", "vllm-fleet-watchdog", 0o640)
    settings = host.file("/etc/vllm-fleet/engines/g0.json")
    assert (settings.user, settings.group, settings.mode) == ("root", "vllm", 0o640)
    assert KEY not in settings.content_string


def test_key_is_on_no_command_line_and_not_in_the_journal(host):
    cmdlines = host.check_output("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '")
    assert KEY not in cmdlines
    journal = host.run(f"journalctl -u {UNIT} --no-pager -o cat").stdout
    assert "Application startup complete" in journal
    assert KEY not in journal


def test_engine_runs_unprivileged_offline_and_pinned(host):
    pids = engine_pids(host)
    assert pids, "no process of user vllm"
    serving = host.check_output("ps -eo user:16,args | grep '[ ]serve /srv/models'").splitlines()
    assert serving
    assert all(line.split()[0] == "vllm" for line in serving), serving
    main = host.check_output(f"systemctl show -p MainPID --value {UNIT}")
    children = host.check_output(f"pgrep -P {main}").split()
    environ = host.check_output(f"cat /proc/{children[0]}/environ | tr '\\0' '\\n'").splitlines()
    assert "HF_HUB_OFFLINE=1" in environ
    assert "VLLM_CPU_OMP_THREADS_BIND=0" in environ
    model_arg = host.check_output(f"cat /proc/{children[0]}/cmdline | tr '\\0' ' '")
    assert " serve /srv/models/smollm2-135m/" in model_arg


def test_listens_only_on_the_private_address(host):
    address = engine_address(host)
    assert address in host.check_output("hostname -I").split(), address
    listening = host.check_output("ss -ltnH 'sport = :8100'").splitlines()
    assert [line.split()[3] for line in listening] == [f"{address}:8100"], listening
    assert curl_status_at(host, "127.0.0.1") == "000"  # nothing on loopback or a wildcard


def curl_status_at(host, address):
    return host.check_output(
        f"curl -s -o /dev/null -w '%{{http_code}}' http://{address}:8100/health || true"
    )


def test_the_group_runs_under_its_memory_bound(host):
    """The group's MemoryMax= reaches systemd through its own drop-in (the template unit is
    shared by every group), and its settings name the same bound."""
    dropin = host.file(f"/etc/systemd/system/{UNIT}.d/g0.conf")
    assert (dropin.user, dropin.mode) == ("root", 0o644)
    assert host.check_output(f"systemctl show -p MemoryMax --value {UNIT}") == "6442450944"
    settings = json.loads(host.file("/etc/vllm-fleet/engines/g0.json").content_string)
    assert settings["memory_max_bytes"] == 6442450944
    assert host.check_output(f"systemctl show -p NeedDaemonReload --value {UNIT}") == "no"


def test_sandboxing_scores_ok(host):
    line = host.check_output(f"systemd-analyze security {UNIT} | tail -1")
    score = float(line.split(":")[1].split()[0])
    assert score <= 2.0, line


def test_stop_drains_and_leaves_nothing_behind(host):
    host.check_output(f"systemctl stop {UNIT}")
    assert host.check_output(f"systemctl show -p Result --value {UNIT}") == "success"
    journal = host.run(f"journalctl -u {UNIT} --no-pager -o cat").stdout
    # A stop that hangs ends with systemd's SIGKILL after TimeoutStopSec.
    assert "timed out. Killing" not in journal
    assert "Application shutdown complete" in journal
    assert host.run("pgrep -u vllm").rc == 1
