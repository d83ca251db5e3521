"""The change matrix: each kind of inventory change, made with the playbook an operator would
use, while a bounded client load runs through the router.

Every row asserts: no failed non-streaming request, no cut stream, at least one engine of each
served name the load asks for in the router's rotation at every sample, the run (and so its
verification) passed, a second run changes nothing, and every engine host's deployed.json and
settings name what runs. The table is printed at the end of the session (CI's tail).

Rows are cumulative: each starts from the state the previous one left. ``make test`` runs the
rows not marked ``full`` (one per mechanism: a host left half-applied by a dead run, which
site.yml finishes from the host's actual state as a rolling change, and a refused unsafe
change), without the idempotent rerun the lab's second site.yml run already proves;
``make test-all`` runs them all, the controller really SIGKILLed mid-upgrade among them. They run after
the rolling-upgrade tests (tests/lab/conftest.py), which leave the lab on revision B with
max_num_seqs 12; the first row brings it back to the inventory's settings through site.yml.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.lab.faults import (
    ENGINE_ADDRESSES,
    ROUTER,
    ROUTER_ADDRESSES,
    ROUTERS,
    VIP,
    control_generation,
    control_key_of,
    secret,
    vip_holder,
    wait_until,
)
from tests.support.lab import (
    ATTACKS,
    CACHE,
    ENGINES,
    MATRIX_HEADER,
    ROOT,
    AttackRow,
    MatrixRow,
    PlaybookRun,
    engine_settings,
    in_host,
    playbook,
    record_matrix_row,
)
from vllm_fleet.lab.client_load import ClientLoad, LoadStats
from vllm_fleet.lab.paths import LabPaths
from vllm_fleet.lab.rotation import RotationSampler
from vllm_fleet.router.client import RouterTarget, identify, router_client
from vllm_fleet.router.control_keys import host_control_key
from vllm_fleet.weights.publish import publish

VARIANT = "change-matrix"
CHECK = "/usr/libexec/vllm-fleet/router-vip-check"  # router_vip_check_path
BASE = ROOT / "inventories" / "lab"
MODEL = "smollm2-135m"
SECOND = "smollm2-135m-b"  # the same files, published under a second name
SECOND_NAME = "smollm2-b"
MODEL_NAME = "smollm2"

Inventory = dict[str, Any]  # relative path of a YAML file -> its data


def read_inventory() -> Inventory:
    return {
        str(p.relative_to(BASE)): yaml.safe_load(p.read_text()) for p in sorted(BASE.rglob("*.yml"))
    }


def write_inventory(data: Inventory) -> Path:
    """inventories/<VARIANT>: inside inventories/ because the lab inventory finds its
    secrets relative to itself."""
    target = ROOT / "inventories" / VARIANT
    shutil.rmtree(target, ignore_errors=True)
    for relative, content in data.items():
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(content, sort_keys=False))
    return target


def groups_of(inv: Inventory, host: str) -> list[dict[str, Any]]:
    return inv[f"host_vars/{host}.yml"]["fleet_engine_groups"]


def models_of(inv: Inventory) -> dict[str, Any]:
    return inv["group_vars/all/models.yml"]["fleet_models"]


def fleet_of(inv: Inventory) -> dict[str, Any]:
    return inv["group_vars/all/fleet.yml"]


def served_urls(inv: Inventory) -> dict[str, list[str]]:
    """served name -> the worker URLs the router lists for it, per the inventory."""
    out: dict[str, list[str]] = {}
    models = models_of(inv)
    for host in ENGINES:
        for group in groups_of(inv, host):
            name = models[group["model"]]["served_name"]
            out.setdefault(name, []).append(f"http://{ENGINE_ADDRESSES[host]}:{group['port']}")
    return out


class Matrix:
    """The lab's inventory as the rows have left it."""

    def __init__(self) -> None:
        self.inventory = read_inventory()
        # "TASK name: host" of each change the last idempotent rerun made (none, when it held).
        self.rerun_changes: list[str] = []

    def apply(
        self,
        change: str,
        edit: Callable[[Inventory], None],
        *,
        playbook_path: str = "site.yml",
        load_names: list[str] | None = None,
        rerun: bool = True,
        during: Callable[[subprocess.Popen[str]], None] | None = None,
        tags: str = "",
        retries: int = 0,
        extra: tuple[str, ...] = (),
        client_key: str | None = None,
        other_client_key: str | None = None,
    ) -> tuple[MatrixRow, PlaybookRun]:
        """``client_key``: the key the clients present at the start (the one the routers take
        now; default the inventory's client key); ``other_client_key``: the one they retry a
        401 with."""
        target = json.loads(json.dumps(self.inventory))
        edit(target)
        path = write_inventory(target)
        before = served_urls(self.inventory)
        after = served_urls(target)
        # The load asks only for names served before and after the change (a client of a
        # name being retired has moved off it first: that is the safe sequence).
        names = load_names or sorted(set(before) & set(after))
        watched = sorted({u for n in names for u in set(before[n]) & set(after[n])})
        with ExitStack() as stack:
            sampler = stack.enter_context(
                RotationSampler(ROUTER, secret("router_control_key"), watched)
            )
            loads = [
                stack.enter_context(
                    ClientLoad(
                        ROUTER,
                        client_key or secret("router_client_key"),
                        n,
                        plain=2,
                        streams=1,
                        retries=retries,
                        other_key=other_client_key,
                    )
                )
                for n in names
            ]
            run = run_playbook(playbook_path, path, during, tags, extra)
        stats = merged([c.stats for c in loads])
        min_serving = min(
            (
                # URLs that serve the name before and after: a URL moving to another name
                # must not count for the one it leaves.
                sum(sample.get(u, False) for u in set(before[n]) & set(after[n]))
                for _, sample in sampler.rotation.samples
                for n in names
            ),
            default=0,
        )
        rerun_changed = None
        if run.returncode == 0 and rerun:
            second = playbook(playbook_path, "-i", str(path), *tag_args(tags), *extra)
            assert second.returncode == 0, second.output[-4000:]
            rerun_changed = sum(h["changed"] for h in second.recap().values())
            self.rerun_changes = changed_tasks(second.output)
        row = MatrixRow(
            change,
            Path(playbook_path).name + (f" -t {tags}" if tags else ""),
            run.seconds,
            stats,
            min_serving,
            "passed" if run.returncode == 0 else "killed" if run.returncode < 0 else "failed",
            rerun_changed,
            len(names),
        )
        record_matrix_row(row)
        print(f"\n{MATRIX_HEADER}\n{row.line()}")
        if run.returncode == 0:
            self.inventory = target
        return row, run


def changed_tasks(output: str) -> list[str]:
    """Each "changed: [host]" of a playbook's output, with the task it came from."""
    task, found = "", []
    for line in output.splitlines():
        if line.startswith("TASK ["):
            task = line.split("]", 1)[0].removeprefix("TASK [")
        elif line.startswith("changed: ["):
            found.append(f"{task}: {line.split('[', 1)[1].split(']', 1)[0]}")
    return found


def tag_args(tags: str) -> list[str]:
    return ["--tags", tags] if tags else []


def run_playbook(
    playbook_path: str,
    inventory: Path,
    during: Callable[[subprocess.Popen[str]], None] | None,
    tags: str = "",
    extra: tuple[str, ...] = (),
) -> PlaybookRun:
    if during is None:
        return playbook(playbook_path, "-i", str(inventory), *tag_args(tags), *extra)
    started = time.monotonic()
    log = ROOT / "reports" / f"change-matrix-{int(time.time())}.log"
    log.parent.mkdir(exist_ok=True)
    with log.open("w") as out:
        proc = subprocess.Popen(
            ["ansible-playbook", playbook_path, "-i", str(inventory), *tag_args(tags), *extra],
            cwd=ROOT,
            stdout=out,
            stderr=out,
            text=True,
            start_new_session=True,
        )
        during(proc)
        returncode = proc.wait()
    return PlaybookRun(returncode, log.read_text(), time.monotonic() - started)


def merged(all_stats: list[LoadStats]) -> LoadStats:
    out = LoadStats()
    for s in all_stats:
        out.plain_ok += s.plain_ok
        out.plain_failed += s.plain_failed
        out.plain_retried += s.plain_retried
        out.streams_ok += s.streams_ok
        out.streams_cut += s.streams_cut
        out.streams_refused += s.streams_refused
        out.key_switches += s.key_switches
        out.plain_seconds += s.plain_seconds
        out.failures += s.failures
    return out


def assert_row(row: MatrixRow, run: PlaybookRun, inv: Inventory, *, rerun: bool = True) -> None:
    assert run.returncode == 0, run.output[-6000:]
    stats = row.stats
    assert stats.plain_ok > 0, "the load never got an answer: it did not overlap the change"
    assert stats.plain_failed == 0, stats.failures[:5]
    assert stats.streams_cut == stats.streams_refused == 0, stats.failures[:5]
    assert row.min_serving >= 1, "a served name had no engine in the router's rotation"
    # Rows make test runs leave the idempotent rerun to the lab's second site.yml run.
    assert row.rerun_changed == (0 if rerun else None)
    assert_host_matches(inv)


def assert_host_matches(inv: Inventory) -> None:
    """Each engine host runs what its files say, holds nothing, and records the inventory."""
    models = models_of(inv)
    for host in ENGINES:
        state = json.loads(in_host(host, "vllm-fleet", "engine-state").stdout)
        assert state["pending_restart"] == [], (host, state)
        assert state["run_holds"] == [] and state["operator_holds"] == [], (host, state)
        wanted = {g["name"] for g in groups_of(inv, host)}
        assert set(state["groups"]) == wanted, (host, state)
        record = json.loads(in_host(host, "cat", "/etc/vllm-fleet/deployed.json").stdout)
        revisions = {g["model"]: models[g["model"]]["revision"] for g in groups_of(inv, host)}
        assert record["models"] == revisions, (host, record)
        for group in groups_of(inv, host):
            settings = json.loads(
                in_host(host, "cat", f"/etc/vllm-fleet/engines/{group['name']}.json").stdout
            )
            assert settings["max_num_seqs"] == group["max_num_seqs"]
            assert settings["served_name"] == models[group["model"]]["served_name"]


@pytest.fixture(scope="module")
def matrix(fresh_lab) -> Iterator[Matrix]:
    assert fresh_lab.returncode == 0, fresh_lab.output[-3000:]
    yield Matrix()
    shutil.rmtree(ROOT / "inventories" / VARIANT, ignore_errors=True)


# make test rolls site.yml through the interrupted-upgrade row's rerun (below).
@pytest.mark.full
def test_revision_and_settings_roll_through_site_yml(matrix):
    """site.yml rolls an engine change host by host behind a drain, as upgrade.yml does.
    After the upgrade tests (revision B, max_num_seqs 12) it goes back to the inventory's
    revision and settings (the router's admission limit was never moved off them); on a lab
    already there (make matrix) it changes max_model_len."""
    at_inventory = all(engine_settings(h)["max_num_seqs"] == 16 for h in ENGINES)

    def edit(inv: Inventory) -> None:
        for host in ENGINES:
            for group in groups_of(inv, host):
                group["max_model_len"] = 1920 if at_inventory else group["max_model_len"]

    change = "max_model_len" if at_inventory else "revision + max_num_seqs"
    row, run = matrix.apply(change, edit)
    assert_row(row, run, matrix.inventory)


HALF_APPLY = """\
# What a controller leaves when it dies after rendering a group's new settings and draining
# it, before the restart and the release (fleet_upgrade's own order).
- hosts: engine01
  become: true
  gather_facts: true
  gather_subset: [network]
  vars_files: [{root}/catalog/stacks.yml]
  vars:
    # What the run's preflight planned (max_model_len leaves a CPU engine's bound as it is).
    preflight_memory_plan: {{g0: {memory_max_bytes}}}
  tasks:
    - name: Render the new settings (the engine keeps running the old ones)
      ansible.builtin.include_role:
        name: vllm_engine
        tasks_from: render.yml
    - name: Drain the group, as the run did before it died
      ansible.builtin.command:
        argv: [vllm-fleet, traffic, drain, /etc/vllm-fleet/engines/g0.json,
               --env-file=/etc/vllm-fleet/engines/g0.env, --timeout=60,
               --reason=upgrade interrupted-by-the-change-matrix, --min-peers=1]
      changed_when: true
"""


# make test: the restart and hold decisions from a host's actual state (files newer than the
# process, a dead run's hold) in tests/unit/test_rollout.py; the engine roll behind a drain
# that finishes them in the second-model row.
@pytest.mark.full
def test_a_half_applied_host_is_finished_from_its_actual_state(matrix, tmp_path):
    """The run died on engine01 after its new settings were rendered and it was drained:
    its files say max_model_len 1792, its engine runs the old settings, it is held. The next
    site.yml sees no file to change, yet restarts it (files newer than its process), checks
    it and lifts the dead run's hold; engine02, unchanged, is left alone."""

    # max_model_len, not max_num_seqs: the router's admission limit follows the engines'
    # max_num_seqs, and the lone lab router restarts when it changes (see the README).
    def edit(inv: Inventory) -> None:
        groups_of(inv, "engine01")[0]["max_model_len"] = 1792

    half = tmp_path / "half-apply.yml"
    bound = engine_settings("engine01")["memory_max_bytes"]
    half.write_text(HALF_APPLY.format(root=ROOT, memory_max_bytes=bound))
    died = playbook(str(half), "-i", str(write_inventory(edited(matrix, edit))))
    assert died.returncode == 0, died.output[-4000:]
    state = json.loads(in_host("engine01", "vllm-fleet", "engine-state").stdout)
    assert state["pending_restart"] == ["g0"] and state["run_holds"] == ["g0"], state
    assert state["groups"]["g0"]["newer_than_process"] == ["g0.json"], state
    untouched = engine_settings("engine02")
    since = int(time.time())
    # The engine phases only (preflight runs always): the row is about the engine play's
    # decisions; the rows of make test-all run the whole site.yml.
    row, run = matrix.apply(
        "half-applied host, then site.yml", edit, rerun=False, tags="engines,watchdog"
    )
    assert_row(row, run, matrix.inventory, rerun=False)
    # The old engine stopped cleanly (vLLM's own shutdown, not systemd's SIGKILL).
    journal = in_host(
        "engine01", "journalctl", "-u", "vllm-engine@g0", "--since", f"@{since}", "-o", "cat"
    ).stdout
    assert "Application shutdown complete" in journal and "timed out. Killing" not in journal
    assert engine_settings("engine02") == untouched
    report = sorted((ROOT / "reports").glob("rollout-*/report.json"))[-1]
    hosts = json.loads(report.read_text())["hosts"]
    assert [(h["host"], h["outcome"]) for h in hosts] == [
        ("engine01", "upgraded"),
        ("engine02", "unchanged"),
    ]


@pytest.mark.full
def test_interrupted_upgrade_converges_on_the_next_run(matrix):
    """The controller is SIGKILLed at a random moment of an upgrade.yml run (the seed is
    printed); site.yml then decides from the hosts' actual state what to restart and which
    holds to lift, and the fleet ends serving the inventory with nothing held."""

    def edit(inv: Inventory) -> None:
        for host in ENGINES:
            for group in groups_of(inv, host):
                group["max_model_len"] = 1664

    seed = int(os.environ.get("VLLM_FLEET_MATRIX_SEED", time.time()))
    rng = random.Random(seed)

    killed: list[float] = []

    def kill_mid_run(proc: subprocess.Popen[str]) -> None:
        # Between the start of the canary's drain and the end of the second host's
        # release: wait for the first hold to appear, then a random share of a restart.
        wait_until(lambda: any_hold() or proc.poll() is not None, 600, "a group held")
        delay = rng.uniform(0, 60)
        print(f"\n[matrix] seed {seed}: SIGKILL {delay:.1f} s after the first hold")
        time.sleep(delay)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            killed.append(delay)

    killed_row, run = matrix.apply(
        "controller SIGKILL mid-upgrade",
        edit,
        playbook_path="playbooks/upgrade.yml",
        rerun=False,
        during=kill_mid_run,
    )
    assert killed, f"seed {seed}: the run ended before the kill; {run.output[-2000:]}"
    # Clients saw nothing of the controller's death: the drained group was out of rotation.
    assert killed_row.stats.plain_failed == 0, killed_row.stats.failures[:5]
    assert killed_row.stats.streams_cut == killed_row.stats.streams_refused == 0
    assert killed_row.min_serving >= 1
    # The rerun: site.yml on the same target converges from whatever the kill left.
    target = json.loads(json.dumps(matrix.inventory))
    edit(target)
    matrix.inventory = target
    row, rerun = matrix.apply("  then site.yml rerun", lambda inv: None)
    assert_row(row, rerun, matrix.inventory)


def any_hold() -> bool:
    for host in ENGINES:
        listing = in_host(host, "ls", "/var/lib/vllm-fleet/hold", check=False).stdout.split()
        if listing:
            return True
    return False


def test_a_change_that_would_leave_a_served_name_without_engines_is_refused(matrix):
    """Both groups moved to a new served name at once: preflight refuses it before any host
    changes, naming the safe sequences, and nothing on the hosts moved."""

    def both(inv: Inventory) -> None:
        models_of(inv)[SECOND] = {**models_of(inv)[MODEL], "served_name": SECOND_NAME}
        for host in ENGINES:
            groups_of(inv, host)[0]["model"] = SECOND

    before = {host: engine_settings(host) for host in ENGINES}
    refused = playbook("site.yml", "-i", str(write_inventory(edited(matrix, both))))
    assert refused.returncode != 0
    assert "served now by engine01/g0, engine02/g0" in refused.output
    assert "no engine group serves it after this change" in refused.output
    assert "fleet_retired_served_names: [smollm2]" in refused.output
    assert {host: engine_settings(host) for host in ENGINES} == before


def test_a_second_model_beside_the_first_behind_one_router(matrix):
    """engine02 moves to a second model with its own served name while clients of the first
    keep being served (rolled behind a drain, the router already in its multi-model mode, so
    it does not restart); then the router lists both names, every request for each name is
    answered by that name's own engines (the regular mode sent about half to the other
    model's, which answered 404), and the verification checks each name on its own engines.
    make test's rows after this one run with both names served."""

    def beside(inv: Inventory) -> None:
        models_of(inv)[SECOND] = second_model(models_of(inv)[MODEL], SECOND_NAME)
        groups_of(inv, "engine02")[0]["model"] = SECOND

    # Weights, the engine phases and the run's closing verification: the router does not
    # change (already multi-model, and the admission limit follows max_num_seqs, which stay).
    row, run = matrix.apply(
        "second model beside the first",
        beside,
        rerun=False,
        tags="weights,engines,watchdog,record,verify",
    )
    assert_row(row, run, matrix.inventory, rerun=False)
    assert router_model_names() == sorted([MODEL_NAME, SECOND_NAME])
    for name, engines in [(MODEL_NAME, ["engine01"]), (SECOND_NAME, ["engine02"])]:
        assert answered_by_model(name, 16) == {name: 16}, name
        assert rotation_of(name) == engines
    # The run's own verification, after the change: each name on its own engines.
    report = last_verify_report()
    assert report["served_names"] == sorted([MODEL_NAME, SECOND_NAME]), report["served_names"]
    assert report["verdict"] == "pass"


@pytest.mark.full
def test_the_second_model_is_retired(matrix):
    """engine02 goes back to the first model and the second name is retired (the router
    stops listing it); the lab ends on its inventory's model."""
    assert router_model_names() == sorted([MODEL_NAME, SECOND_NAME])

    def back(inv: Inventory) -> None:
        groups_of(inv, "engine02")[0]["model"] = MODEL
        fleet_of(inv)["fleet_retired_served_names"] = [SECOND_NAME]

    row, run = matrix.apply(
        "  then the second model retired", back, rerun=False, tags="engines,watchdog,record"
    )
    assert_row(row, run, matrix.inventory, rerun=False)
    assert engine_model_dirs() == dict.fromkeys(ENGINES, MODEL)
    assert router_model_names() == [MODEL_NAME]


def vip_moves() -> int:
    """Times any router took the VIP so far (keepalived's journals)."""
    return sum(
        in_host(host, "journalctl", "-u", "keepalived", "-o", "cat", check=False).stdout.count(
            "Entering MASTER STATE"
        )
        for host in ROUTERS
    )


# OpenAI's Python SDK retries a request that got no response twice by default.
SDK_RETRIES = 2


# make test rolls the routers behind the VIP in the cut-off row's rerun (below).
@pytest.mark.full
def test_a_router_setting_rolls_one_router_at_a_time_behind_the_vip(matrix):
    """The routing policy changes (cache_aware -> round_robin): site.yml restarts the routers
    one at a time, each first handing the VIP to the other, answering what it has in flight
    from the VIP kept on its loopback, and waiting for its engines before it may hold the VIP
    again. A VIP move resets the clients' open connections (their packets reach the new
    holder): an idle keep-alive connection's next request gets no response, which the clients
    retry as the OpenAI SDK does (at most once per connection per move), and a stream running
    at that instant is cut (at most one per move per streaming client)."""
    change_router_policy(matrix, "round_robin")


PENDING = "/opt/vllm-fleet/routers/restart-pending"  # router_restart_pending_flag
DRAIN = "/run/vllm-fleet/router-drain"  # router_drain_flag


def exists(host: str, path: str) -> bool:
    return in_host(host, "test", "-e", path, check=False).returncode == 0


def vip_on_loopback(host: str) -> bool:
    shown = in_host(host, "ip", "-o", "-4", "addr", "show", "dev", "lo", "to", f"{VIP}/32")
    return bool(shown.stdout.strip())


def runs_its_settings(host: str) -> bool:
    """The router process started after its settings file was last written."""
    written = int(in_host(host, "stat", "-c", "%Y", "/etc/vllm-fleet/router.json").stdout)
    started = in_host(
        host,
        "systemctl",
        "show",
        "--timestamp=unix",
        "--property=ExecMainStartTimestamp",
        "--value",
        "vllm-fleet-router.service",
    ).stdout.strip()
    return started.startswith("@") and int(started[1:]) >= written


def eligible_for_vip(host: str) -> bool:
    """keepalived's own check passes on host (run as keepalived runs it)."""
    check = in_host(
        host, "setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", CHECK, check=False
    )
    return check.returncode == 0


def test_a_router_restart_cut_off_mid_drain_is_finished_by_the_next_run(matrix):
    """The policy changes (back to cache_aware after the row above, to round_robin where
    that row did not run), and the controller is SIGKILLed as soon as the first router is
    drained for its restart: that router is left drained (and, if it held the VIP, with its
    copy on the loopback) and its restart pending, while the other router serves. The next
    site.yml run first ends the drain on every router, then finishes the pending restart and
    rolls the second router; both end running the new setting, eligible for the VIP again,
    nothing left behind."""
    first = ROUTERS[0]  # the router play runs the routers in inventory order, one at a time
    killed: list[bool] = []
    was = fleet_of(matrix.inventory)["fleet_router"].get("policy", "cache_aware")
    policy = "round_robin" if was == "cache_aware" else "cache_aware"

    def kill_when_drained(proc: subprocess.Popen[str]) -> None:
        wait_until(lambda: exists(first, DRAIN) or proc.poll() is not None, 600, "a drain")
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            killed.append(True)

    def edit(inv: Inventory) -> None:
        fleet_of(inv)["fleet_router"]["policy"] = policy

    row, run = matrix.apply(
        "router restart cut off mid-drain",
        edit,
        rerun=False,
        tags="router",
        retries=SDK_RETRIES,
        during=kill_when_drained,
    )
    assert killed, f"the run ended before {first} was drained: {run.output[-3000:]}"
    assert exists(first, DRAIN) and exists(first, PENDING), "the cut-off left no trace to heal"
    assert row.stats.plain_ok > 0 and row.stats.plain_failed == 0, row.stats.failures[:5]
    assert row.stats.streams_refused == 0, row.stats.line()

    target = json.loads(json.dumps(matrix.inventory))
    edit(target)
    matrix.inventory = target
    change_router_policy(matrix, policy, label="  then site.yml -t router rerun")
    for host in ROUTERS:
        assert not exists(host, DRAIN) and not exists(host, PENDING), host
        assert not vip_on_loopback(host), host
        assert runs_its_settings(host), f"{host} still runs the settings it had before"
        assert eligible_for_vip(host), f"{host}: keepalived's check fails"
    assert vip_holder() in ROUTERS


# make test: the holder's peer check (tests/unit/test_router_vip.py) and the cut-off row's
# rolled routers, each handing the VIP over first.
@pytest.mark.full
def test_a_router_holding_the_vip_is_not_restarted_while_no_other_can_take_it(matrix):
    """The other router is stopped; a restart of the VIP holder (site.yml -l holder, its
    log level changed) is refused before it drains, naming the other router and why; the
    holder keeps the VIP and serves, its restart pending. Once the other router is back,
    the next run finishes the restart."""
    holder = vip_holder()
    assert holder in ROUTERS
    other = next(h for h in ROUTERS if h != holder)
    target = json.loads(json.dumps(matrix.inventory))
    fleet_of(target)["fleet_router"]["log_level"] = "error"
    path = write_inventory(target)
    args = ["site.yml", "-i", str(path), "--tags", "router", "--limit", holder]
    in_host(other, "systemctl", "stop", "vllm-fleet-router.service")
    try:
        with ClientLoad(ROUTER, secret("router_client_key"), MODEL_NAME, plain=2) as load:
            refused = playbook(*args)
        assert refused.returncode != 0, refused.output[-3000:]
        assert f"host {holder}: no other router can take the VIP {VIP}" in refused.output
        assert f"{other}: its router does not answer" in refused.output, refused.output[-3000:]
        assert load.stats.plain_ok > 0 and load.stats.plain_failed == 0, load.stats.failures[:5]
        assert vip_holder() == holder and not exists(holder, DRAIN)
        assert exists(holder, PENDING)
    finally:
        in_host(other, "systemctl", "start", "vllm-fleet-router.service")
    wait_until(lambda: eligible_for_vip(other), 120, f"{other} ready again")
    finished = playbook(*args)
    assert finished.returncode == 0, finished.output[-3000:]
    assert not exists(holder, PENDING) and runs_its_settings(holder)
    matrix.inventory = target


def assert_through_vip_moves(
    row: MatrixRow, run: PlaybookRun, moved: int, *, must_move: bool = True
) -> None:
    """A row that restarts the routers: each moved the VIP at most once; the clients lost
    nothing but what a VIP move costs them (see the router-policy row). ``must_move``
    False: a row whose router restart depends on the state the rows before left (with no
    move, nothing may be lost at all). Each move costs each client at most one: Matrix.apply
    runs 2 non-streaming clients and 1 streaming one per served name."""
    plain_clients, stream_clients = 2 * row.names, row.names
    assert run.returncode == 0, run.output[-6000:]
    assert (1 if must_move else 0) <= moved <= len(ROUTERS), moved
    stats = row.stats
    assert stats.plain_ok > 0 and stats.plain_failed == 0, stats.failures[:5]
    assert stats.plain_retried <= moved * plain_clients, stats.line()
    assert stats.streams_refused == 0, stats.line()
    assert stats.streams_cut <= moved * stream_clients, stats.line()
    assert row.min_serving >= 1


def change_router_policy(matrix: Matrix, policy: str, label: str = "") -> None:
    def edit(inv: Inventory) -> None:
        fleet_of(inv)["fleet_router"]["policy"] = policy

    moves = vip_moves()
    row, run = matrix.apply(
        label or f"router policy -> {policy}",
        edit,
        rerun=False,
        tags="router",
        retries=SDK_RETRIES,
    )
    assert_through_vip_moves(row, run, vip_moves() - moves)
    for host in ROUTERS:
        config = json.loads(in_host(host, "cat", "/etc/vllm-fleet/router.json").stdout)
        assert config["router_args"]["policy"] == policy, (host, config)


def answered_by_model(name: str, count: int) -> dict[str, int]:
    """Send count short chat requests for name through the router; the model each 200 named
    (an engine of another model answers 404, which counts under its status)."""
    headers = {"Authorization": f"Bearer {secret('router_client_key')}"}
    body = {"model": name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    seen: dict[str, int] = {}
    with httpx.Client(timeout=120) as client:
        for _ in range(count):
            response = client.post(f"{ROUTER}/v1/chat/completions", headers=headers, json=body)
            key = (
                response.json()["model"]
                if response.status_code == 200
                else str(response.status_code)
            )
            seen[key] = seen.get(key, 0) + 1
    return seen


def rotation_of(name: str) -> list[str]:
    """The engine hosts the router lists as healthy workers of name."""
    headers = {"Authorization": f"Bearer {secret('router_control_key')}"}
    listing = httpx.get(f"{ROUTER}/workers", headers=headers, timeout=10)
    listing.raise_for_status()
    return sorted(
        engine_host(w["url"])
        for w in listing.json()["workers"]
        if w.get("model_id") == name and w.get("is_healthy")
    )


def engine_host(url: str) -> str:
    """The lab host a worker URL names: routers list engines by address (fleet_address)."""
    address = httpx.URL(url).host
    return next((h for h, a in ENGINE_ADDRESSES.items() if a == address), address)


@pytest.mark.full
def test_max_model_len_and_watchdog_settings(matrix):
    def model_len(inv: Inventory) -> None:
        for host in ENGINES:
            groups_of(inv, host)[0]["max_model_len"] = 1536

    row, run = matrix.apply("max_model_len", model_len)
    assert_row(row, run, matrix.inventory)

    def watchdog(inv: Inventory) -> None:
        fleet_of(inv)["fleet_watchdog"]["interval_seconds"] = 6

    row, run = matrix.apply("watchdog settings", watchdog)
    assert_row(row, run, matrix.inventory)


@pytest.mark.full
def test_an_engine_stack_version_change_and_back(matrix):
    """cpu-vllm-0.32.0 -> 0.31.0 -> 0.32.0: each stack installs beside the other while the
    old one serves, then the groups roll onto it (the field failure behind the cross-talk
    check was a version upgrade). The 0.31.0 wheelhouse is built on demand (cached)."""
    prepare = subprocess.run(
        [sys.executable, "-m", "vllm_fleet.lab", "prepare", "--only", "wheelhouse-extra"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert prepare.returncode == 0, prepare.stdout[-2000:] + prepare.stderr[-2000:]
    for stack in ("cpu-vllm-0.31.0", "cpu-vllm-0.32.0"):

        def to(inv: Inventory, stack: str = stack) -> None:
            fleet_of(inv)["fleet_engine_stack"] = stack

        row, run = matrix.apply(f"engine stack -> {stack}", to)
        assert_row(row, run, matrix.inventory)
        for host in ENGINES:
            assert engine_settings(host)["stack"] == stack
            version = in_host(host, f"/opt/vllm-fleet/stacks/{stack}/bin/vllm", "--version")
            assert stack.rsplit("-", 1)[1] in version.stdout


@pytest.mark.full
def test_a_change_that_fails_its_verification_is_rolled_back(matrix):
    """max_model_len 64 starts (the watchdog's 1-token probe fits) but fails the canary's
    direct verification (the cross-talk prompts do not fit): the canary goes back to its
    previous settings, the run stops before the second host, and nothing was dropped."""
    before = {host: engine_settings(host) for host in ENGINES}

    def too_short(inv: Inventory) -> None:
        for host in ENGINES:
            groups_of(inv, host)[0]["max_model_len"] = 64

    row, run = matrix.apply(
        "rollback after failed verify", too_short, playbook_path="playbooks/upgrade.yml"
    )
    assert run.returncode != 0
    assert row.stats.plain_failed == 0, row.stats.failures[:5]
    assert row.stats.streams_cut == row.stats.streams_refused == 0
    assert row.min_serving >= 1
    reports = sorted((ROOT / "reports").glob("upgrade-*/report.json"))
    hosts = json.loads(reports[-1].read_text())["hosts"]
    assert [(h["host"], h["outcome"], h["step"]) for h in hosts] == [
        ("engine01", "rolled back", "verify")
    ]
    assert {host: engine_settings(host) for host in ENGINES} == before
    assert_host_matches(matrix.inventory)


def edited(matrix: Matrix, edit: Callable[[Inventory], None]) -> Inventory:
    target = json.loads(json.dumps(matrix.inventory))
    edit(target)
    return target


def second_model(first: dict[str, Any], served_name: str) -> dict[str, Any]:
    """The second model, published to the lab mirror as an operator would
    (`vllm-fleet weights publish`): the same files under their own name, so the mirror's
    manifest names that model (a copy of the first entry is refused at fetch: the
    manifest would be for the first model)."""
    revision = publish(SECOND, CACHE / "converted" / MODEL, LabPaths.default().models / SECOND)
    url = first["url"].rsplit("/", 1)[0] + f"/{SECOND}"
    return {**first, "url": url, "revision": revision, "served_name": served_name}


def last_verify_report() -> dict[str, Any]:
    """The last run's fleet-wide verification (reports/<UTC stamp>/report.json)."""
    return json.loads(sorted((ROOT / "reports").glob("2*/report.json"))[-1].read_text())


def router_model_names() -> list[str]:
    headers = {"Authorization": f"Bearer {secret('router_client_key')}"}
    listing = httpx.get(f"{ROUTER}/v1/models", headers=headers, timeout=10)
    listing.raise_for_status()
    return sorted(m["id"] for m in listing.json()["data"])


def engine_model_dirs() -> dict[str, str]:
    """host -> the weights directory its group's engine loads (/srv/models/<model>/<rev>)."""
    return {h: Path(engine_settings(h)["model_path"]).parent.name for h in ENGINES}


@pytest.mark.full
def test_a_new_model_takes_over_the_served_name(matrix):
    """The model change that needs no client to move: a newly published model takes over
    the old one's served name, rolled one host at a time
    behind a drain under load, so clients asking for `smollm2` are answered throughout; then
    the first model takes it back, so the lab ends on the inventory's model."""

    def take_over(inv: Inventory) -> None:
        models_of(inv)[SECOND] = second_model(models_of(inv)[MODEL], MODEL_NAME)
        for host in ENGINES:
            groups_of(inv, host)[0]["model"] = SECOND

    def give_back(inv: Inventory) -> None:
        for host in ENGINES:
            groups_of(inv, host)[0]["model"] = MODEL

    for change, edit, model in [
        ("new model takes over the served name", take_over, SECOND),
        ("first model takes it back", give_back, MODEL),
    ]:
        row, run = matrix.apply(change, edit)
        assert_row(row, run, matrix.inventory)
        assert engine_model_dirs() == dict.fromkeys(ENGINES, model)
        report = last_verify_report()
        assert report["served_names"] == [MODEL_NAME], report["served_names"]
        assert report["verdict"] == "pass"
        assert router_model_names() == [MODEL_NAME]


def new_key(name: str) -> str:
    """A fresh key of the kind `vllm_fleet.lab prepare` makes (urlsafe, 32 bytes)."""
    return f"{name.replace('_', '-')}-{secrets.token_urlsafe(32)}"


def keep_lab_secret(name: str, value: str) -> None:
    """The lab inventory reads its keys from .lab/secrets: a finished rotation writes the new
    key there, as an operator would update the vault (later tests and runs use it)."""
    path = ROOT / ".lab/secrets" / name
    path.write_text(value + "\n")
    path.chmod(0o600)


def test_a_key_rotation_the_routers_would_refuse_mid_run_is_refused(matrix):
    """A new control key without the old one retiring, and a new client key without the
    run saying the clients moved: preflight refuses both before any host changes, naming
    host, key and the safe sequence, and shows neither key."""
    control, client = new_key("router_control_key"), new_key("router_client_key")

    def one_run(inv: Inventory) -> None:
        fleet_of(inv)["fleet_router_control_key"] = control
        fleet_of(inv)["fleet_router_client_key"] = client

    before = {host: engine_settings(host) for host in ENGINES}
    refused = playbook("site.yml", "-i", str(write_inventory(edited(matrix, one_run))))
    assert refused.returncode != 0
    for host in ENGINES:
        assert f"{host}: fleet_router_control_key='<redacted>'" in refused.output
    for host in ROUTERS:
        assert f"{host}: fleet_router_client_key='<redacted>'" in refused.output
    assert "list the current one in fleet_router_control_keys_retiring" in refused.output
    assert "-e fleet_router_client_key_cutover=true" in refused.output
    for key in (control, client, secret("router_control_key"), secret("router_client_key")):
        assert key not in refused.output
    assert {host: engine_settings(host) for host in ENGINES} == before


GENERATION = "fleet_router_control_key_generation"


@pytest.mark.full
def test_a_hosts_control_key_revoked_under_load(matrix):
    """engine01's key is taken to be stolen: its generation is raised. The routers restart one
    at a time behind the VIP with engine01's new key in place of the old one, engine01's
    watchdog and units get the new key and re-register its engines; the old key, the one a
    thief holds, is refused by both routers; engine02's key is untouched."""
    fleet_key = secret("router_control_key")
    generation = control_generation("engine01")
    stolen = host_control_key(fleet_key, "engine01", generation)
    issued = host_control_key(fleet_key, "engine01", generation + 1)

    def revoke(inv: Inventory) -> None:
        inv["host_vars/engine01.yml"][GENERATION] = generation + 1

    moves = vip_moves()
    row, run = matrix.apply(
        "engine01's control key revoked", revoke, rerun=False, retries=SDK_RETRIES
    )
    assert_through_vip_moves(row, run, vip_moves() - moves)
    # As an operator keeps the inventory: the lab's own reads it from here (later runs agree).
    keep_lab_secret("control_key_generation_engine01", str(generation + 1))
    for router, address in ROUTER_ADDRESSES.items():
        url = f"http://{address}:30000/workers"
        for what, key, status in [
            ("engine01's revoked key (a thief's copy)", stolen, 401),
            ("engine01's new key", issued, 200),
            ("engine02's key, untouched", control_key_of("engine02"), 200),
        ]:
            answer = httpx.get(url, headers={"Authorization": f"Bearer {key}"}, timeout=5)
            # In the attack matrix's table too: the revocation is one of its rows.
            ATTACKS.append(
                AttackRow("controller", f"list {router}'s workers with {what}", str(status),
                          str(answer.status_code))
            )  # fmt: skip
            assert answer.status_code == status, (router, status, answer.text)
    control = in_host("engine01", "cat", "/etc/vllm-fleet/router-control.env").stdout
    assert issued in control and stolen not in control
    assert serving_hosts() == sorted(ENGINES)


def cut_over(
    matrix: Matrix,
    change: str,
    edit: Callable[[Inventory], None],
    other_key: str,
    key: str | None = None,
) -> None:
    """A change of the key clients must present, announced to the run (the cut-over flag),
    with clients that hold the old key (``key``, default the inventory's client key) and
    other_key and retry a 401 with the other; it restarts the routers, so the bound is the
    VIP moves'."""
    moves = vip_moves()
    row, run = matrix.apply(
        change,
        edit,
        extra=("-e", "fleet_router_client_key_cutover=true"),
        client_key=key,
        other_client_key=other_key,
        retries=SDK_RETRIES,
    )
    assert_through_vip_moves(row, run, vip_moves() - moves)
    assert row.rerun_changed == 0, matrix.rerun_changes
    assert_host_matches(matrix.inventory)
    assert row.stats.key_switches >= 1, "the load never met the router's new key"


@pytest.mark.full
def test_keys_rotate_under_load(matrix):
    """The engine key and the control key in one run, the old control key retiring (the
    routers restart first and accept both while each engine host moves to the new keys, its
    engines re-registered with the new engine key); then the retiring key dropped; then the
    client key cut over, the clients holding both keys (sglang-router takes one)."""
    engine, control = new_key("engine_api_key"), new_key("router_control_key")
    old_control = secret("router_control_key")

    def first(inv: Inventory) -> None:
        fleet_of(inv)["fleet_engine_api_key"] = engine
        fleet_of(inv)["fleet_router_control_key"] = control
        fleet_of(inv)["fleet_router_control_keys_retiring"] = [old_control]

    moves = vip_moves()
    row, run = matrix.apply(
        "engine + control keys, old control key retiring",
        first,
        rerun=False,
        retries=SDK_RETRIES,
    )
    assert_through_vip_moves(row, run, vip_moves() - moves)
    assert_host_matches(matrix.inventory)
    keep_lab_secret("engine_api_key", engine)
    keep_lab_secret("router_control_key", control)

    def second(inv: Inventory) -> None:
        fleet_of(inv)["fleet_router_control_keys_retiring"] = []

    moves = vip_moves()
    row, run = matrix.apply(
        "  then the retiring control key dropped", second, rerun=False, retries=SDK_RETRIES
    )
    assert_through_vip_moves(row, run, vip_moves() - moves)
    denied = httpx.get(f"{ROUTER}/workers", headers={"Authorization": f"Bearer {old_control}"})
    assert denied.status_code == 401, denied.text

    client, old_client = new_key("router_client_key"), secret("router_client_key")

    def cutover(inv: Inventory) -> None:
        fleet_of(inv)["fleet_router_client_key"] = client

    cut_over(matrix, "client key cut over (clients hold both)", cutover, client)
    keep_lab_secret("router_client_key", client)
    body = {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2}
    for key, status in [(old_client, 401), (client, 200)]:
        answer = httpx.post(
            f"{ROUTER}/v1/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
            timeout=60,
        )
        assert answer.status_code == status, answer.text


@pytest.mark.full
def test_an_engine_group_removed_and_one_added(matrix):
    """engine02's only group leaves the inventory while engine01 keeps serving the name: it
    is drained out of the routers, stopped, and its files and hold removed, though nothing
    else on the host changes (before, a removal alone skipped the whole rolling block and
    left the group serving). Then a group is added: held out of the routers until checked,
    then released. The routers' admission limit follows the engines' capacity, so each run
    restarts the routers too, one at a time behind the VIP (unless a run before already
    moved them to that limit)."""
    original = json.loads(json.dumps(groups_of(matrix.inventory, "engine02")))

    def remove(inv: Inventory) -> None:
        inv["host_vars/engine02.yml"]["fleet_engine_groups"] = []

    moves = vip_moves()
    row, run = matrix.apply("engine group removed (engine02/g0)", remove, retries=SDK_RETRIES)
    assert_through_vip_moves(row, run, vip_moves() - moves, must_move=False)
    assert row.rerun_changed == 0, matrix.rerun_changes
    assert_host_matches(matrix.inventory)
    assert not exists("engine02", "/etc/vllm-fleet/engines/g0.json")
    assert not exists("engine02", "/var/lib/vllm-fleet/hold/g0")
    active = in_host("engine02", "systemctl", "is-active", "vllm-engine@g0.service", check=False)
    assert active.stdout.strip() in ("inactive", "failed"), active.stdout
    assert serving_hosts() == ["engine01"]

    def add(inv: Inventory) -> None:
        inv["host_vars/engine02.yml"]["fleet_engine_groups"] = original

    moves = vip_moves()
    row, run = matrix.apply("  then an engine group added (engine02/g0)", add, retries=SDK_RETRIES)
    assert_through_vip_moves(row, run, vip_moves() - moves, must_move=False)
    assert row.rerun_changed == 0, matrix.rerun_changes
    assert_host_matches(matrix.inventory)
    assert serving_hosts() == sorted(ENGINES)


def serving_hosts() -> list[str]:
    """The engine hosts the router (either implementation) routes to now."""
    client = router_client(RouterTarget(impl="sglang", url=ROUTER), secret("router_control_key"))
    try:
        return sorted({engine_host(url) for url in client.healthy()})
    finally:
        client.close()


@pytest.mark.full
def test_the_router_implementation_changes_and_back(matrix):
    """sglang-router -> vllm-router -> sglang-router, both real. The routers restart one at a
    time behind the VIP into the other implementation before the engine hosts' settings say
    so: the watchdogs and engines ask each router what it is and register with it as such.
    vllm-router passes the client's key through to the engines, so the key clients present
    changes (engine key vs client key): a cut-over, which the clients ride holding both. Under
    vllm-router's cache_aware policy the engines restart with --enable-scale-out (rolled)."""
    client_key, engine_key = secret("router_client_key"), secret("engine_api_key")
    # vllm-router has no mode that routes by model: it serves the lab's one name as such.
    multi_model = fleet_of(matrix.inventory)["fleet_router"].get("multi_model")
    # Clients start with the key the routers take now and hold the new router's as the other
    # (vllm-router's clients present the engine key).
    for impl, key, other_key in [
        ("vllm", client_key, engine_key),
        ("sglang", engine_key, client_key),
    ]:

        def to(inv: Inventory, impl: str = impl) -> None:
            fleet_of(inv)["fleet_router"]["impl"] = impl
            fleet_of(inv)["fleet_router"]["multi_model"] = (
                multi_model if impl == "sglang" else False
            )
            # vllm-router's worker endpoints take no key: the lab network holds only the fleet.
            fleet_of(inv)["fleet_router"]["accept_unauthenticated_control"] = impl == "vllm"

        cut_over(
            matrix, f"router implementation -> {impl} (clients hold both keys)", to, other_key, key
        )
        for host in ROUTERS:
            config = json.loads(in_host(host, "cat", "/etc/vllm-fleet/router.json").stdout)
            assert config["impl"] == impl, (host, config)
            # Only vllm-router lists its workers at /list_workers (the controller reaches the
            # routers' own addresses only from inside the lab network).
            listing = in_host(
                host,
                "curl",
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "http://127.0.0.1:30000/list_workers",
                check=False,
            ).stdout
            assert listing == ("200" if impl == "vllm" else "404"), (host, listing)
        assert identify(ROUTER) == impl
        assert serving_hosts() == sorted(ENGINES)
        scale_out = "--enable-scale-out" in json.dumps(engine_settings("engine01"))
        assert scale_out == (impl == "vllm")


@pytest.mark.full
def test_a_vip_removed_from_the_inventory_is_taken_down(matrix):
    """fleet_router.vip removed: keepalived stops on every router host (so no router keeps
    announcing the address), the VIP's timer, scripts and metric go; each router serves on
    its own address. Added back, the VIP serves again. (Clients of the VIP lose it in
    between: an operator moves them to a router's own address first.)"""
    textfile = "/var/lib/prometheus/node-exporter/vllm_fleet_router_vip.prom"

    def without(inv: Inventory) -> None:
        del fleet_of(inv)["fleet_router"]["vip"]

    removed = playbook(
        "site.yml", "-i", str(write_inventory(edited(matrix, without))), "--tags", "router"
    )
    assert removed.returncode == 0, removed.output[-4000:]
    for host in ROUTERS:
        state = in_host(host, "systemctl", "is-active", "keepalived.service", check=False)
        assert state.stdout.strip() == "inactive", (host, state.stdout)
        for path in (CHECK, textfile, "/etc/systemd/system/vllm-fleet-router-vip-state.timer"):
            assert not exists(host, path), (host, path)
    assert vip_holder() is None
    headers = {"Authorization": f"Bearer {secret('router_client_key')}"}
    body = {"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 1}
    for host in ROUTERS:
        answer = httpx.post(
            f"http://{ROUTER_ADDRESSES[host]}:30000/v1/completions",
            json=body,
            headers=headers,
            timeout=60,
        )
        assert answer.status_code == 200, (host, answer.text)

    back = playbook("site.yml", "-i", str(write_inventory(matrix.inventory)), "--tags", "router")
    assert back.returncode == 0, back.output[-4000:]
    assert vip_holder() in ROUTERS
    answer = httpx.post(f"{ROUTER}/v1/completions", json=body, headers=headers, timeout=60)
    assert answer.status_code == 200, answer.text
