"""sglang-router in front of a real vLLM engine: TLS, keys, binds, registration, admission.

Both hops speak HTTPS with certificates from the fleet CA: client -> router, and router ->
engine (vLLM with --ssl-certfile/--ssl-keyfile; the router trusts the CA alone through its
unit's SSL_CERT_FILE, for its requests and its health checks alike).

Client traffic comes from the engine's container over the scenario's network, as it would
from any other host; the router is reached by name (vf-router) on its own address, over
HTTPS with its certificate from the fleet CA, which the clients trust alone.
"""

from __future__ import annotations

import json
import shlex
import time

import pytest
from tests.molecule_hosts import podman_host

ROUTER = "vf-router"
ENGINE = "vf-router-engine"
UNIT = "vllm-fleet-router.service"
ENGINE_UNIT = "vllm-engine@g0.service"
ROUTER_URL = f"https://{ROUTER}:30000"
# The fleet CA's certificate on every host (host_tls); the router's own key stays root-only.
CA = "/etc/vllm-fleet/tls/ca.crt"
HOST_KEY = "/etc/vllm-fleet/tls/host.key"
WORKER_URL = f"https://{ENGINE}:8100"
# The engines' own key (host_tls a second time): root-only on disk; systemd hands a copy to
# the engine unit alone.
ENGINE_TLS_KEY = "/etc/vllm-fleet/tls/engine.key"
CLIENT_KEY = "molecule-only-router-client-key-52e8c1"
CONTROL_KEY = "molecule-only-router-control-key-a93f06"
ENGINE_KEY = "molecule-only-engine-key-7d41b0"
RETIRING_KEY = "molecule-only-retiring-control-key-3c9e21"
KEYS = (CLIENT_KEY, CONTROL_KEY, ENGINE_KEY, RETIRING_KEY)
CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def router():
    return podman_host(ROUTER)


@pytest.fixture(scope="module")
def engine():
    return podman_host(ENGINE)


def call(client, method, path, key=None, body=None):
    """(status, body) of a request to the router, sent from ``client``'s container.

    HTTP/1.1, as the fleet's clients (httpx, the OpenAI SDK) speak it: over HTTP/2 (curl's
    choice once TLS offers it) sglang-router 0.3.2 answers a refused POST by resetting the
    stream before it reads the body, and curl then reports exit 92 instead of the 401."""
    args = ["curl", "-s", "-m", "30", "--http1.1", "--cacert", CA, "-X", method,
            "-w", "\n%{http_code}", ROUTER_URL + path]  # fmt: skip
    if key is not None:
        args += ["-H", f"Authorization: Bearer {key}"]
    if body is not None:
        args += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
    out = client.check_output(shlex.join(args))
    text, _, status = out.rpartition("\n")
    return int(status), text


def workers(client):
    status, text = call(client, "GET", "/workers", key=CONTROL_KEY)
    assert status == 200, text
    return {w["url"]: w for w in json.loads(text)["workers"]}


def unit_processes(router):
    """(pid, user) of every process in the router unit's cgroup."""
    rows = router.check_output("ps -eo pid=,user:32=,unit:64=").splitlines()
    return [(pid, user) for pid, user, unit in map(str.split, rows) if unit == UNIT]


def test_router_runs_as_its_own_unprivileged_user(router):
    unit = router.service("vllm-fleet-router")
    assert unit.is_running
    assert unit.is_enabled
    main = router.check_output(f"systemctl show -p MainPID --value {UNIT}")
    processes = unit_processes(router)
    assert main in [pid for pid, _ in processes]
    assert {user for _, user in processes} == {"vllm-router"}


def test_keys_are_on_no_command_line_and_not_in_the_journals(router, engine):
    # The launcher builds the router's arguments in-process: argv stays key-free (and
    # sglang-router then retitles itself "sglang::router").
    ps = router.check_output("ps -eo user,args")
    assert "sglang::router" in ps
    for pid, _ in unit_processes(router):
        cmdline = router.check_output(f"tr '\\0' ' ' < /proc/{pid}/cmdline")
        for key in KEYS:
            assert key not in cmdline
    for key in KEYS:
        assert key not in ps
    for host in (router, engine):
        journal = host.check_output("journalctl --no-pager -o cat")
        for key in KEYS:
            assert key not in journal


def test_keys_are_not_in_the_router_process_environment(router):
    for pid, _ in unit_processes(router):
        environ = router.check_output(f"tr '\\0' '\\n' < /proc/{pid}/environ")
        for key in (CLIENT_KEY, CONTROL_KEY, RETIRING_KEY):
            assert key not in environ, f"a key is in /proc/{pid}/environ"


def test_router_env_is_root_only(router):
    env = router.file("/etc/vllm-fleet/router.env")
    assert (env.user, env.group, env.mode) == ("root", "root", 0o600)
    settings = router.file("/etc/vllm-fleet/router.json")
    assert (settings.user, settings.group, settings.mode) == ("root", "vllm-router", 0o640)
    for key in KEYS:
        assert key not in settings.content_string


def test_router_listens_on_its_own_address_only(router):
    address = router.check_output("ip -4 -o addr show scope global | awk '{print $4}'")
    address = address.split("/")[0]
    listeners = router.check_output("ss -Hltn | awk '{print $4}'").split()
    ours = sorted(sock for sock in listeners if sock.rsplit(":", 1)[1] in ("30000", "29000"))
    assert ours == sorted([f"{address}:30000", f"{address}:29000"])
    # The metrics endpoint answers there (and only there).
    fetch = "curl -s -m 5 -o /dev/null -w '%{{http_code}}' http://{}:29000/metrics"
    assert router.check_output(fetch.format(address)) == "200"
    assert router.run(fetch.format("127.0.0.1")).rc != 0  # connection refused


def test_the_client_port_speaks_https_with_a_certificate_from_the_fleet_ca_alone(router, engine):
    # Verified against the fleet CA, for the name the engine hosts call it by.
    status, text = call(engine, "GET", "/liveness")
    assert status == 200, text
    # A client that trusts the system's CAs (not the fleet's) refuses the handshake: curl's
    # exit 60 (the peer's certificate cannot be verified).
    system = engine.run(f"curl -s -m 10 -o /dev/null https://{ROUTER}:30000/liveness")
    assert system.rc == 60, (system.rc, system.stderr)
    # Plain HTTP gets no HTTP answer on the client port.
    plain = engine.run(
        f"curl -s -m 10 -o /dev/null -w '%{{http_code}}' http://{ROUTER}:30000/liveness"
    )
    assert plain.stdout.strip() in ("", "000"), plain.stdout
    # The router's user cannot read the host's key: systemd hands it a copy (LoadCredential=).
    key = router.file(HOST_KEY)
    assert (key.user, key.group, key.mode) == ("root", "root", 0o600)
    unreadable = router.run(f"runuser -u vllm-router -- cat {HOST_KEY}")
    assert unreadable.rc != 0
    assert "BEGIN" not in router.file("/etc/vllm-fleet/router.json").content_string


def test_engine_registered_itself_and_is_healthy(engine):
    listed = workers(engine)
    assert list(listed) == [WORKER_URL]
    assert listed[WORKER_URL]["is_healthy"] is True


def test_chat_completion_through_the_router_with_the_client_key(engine):
    status, text = call(engine, "POST", "/v1/chat/completions", key=CLIENT_KEY, body=CHAT)
    assert status == 200, text
    answer = json.loads(text)
    assert answer["choices"][0]["message"]["content"]
    assert answer["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize(
    ("method", "path", "key", "body"),
    [
        ("POST", "/v1/chat/completions", None, CHAT),
        # The engines' key is the router's to present; clients cannot use it.
        ("POST", "/v1/chat/completions", ENGINE_KEY, CHAT),
        ("POST", "/workers", CLIENT_KEY, {"url": "http://203.0.113.9:8100"}),
        ("POST", "/workers", None, {"url": "http://203.0.113.9:8100"}),
        ("GET", "/workers", CLIENT_KEY, None),
    ],
    ids=[
        "chat-no-key",
        "chat-engine-key",
        "add-worker-client-key",
        "add-worker-no-key",
        "list-workers-client-key",
    ],
)
def test_refusals(engine, method, path, key, body):
    status, text = call(engine, method, path, key=key, body=body)
    assert status == 401, text
    assert list(workers(engine)) == [WORKER_URL]


def test_a_retiring_control_key_still_manages_workers_but_serves_no_client(engine):
    """Mid-rotation the router takes the old control key beside the new one (engine hosts
    not yet moved keep joining and leaving), and neither control key is a client key."""
    status, text = call(engine, "GET", "/workers", key=RETIRING_KEY)
    assert status == 200, text
    assert [w["url"] for w in json.loads(text)["workers"]] == [WORKER_URL]
    for key in (RETIRING_KEY, CONTROL_KEY):
        status, text = call(engine, "POST", "/v1/chat/completions", key=key, body=CHAT)
        assert status == 401, text


def test_a_stopping_engine_leaves_the_router_before_it_exits(engine):
    invocation = engine.check_output(f"systemctl show -p InvocationID --value {ENGINE_UNIT}")
    main = engine.check_output(f"systemctl show -p MainPID --value {ENGINE_UNIT}")
    server = engine.check_output(f"cat /proc/{main}/task/*/children").split()[0]
    engine.check_output(f"systemctl stop --no-block {ENGINE_UNIT}")
    # While the stop runs: the router forgets the engine while vLLM is still up.
    deadline = time.monotonic() + 15
    while WORKER_URL in workers(engine):
        assert time.monotonic() < deadline, "still a worker 15 s into the stop"
    assert engine.run(f"test -d /proc/{server}").rc == 0, "vLLM exited before it left"
    engine.check_output(f"systemctl stop {ENGINE_UNIT}")  # waits for the stop job
    assert engine.check_output(f"systemctl show -p ActiveState --value {ENGINE_UNIT}") == (
        "inactive"
    )
    assert WORKER_URL not in workers(engine)
    assert engine.check_output(f"systemctl show -p Result --value {ENGINE_UNIT}") == "success"
    journal = engine.check_output(
        f"journalctl --no-pager -o cat _SYSTEMD_INVOCATION_ID={invocation}"
    ).splitlines()
    left = [i for i, line in enumerate(journal) if f"left router {ROUTER_URL}" in line]
    assert left, "no 'left router' line in the engine's journal"
    # vLLM starts shutting down (and draining) only after the router forgot it.
    shutdown = [i for i, line in enumerate(journal) if "[shutdown]" in line]
    assert shutdown, journal[-20:]
    assert left[0] < shutdown[0], journal[left[0] - 2 : shutdown[0] + 2]


def test_a_started_engine_is_registered_when_start_returns(engine):
    # Type=notify: the start returns once the engine is healthy and joined the router.
    engine.check_output(f"systemctl start {ENGINE_UNIT}")
    assert WORKER_URL in workers(engine)
    status, text = call(engine, "POST", "/v1/chat/completions", key=CLIENT_KEY, body=CHAT)
    assert status == 200, text


ADMISSION = r"""
import json, ssl, sys, threading, urllib.error, urllib.request
url, key, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
trust = ssl.create_default_context(cafile=sys.argv[4])
body = json.dumps({"model": "smollm2", "max_tokens": 48, "temperature": 0,
                   "messages": [{"role": "user", "content": "Count from one to fifty."}]}).encode()
barrier, results = threading.Barrier(n), []
def ask():
    req = urllib.request.Request(url, data=body, headers={
        "Authorization": "Bearer " + key, "Content-Type": "application/json"})
    barrier.wait()
    try:
        with urllib.request.urlopen(req, timeout=60, context=trust) as resp:
            results.append((resp.status, resp.headers.get("Retry-After")))
    except urllib.error.HTTPError as err:
        results.append((err.code, err.headers.get("Retry-After")))
threads = [threading.Thread(target=ask) for _ in range(n)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(results))
"""


def test_admission_refuses_the_excess_with_429(engine):
    # max_num_seqs 4 x admission_factor 2: the router admits 8 at once, refuses the rest.
    out = engine.check_output(
        f"python3 -c {shlex.quote(ADMISSION)} {ROUTER_URL}/v1/chat/completions {CLIENT_KEY} 20 {CA}"
    )
    results = json.loads(out)
    codes = [code for code, _ in results]
    ok, refused = codes.count(200), codes.count(429)
    retry_after = [value for code, value in results if code == 429 and value is not None]
    print(
        f"admission: 20 concurrent -> {ok} x 200, {refused} x 429, "
        f"Retry-After on {len(retry_after)} of the 429s"
    )
    assert ok + refused == 20, codes
    assert ok >= 1
    assert refused >= 1
    assert ok <= 8
    # sglang-router 0.3.2 refuses with a bare 429: no Retry-After header (observed).
    assert retry_after == []


def test_the_engine_serves_https_only_with_the_engines_certificate(router, engine):
    """From the router host: the system's CAs are refused at the engine's handshake, plain
    HTTP gets no answer, the fleet CA alone verifies it (the engine's name and its address)."""
    health = f"{WORKER_URL}/health"
    fetch = "curl -s -m 10 -o /dev/null -w '%{{http_code}}' {} {}"
    assert router.run(fetch.format("--cacert " + CA, health)).stdout == "200"
    system = router.run(fetch.format("", health))
    assert system.rc == 60, (system.rc, system.stdout)  # curl: the peer's certificate refused
    plain = router.run(fetch.format("", health.replace("https://", "http://")))
    assert plain.stdout != "200", plain.stdout
    key = engine.file(ENGINE_TLS_KEY)
    assert (key.user, key.group, key.mode) == ("root", "root", 0o600)
    # The engine's own key is not the host's (which it never gets).
    assert engine.file("/etc/vllm-fleet/tls/host.key").content != key.content


def test_vllm_reads_its_key_from_the_units_credentials_not_the_root_only_file(engine):
    pid = engine.check_output(f"systemctl show -p MainPID --value {ENGINE_UNIT}")
    children = engine.check_output(f"ps -o args= --ppid {pid}")
    assert "--ssl-keyfile /run/credentials/" + ENGINE_UNIT + "/engine-tls.key" in children
    refused = engine.run(f"runuser -u vllm -- cat {ENGINE_TLS_KEY}")
    assert refused.rc != 0 and "Permission denied" in refused.stderr


def test_the_router_trusts_the_fleet_ca_alone_for_its_engines(router):
    # The unit's environment (the router retitles itself over its own /proc/<pid>/environ).
    environment = router.check_output(f"systemctl show -p Environment --value {UNIT}").split()
    assert f"SSL_CERT_FILE={CA}" in environment
    # ... and beside it an empty CA directory, not the system's.
    [cert_dir] = [v.split("=", 1)[1] for v in environment if v.startswith("SSL_CERT_DIR=")]
    assert router.check_output(f"ls -A {cert_dir}") == ""
    worker = workers(router)[WORKER_URL]
    assert worker["is_healthy"] is True, worker
