"""make attack: what a host on the lab network, and the engine's own user, can do to the fleet.

Each row is tried for real against the converged lab and must be refused; the table (what
was tried, from where, what answered) is printed at the end of the run. A rogue container on
the lab network (tests/lab/conftest.py ``rogue``) stands for any host that is none of the
fleet's; the ``vllm`` user on an engine host stands for vLLM and any code a model ships.
Registering a worker is the prize: a worker receives clients' prompts. The revocation of a
host's control key is the change matrix's row (test_change_matrix_lab.py), which also tries
the revoked key.
"""

from __future__ import annotations

import re
import textwrap

import httpx

from tests.lab.faults import (
    ENGINE_ADDRESSES,
    ROGUE_ADDRESS,
    ROUTER_ADDRESSES,
    control_generation,
    control_key_of,
    secret,
)
from tests.support.lab import ATTACKS, AttackRow, in_host
from tests.support.reach import probe_command
from vllm_fleet.router.control_keys import host_control_key

ROUTER_PORT = 30000
HOST = "engine01"
# Reads a bearer key from stdin (never argv), asks the router to add a worker at the
# attacker's address, prints the HTTP status.
REGISTER = textwrap.dedent(
    """
    import json, sys, urllib.error, urllib.request
    key = sys.stdin.read().strip()
    body = json.dumps({"url": sys.argv[2], "api_key": "x", "model_id": "smollm2"}).encode()
    request = urllib.request.Request(sys.argv[1] + "/workers", data=body, method="POST")
    request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", "Bearer " + key)
    try:
        print(urllib.request.urlopen(request, timeout=5).status)
    except urllib.error.HTTPError as err:
        print(err.code)
    """
)
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def register(host: str, key: str, user: str | None = None) -> str:
    """The status each router answers a worker registration from host (as user) with key."""
    worker = f"http://{ROGUE_ADDRESS}:8100"
    as_user = ["runuser", "-u", user, "--"] if user else []
    answers = []
    for address in ROUTER_ADDRESSES.values():
        router = f"http://{address}:{ROUTER_PORT}"
        argv = [*as_user, "python3", "-c", REGISTER, router, worker]
        answers.append(in_host(host, *argv, stdin=key).stdout.strip())
    return "/".join(sorted(set(answers)))


def record(who: str, tried: str, expected: str, answered: str) -> None:
    ATTACKS.append(AttackRow(who, tried, expected, answered))


def no_rogue_worker() -> None:
    """A registration that got through must not outlive the test: remove it, then fail."""
    headers = {"Authorization": f"Bearer {secret('router_control_key')}"}
    for address in ROUTER_ADDRESSES.values():
        url = f"http://{address}:{ROUTER_PORT}/workers"
        for worker in httpx.get(url, headers=headers, timeout=5).json()["workers"]:
            assert ROGUE_ADDRESS not in worker["url"], worker


def test_a_rogue_host_cannot_register_a_worker_with_any_key_it_could_hold(fresh_lab, rogue):
    keys = {
        "no key": "",
        "the clients' key": secret("router_client_key"),
        "the engines' key": secret("engine_api_key"),
        # What a key stolen from engine01 before a revocation would be (see the change matrix).
        "a key of engine01 the routers do not hold": host_control_key(
            secret("router_control_key"), HOST, control_generation(HOST) + 1000
        ),
    }
    try:
        for what, key in keys.items():
            answered = register(rogue, key)
            record("rogue host", f"register a worker with {what}", "401", answered)
            assert answered == "401", (what, answered)
    finally:
        no_rogue_worker()


def test_a_rogue_host_gets_no_answer_from_an_engine(fresh_lab, rogue):
    """vLLM's key guards /v1 only; the engine firewall drops every other host."""
    for path in ("/invocations", "/pause", "/tokenize", "/v1/models"):
        answered = in_host(
            rogue, "sh", "-c", probe_command(f"http://{ENGINE_ADDRESSES[HOST]}:8100{path}")
        ).stdout.strip()
        record("rogue host", f"call engine01 {path} directly", "dropped", answered)
        assert answered == "dropped", (path, answered)


def test_a_rogue_host_and_a_router_get_no_metrics_from_an_engine_host(fresh_lab, rogue):
    """The watchdog's and node exporter's metrics carry no authentication: only the
    monitoring hosts and the host itself reach them (the monitoring tests prove Prometheus
    still scrapes both)."""
    for port, what in ((9410, "the watchdog's"), (9100, "node exporter's")):
        url = f"http://{ENGINE_ADDRESSES[HOST]}:{port}/metrics"
        for who, client, why in (
            ("rogue host", rogue, ""),
            ("router02", "router02", " (no Prometheus there)"),
        ):
            answered = in_host(client, "sh", "-c", probe_command(url)).stdout.strip()
            record(who, f"read {what} metrics on engine01{why}", "dropped", answered)
            assert answered == "dropped", (who, port, answered)


def test_the_engine_user_cannot_read_or_use_a_control_key(fresh_lab):
    """vLLM runs as vllm: none of the files or processes holding the host's control key is
    readable to it, and no key it can read registers a worker."""
    watchdog = in_host(
        HOST, "systemctl", "show", "-p", "MainPID", "--value", "vllm-fleet-watchdog.service"
    ).stdout.strip()
    for path in (
        "/etc/vllm-fleet/router-control.env",
        "/etc/vllm-fleet/watchdog.env",
        f"/proc/{watchdog}/environ",
    ):
        read = in_host(HOST, "runuser", "-u", "vllm", "--", "cat", path, check=False)
        answered = "refused" if read.returncode != 0 else "read"
        record("vllm on engine01", f"read {path}", "refused", answered)
        assert read.returncode != 0 and "Permission denied" in read.stderr, path
    # The key vllm does hold: the engine key, in vLLM's own environment (the unit's).
    engine_key = secret("engine_api_key")
    try:
        answered = register(HOST, engine_key, user="vllm")
        record("vllm on engine01", "register a worker with the key it can read", "401", answered)
        assert answered == "401"
    finally:
        no_rogue_worker()


WATCHDOG_USER = "vllm-fleet-watchdog"


def systemctl_as(user: str, *argv: str) -> str:
    """What systemd (asking polkit) answered ``user`` running ``systemctl argv``."""
    done = in_host(HOST, "runuser", "-u", user, "--", "systemctl", *argv, check=False)
    if done.returncode == 0:
        return "allowed"
    # polkit's "no" (our rule), or its default for units: an administrator's password,
    # which no one can give here.
    denied = ("Access denied", "Interactive authentication required")
    return "refused" if any(d in done.stderr for d in denied) else f"exit {done.returncode}"


def command(argv: tuple[str, ...]) -> str:
    return "systemctl " + " ".join(arg for arg in argv if arg != "--")


def test_the_watchdog_runs_as_its_own_user_and_may_only_restart_engines(fresh_lab):
    """The watchdog holds the host's control key; it runs as its own user, not root, and
    polkit lets that user do to an engine unit only what it does to a hung group (kill,
    reset-failed, restart). The engine's user may do none of it."""
    unit = "vllm-engine@g0.service"
    pid = in_host(
        HOST, "systemctl", "show", "-p", "MainPID", "--value", "vllm-fleet-watchdog.service"
    ).stdout.strip()
    user = in_host(HOST, "ps", "-o", "user=", "-p", pid).stdout.strip()
    record("root on engine01", "the watchdog's user", WATCHDOG_USER, user)
    assert user == WATCHDOG_USER
    # What the watchdog does to a hung group; each harmless here (a running unit, SIGCONT).
    for tried in (
        ("reset-failed", "--", unit),
        ("kill", "--kill-whom=main", "--signal=SIGCONT", "--", unit),
    ):
        answered = systemctl_as(WATCHDOG_USER, *tried)
        record(WATCHDOG_USER, command(tried), "allowed", answered)
        assert answered == "allowed", tried
    # Anything else, each harmless were it let through (start of a running unit, a journald
    # restart), so that a rule gone wrong fails this test and leaves the lab serving.
    for user, tried in (
        (WATCHDOG_USER, ("start", unit)),
        (WATCHDOG_USER, ("restart", "systemd-journald.service")),
        (WATCHDOG_USER, ("reset-failed", "vllm-fleet-watchdog.service")),
        ("vllm", ("reset-failed", unit)),
        ("vllm", ("kill", "--kill-whom=main", "--signal=SIGCONT", unit)),
    ):
        answered = systemctl_as(user, *tried)
        record(user, command(tried), "refused", answered)
        assert answered == "refused", (user, tried)


def test_an_engine_host_holds_only_its_own_key_and_the_routers_log_who_acted(fresh_lab):
    """The fleet's key never reaches an engine host; each host's key is its own, and the
    routers' audit log names the host behind every worker change."""
    fleet_key = secret("router_control_key")
    for host in ENGINE_ADDRESSES:
        etc = in_host(
            host, "sh", "-c", "cat /etc/vllm-fleet/*.env /etc/vllm-fleet/engines/*"
        ).stdout
        found = "found" if fleet_key in etc else "absent"
        record(
            f"root on {host}", "find the fleet's control key in /etc/vllm-fleet", "absent", found
        )
        assert found == "absent", host
        control = in_host(host, "cat", "/etc/vllm-fleet/router-control.env").stdout
        assert control_key_of(host) in control, host
    for router in ROUTER_ADDRESSES:
        journal = ANSI.sub(
            "",
            in_host(
                router, "journalctl", "--no-pager", "-o", "cat", "-u", "vllm-fleet-router.service"
            ).stdout,
        )
        audit = [line for line in journal.splitlines() if "control_plane_audit" in line]
        added = {
            match[1]
            for line in audit
            if "method=POST path=/workers" in line
            and "outcome=success" in line
            and (match := re.search(r"principal=(\S+)", line))
        }
        hosts = ", ".join(sorted(ENGINE_ADDRESSES))
        denied = sum("outcome=denied" in line for line in audit)
        record(
            f"{router} audit log",
            f"who added workers ({denied} refusals logged)",
            hosts,
            ", ".join(sorted(added)),
        )
        # Each engine host under its own name, and no one else (the lab adds no other worker).
        assert added == set(ENGINE_ADDRESSES), (router, added)
