"""Router overhead, and the fleet's prefix-cache hit ratio per routing policy against the ideal.

    python bench/router_bench.py                 # the lab must be up (make lab)
    python bench/router_bench.py --questions 6   # a quicker, rougher run

Measured side by side in one run, on the lab's containers (ports other than the published ones
are reachable only on the lab network, so everything runs inside them via ``podman exec``):

- two bench engines, transient units ``vf-bench-engine-<setting>`` on engine01/engine02
  (port 8200), run by ``vllm-fleet engine-run`` from a copy of the lab's g0.json with
  ``--block-size 32`` and the setting's KV cache; the lab's own engines stay up, idle but for
  their watchdog's probes, on the same cores;
- a fresh sglang-router per run, a transient unit ``vf-bench-router-<run>`` on router01 from a
  copy of the lab's router.json (policy and ports changed), the engines registered via
  ``POST /workers``;
- a client inside router01 (the agent venv), so direct and routed requests take the same hops
  except the router.

Overhead: sequential 1-token completions, direct to engine01 and through the cache_aware
router (engine01 its only worker), interleaved A/B, with the lab's watchdogs paused (their
probes run completions on the same cores every 2 s; the engines are otherwise idle).

Hit ratio: a RAG workload (P long system prompts x Q questions, shuffled so prefixes
interleave; the same order in every run, a fresh nonce per run so no earlier run's blocks
are cached), fleet ratio = sum of the engines' vllm:prefix_cache_hits /
vllm:prefix_cache_queries deltas. Ideal: every prefix always on one engine, sent directly
(ample: one engine; pressure: each engine owns half of the prefixes). Two settings: ample
(the lab's KV cache) and pressure (each engine holds only a fraction of all prefixes).
Targets: cache_aware >= 0.9 of ideal in both; added p50 <= 1 ms. A missed
target is printed as MISSED; only errors make the exit status non-zero.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
SECRETS = ROOT / ".lab" / "secrets"
ROUTER_HOST = "router01"
ENGINE_HOSTS = ("engine01", "engine02")
WATCHDOG_UNIT = "vllm-fleet-watchdog.service"
AGENT_PYTHON = "/opt/vllm-fleet/agent/bin/python"
ENGINE_RUN = "/opt/vllm-fleet/agent/bin/vllm-fleet"
LAB_ENGINE = "/etc/vllm-fleet/engines/g0"  # .json settings, .env keys
LAB_ROUTER = "/etc/vllm-fleet/router"  # .json settings, .env keys
BENCH_DIR = "/run/vf-bench"
HELPER = f"{BENCH_DIR}/router_bench.py"
UNIT_PREFIX = "vf-bench-"
ENGINE_PORT = 8200
ROUTER_PORTS = {"cache_aware": 31000, "round_robin": 31001}
ROUTER_METRICS_PORT_OFFSET = 100  # 31100, 31101: clear of the lab router's 29000
BLOCK_SIZE = 32
POLICIES = ("cache_aware", "round_robin")
# Keys reach the in-container client through podman's environment, never argv.
KEY_ENV = {
    "engine": "VF_BENCH_ENGINE_KEY",
    "client": "VF_BENCH_CLIENT_KEY",
    "control": "VF_BENCH_CONTROL_KEY",
}
KEY_FILES = {
    "engine": "engine_api_key",
    "client": "router_client_key",
    "control": "router_control_key",
}
TARGET_FRACTION = 0.9
TARGET_ADDED_P50_MS = 1.0
BOOTSTRAP_RESAMPLES = 2000
WORDS = (
    "river", "stone", "lantern", "harbor", "meadow", "copper", "window", "garden", "signal",
    "market", "winter", "canvas", "bridge", "orchard", "thunder", "pocket", "silver", "valley",
    "engine", "candle", "forest", "ladder", "mirror", "planet", "saddle", "tunnel", "whistle",
    "island", "basket", "feather", "castle", "marble", "pepper", "rocket", "velvet", "anchor",
)  # fmt: skip
CHARS_PER_TOKEN = 6  # the filler measured ~5.8 characters per SmolLM2 token
QUESTIONS = (
    "Which word appears most often in the document?",
    "What is the first word of the third sentence?",
    "Does the document mention a castle? Answer yes or no.",
    "Name two words that appear in the last sentence.",
    "How many sentences mention the river?",
    "Which word follows 'copper' the first time it appears?",
    "Summarize the document in three words.",
    "Is 'anchor' in the document? Answer yes or no.",
)


class BenchError(Exception):
    """The bench could not measure (a unit failed, a request failed, a command failed)."""


# ---------------------------------------------------------------- in-container client


def _headers(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {os.environ[KEY_ENV[key]]}"}


async def _counters(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    from vllm_fleet.verify import engine_metrics

    families = await engine_metrics.fetch_families(client, url)
    queries = engine_metrics.value(families, engine_metrics.PREFIX_QUERIES)
    hits = engine_metrics.value(families, engine_metrics.PREFIX_HITS)
    if queries is None or hits is None:
        raise BenchError(f"{url}: no vllm:prefix_cache_* counters in /metrics")
    return {"queries": queries, "hits": hits}


async def _all_counters(client: httpx.AsyncClient, urls: list[str]) -> list[dict[str, float]]:
    return list(await asyncio.gather(*(_counters(client, url) for url in urls)))


async def _settled(
    client: httpx.AsyncClient, urls: list[str], before: list[dict[str, float]], tokens: int
) -> list[dict[str, float]]:
    """Counters once they account for ``tokens`` prompt tokens and stop moving (or 15 s)."""
    deadline = time.monotonic() + 15
    last = await _all_counters(client, urls)
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        now = await _all_counters(client, urls)
        queried = sum(n["queries"] - b["queries"] for n, b in zip(now, before, strict=True))
        if now == last and queried >= tokens:
            return now
        last = now
    return last


async def _send(
    client: httpx.AsyncClient, job: dict[str, Any], index: int, nonce: str
) -> dict[str, Any]:
    request = job["requests"][index]
    target = job["targets"][request["target"]]
    system = job["prefixes"][request["prefix"]].replace("{nonce}", nonce)
    body = {
        "model": job["model"],
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": job["questions"][request["question"]]},
        ],
        "max_tokens": job["max_tokens"],
        "temperature": 0,
    }
    started = time.perf_counter()
    try:
        response = await client.post(
            f"{target['url']}/v1/chat/completions", json=body, headers=_headers(target["key"])
        )
    except httpx.HTTPError as err:
        return {"ok": False, "error": f"{type(err).__name__}: {err}"}
    elapsed = time.perf_counter() - started
    if response.status_code != 200:
        return {"ok": False, "error": f"HTTP {response.status_code}: {response.text[:200]}"}
    usage = response.json().get("usage") or {}
    return {"ok": True, "seconds": elapsed, "prompt_tokens": usage.get("prompt_tokens", 0)}


async def op_load(job: dict[str, Any]) -> dict[str, Any]:
    """Send the job's requests in order, ``concurrency`` at a time; the counters' deltas."""
    nonce = uuid.uuid4().hex[:12]
    metrics = job["metrics"]
    limits = httpx.Limits(max_connections=job["concurrency"] + 4)
    async with httpx.AsyncClient(timeout=job["timeout"], limits=limits) as client:
        before = await _all_counters(client, metrics)
        pending = iter(range(len(job["requests"])))
        answers: list[dict[str, Any]] = []

        async def worker() -> None:
            for index in pending:
                answers.append(await _send(client, job, index, nonce))

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(job["concurrency"])))
        seconds = time.perf_counter() - started
        tokens = sum(a.get("prompt_tokens", 0) for a in answers)
        after = await _settled(client, metrics, before, tokens)
    deltas = [
        {k: a[k] - b[k] for k in ("queries", "hits")} for a, b in zip(after, before, strict=True)
    ]
    return {
        "nonce": nonce,
        "seconds": seconds,
        "prompt_tokens": tokens,
        "failed": [a["error"] for a in answers if not a["ok"]],
        "engines": deltas,
    }


async def op_tokens(job: dict[str, Any]) -> dict[str, Any]:
    """Token counts of each system prompt as the chat template renders it (vLLM's /tokenize)."""
    counts = []
    async with httpx.AsyncClient(timeout=30) as client:
        for prefix in job["prefixes"]:
            body = {
                "model": job["model"],
                "messages": [{"role": "system", "content": prefix.replace("{nonce}", "0" * 12)}],
                "add_generation_prompt": False,
            }
            response = await client.post(
                f"{job['url']}/tokenize", json=body, headers=_headers("engine")
            )
            response.raise_for_status()
            counts.append(response.json()["count"])
    return {"tokens": counts}


async def op_capacity(job: dict[str, Any]) -> dict[str, Any]:
    """Each engine's KV capacity as it reports it (vllm:cache_config_info)."""
    from vllm_fleet.verify import engine_metrics

    blocks = []
    async with httpx.AsyncClient(timeout=30) as client:
        for url in job["urls"]:
            capacity = engine_metrics.kv_capacity(await engine_metrics.fetch_families(client, url))
            if capacity is None:
                raise BenchError(f"{url}: no vllm:cache_config_info")
            blocks.append({"blocks": capacity.num_gpu_blocks, "block_size": capacity.block_size})
    return {"engines": blocks}


async def op_register(job: dict[str, Any]) -> dict[str, Any]:
    """Wait for the router to answer, add the workers, wait until it lists them (healthy)."""
    from vllm_fleet.router.client import RouterError, RouterTarget, SglangRouterClient

    router = SglangRouterClient(
        RouterTarget(impl="sglang", url=job["router"]), os.environ[KEY_ENV["control"]], 5.0
    )
    deadline = time.monotonic() + job["timeout"]
    try:
        while True:
            try:
                for url in job["workers"]:
                    router.join(url, os.environ[KEY_ENV["engine"]], job["model"])
                if set(job["workers"]) <= set(router.workers()):
                    return {"workers": router.workers()}
            except RouterError as err:
                if time.monotonic() > deadline:
                    raise BenchError(str(err)) from None
            if time.monotonic() > deadline:
                raise BenchError(f"{job['router']}: workers not listed after {job['timeout']} s")
            await asyncio.sleep(0.5)
    finally:
        router.close()


def op_overhead(job: dict[str, Any]) -> dict[str, Any]:
    """Sequential 1-token completions, direct and routed, interleaved A/B (then B/A)."""
    paths = {"direct": (job["direct"], "engine"), "router": (job["router"], "client")}
    body = {"model": job["model"], "prompt": job["prompt"], "max_tokens": 1, "temperature": 0}
    seconds: dict[str, list[float]] = {"direct": [], "router": []}
    with httpx.Client(timeout=30) as client:
        for i in range(job["warmup"] + job["pairs"]):
            order = ("direct", "router") if i % 2 == 0 else ("router", "direct")
            for name in order:
                url, key = paths[name]
                started = time.perf_counter()
                response = client.post(f"{url}/v1/completions", json=body, headers=_headers(key))
                elapsed = time.perf_counter() - started
                if response.status_code != 200:
                    raise BenchError(f"{name}: HTTP {response.status_code}: {response.text[:200]}")
                if i >= job["warmup"]:
                    seconds[name].append(elapsed)
    return seconds


ASYNC_OPS = {"load": op_load, "tokens": op_tokens, "capacity": op_capacity, "register": op_register}


def inside(op: str) -> int:
    """Entry point inside router01: the job on stdin, the result as JSON on stdout."""
    job = json.load(sys.stdin)
    try:
        # Overhead is timed with a plain blocking client: no event loop in either path.
        result = op_overhead(job) if op == "overhead" else asyncio.run(ASYNC_OPS[op](job))
    except (BenchError, httpx.HTTPError) as err:
        print(f"{op}: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    json.dump(result, sys.stdout)
    return 0


# ---------------------------------------------------------------- controller: the lab


def podman(argv: list[str], stdin: str | None = None, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        ["podman", *argv], input=stdin, capture_output=True, text=True, check=False, env=env
    )
    if proc.returncode != 0:
        raise BenchError(f"podman {' '.join(argv[:4])}... failed: {proc.stderr.strip()[-2000:]}")
    return proc.stdout


def on(host: str, *argv: str, stdin: str | None = None) -> str:
    return podman(["exec", "-i", host, *argv], stdin=stdin)


def put(host: str, path: str, text: str, group: str) -> None:
    """A root-owned file the group may read (settings, never keys)."""
    on(host, "install", "-m", "0640", "-g", group, "/dev/stdin", path, stdin=text)


@dataclass
class Lab:
    keys: dict[str, str]
    units: dict[str, set[str]] = field(default_factory=dict)

    def prepare(self) -> None:
        for host, group in self.bench_groups().items():
            self.remove_leftovers(host)
            on(host, "install", "-d", "-m", "0750", "-g", group, BENCH_DIR)
        put(ROUTER_HOST, HELPER, Path(__file__).read_text(), "root")

    @staticmethod
    def bench_groups() -> dict[str, str]:
        return {ROUTER_HOST: "vllm-router"} | dict.fromkeys(ENGINE_HOSTS, "vllm")

    def client(self, op: str, job: dict[str, Any]) -> Any:
        """Run one operation of this script inside router01 (agent venv); its JSON result."""
        env = dict(os.environ) | {KEY_ENV[k]: v for k, v in self.keys.items()}
        names = [arg for name in KEY_ENV.values() for arg in ("-e", name)]
        argv = ["exec", "-i", *names, ROUTER_HOST, AGENT_PYTHON, HELPER, "--inside", op]
        return json.loads(podman(argv, stdin=json.dumps(job), env=env))

    def start_unit(self, host: str, unit: str, props: list[str], argv: list[str]) -> None:
        self.units.setdefault(host, set()).add(unit)
        flags = [f"--property={p}" for p in props]
        on(host, "systemd-run", "--no-block", f"--unit={unit}", "--collect", *flags, *argv)

    def wait_active(self, host: str, unit: str, timeout: float) -> None:
        """Until systemd reports the unit active (engines: READY=1, sent once /health is 200)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = subprocess.run(
                ["podman", "exec", host, "systemctl", "is-active", unit],
                capture_output=True,
                text=True,
                check=False,
            ).stdout.strip()
            if state == "active":
                return
            if state in ("failed", "inactive"):
                break
            time.sleep(2)
        journal = on(host, "journalctl", "-u", unit, "-n", "30", "--no-pager", "-o", "cat")
        raise BenchError(f"{host} {unit} did not become active:\n{journal[-3000:]}")

    def stop_unit(self, host: str, unit: str) -> None:
        subprocess.run(
            ["podman", "exec", host, "systemctl", "stop", unit], capture_output=True, check=False
        )
        subprocess.run(
            ["podman", "exec", host, "systemctl", "reset-failed", unit],
            capture_output=True,
            check=False,
        )
        self.units.get(host, set()).discard(unit)

    def remove_leftovers(self, host: str) -> None:
        """Stop this bench's units (tracked, or left by an earlier, killed run)."""
        listed = subprocess.run(
            ["podman", "exec", host, "systemctl", "list-units", "--all", "--plain", "--no-legend"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.split()
        found = {name for name in listed if name.startswith(UNIT_PREFIX)}
        for unit in sorted(found | self.units.get(host, set())):
            self.stop_unit(host, unit)

    def cleanup(self) -> None:
        for host in self.bench_groups():
            self.remove_leftovers(host)
            subprocess.run(
                ["podman", "exec", host, "rm", "-rf", BENCH_DIR], capture_output=True, check=False
            )


# ---------------------------------------------------------------- controller: engines, routers


@dataclass(frozen=True)
class Engines:
    setting: str
    kv_bytes: int
    hosts: tuple[str, ...] = ENGINE_HOSTS

    @property
    def unit(self) -> str:
        return f"{UNIT_PREFIX}engine-{self.setting}.service"

    def urls(self) -> list[str]:
        return [f"http://{host}:{ENGINE_PORT}" for host in self.hosts]


def lab_engine_settings(host: str) -> dict[str, Any]:
    return json.loads(on(host, "cat", f"{LAB_ENGINE}.json"))


def bench_engine_settings(lab_settings: dict[str, Any], host: str, kv_bytes: int) -> str:
    """The lab group's settings with the bench's port, KV cache and block size; no routers."""
    from vllm_fleet.engine.config import EngineConfig

    cfg = EngineConfig.model_validate(lab_settings).model_copy(
        update={
            "group": "vf-bench",
            "port": ENGINE_PORT,
            "kv_cache_bytes": kv_bytes,
            "block_size": BLOCK_SIZE,
            "advertise_url": f"http://{host}:{ENGINE_PORT}",
            "routers": [],
            "shutdown_timeout": 5,
            "leave_grace_seconds": 0.0,
        }
    )
    return cfg.model_dump_json(indent=2)


def start_engines(lab: Lab, engines: Engines, timeout: float) -> float:
    """Start both bench engines; seconds until both are ready."""
    started = time.monotonic()
    runtime = engines.unit.removesuffix(".service")
    for host in engines.hosts:
        path = f"{BENCH_DIR}/engine-{engines.setting}.json"
        put(
            host,
            path,
            bench_engine_settings(lab_engine_settings(host), host, engines.kv_bytes),
            "vllm",
        )
        props = [
            "Type=notify",
            "NotifyAccess=main",
            "User=vllm",
            "Group=vllm",
            f"EnvironmentFile={LAB_ENGINE}.env",  # VLLM_API_KEY: never on a command line
            f"RuntimeDirectory={runtime}",
            "RuntimeDirectoryMode=0700",
            f"Environment=STATE_DIRECTORY=/run/{runtime}",
            f"WorkingDirectory=/run/{runtime}",
            "KillMode=mixed",
            "TimeoutStartSec=900",
            "TimeoutStopSec=60",
            "LimitNOFILE=10240",
        ]
        lab.start_unit(host, engines.unit, props, [ENGINE_RUN, "engine-run", path])
    for host in engines.hosts:
        lab.wait_active(host, engines.unit, timeout)
    return time.monotonic() - started


def stop_engines(lab: Lab, engines: Engines) -> None:
    for host in engines.hosts:
        lab.stop_unit(host, engines.unit)


def router_python() -> str:
    """The lab router unit's interpreter (its release's venv)."""
    exec_start = on(
        ROUTER_HOST, "systemctl", "show", "-p", "ExecStart", "--value", "vllm-fleet-router"
    )
    match = re.search(r"argv\[\]=(\S+)", exec_start)
    if not match:
        raise BenchError("cannot read vllm-fleet-router's ExecStart")
    return match.group(1)


@dataclass(frozen=True)
class Router:
    run: str
    policy: str
    url: str


def start_router(lab: Lab, run: str, policy: str, workers: list[str], model: str) -> Router:
    config = json.loads(on(ROUTER_HOST, "cat", f"{LAB_ROUTER}.json"))
    args = config["router_args"]
    if config["impl"] != "sglang":
        raise BenchError(f"the lab router is {config['impl']}; this bench drives sglang-router")
    port = ROUTER_PORTS[policy]
    # Generous timeout: a retried request would count its prompt twice.
    args |= {"port": port, "policy": policy, "request_timeout_secs": 300}
    args["prometheus_port"] = port + ROUTER_METRICS_PORT_OFFSET
    path = f"{BENCH_DIR}/router-{run}.json"
    put(ROUTER_HOST, path, json.dumps(config, indent=2), "vllm-router")
    unit = f"{UNIT_PREFIX}router-{run}.service"
    props = [
        "User=vllm-router",
        "Group=vllm-router",
        f"EnvironmentFile={LAB_ROUTER}.env",  # client and control keys: never on a command line
        "LimitNOFILE=65536",
        "Type=exec",
    ]
    lab.start_unit(
        ROUTER_HOST, unit, props, [router_python(), "-m", "vllm_fleet.router.launch", path]
    )
    lab.wait_active(ROUTER_HOST, unit, 30)
    router = Router(run, policy, f"http://{args['host']}:{port}")
    job = {"router": router.url, "workers": workers, "model": model, "timeout": 60}
    lab.client("register", job)
    return router


def stop_router(lab: Lab, router: Router) -> None:
    lab.stop_unit(ROUTER_HOST, f"{UNIT_PREFIX}router-{router.run}.service")


# ---------------------------------------------------------------- workload and measurements


@dataclass(frozen=True)
class Workload:
    prefixes: list[str]
    questions: list[str]
    order: list[tuple[int, int]]  # (prefix, question), shuffled so prefixes interleave
    concurrency: int
    max_tokens: int


def build_prefix(index: int, tokens_approx: int) -> str:
    """A distinct document of about ``tokens_approx`` tokens; {nonce} leads, so each run is fresh."""
    rng = random.Random(index)
    text = (
        "You are a support assistant. Answer only from the document below.\n"
        f"Document {{nonce}}-{index}:"
    )
    while len(text) < tokens_approx * CHARS_PER_TOKEN:
        text += " " + " ".join(rng.choices(WORDS, k=10)).capitalize() + "."
    return text


def build_workload(args: argparse.Namespace) -> Workload:
    prefixes = [build_prefix(i, args.prefix_tokens) for i in range(args.prefixes)]
    questions = [
        f"{QUESTIONS[q % len(QUESTIONS)]} (question {q + 1})" for q in range(args.questions)
    ]
    order = [(p, q) for p in range(args.prefixes) for q in range(args.questions)]
    random.Random(args.seed).shuffle(order)
    return Workload(prefixes, questions, order, args.concurrency, args.max_tokens)


def load_job(
    workload: Workload, targets: list[dict[str, str]], assign: str, metrics: list[str], model: str
) -> dict[str, Any]:
    """``assign``: 'all' (every request to targets[0]) or 'split' (prefix p to targets[p % n])."""
    requests = [
        {"prefix": p, "question": q, "target": 0 if assign == "all" else p % len(targets)}
        for p, q in workload.order
    ]
    return {
        "model": model,
        "prefixes": workload.prefixes,
        "questions": workload.questions,
        "requests": requests,
        "targets": targets,
        "metrics": metrics,
        "concurrency": workload.concurrency,
        "max_tokens": workload.max_tokens,
        "timeout": 300,
    }


@dataclass
class RunResult:
    name: str
    hits: float
    queries: float
    per_engine: list[dict[str, float]]
    seconds: float
    failed: list[str]

    @property
    def ratio(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


def run_load(lab: Lab, name: str, job: dict[str, Any]) -> RunResult:
    result = lab.client("load", job)
    engines = result["engines"]
    run = RunResult(
        name,
        sum(e["hits"] for e in engines),
        sum(e["queries"] for e in engines),
        engines,
        result["seconds"],
        result["failed"],
    )
    split = " / ".join(f"{e['hits']:.0f}/{e['queries']:.0f}" for e in engines)
    print(
        f"    {name:12s} hit ratio {run.ratio:.3f}  (hits/queries per engine {split}; {run.seconds:.0f} s)"
    )
    if run.failed:
        print(f"    {name}: {len(run.failed)} requests FAILED, e.g. {run.failed[0]}")
    return run


def run_setting(lab: Lab, engines: Engines, workload: Workload, model: str) -> dict[str, RunResult]:
    """The ideal, then each policy through a fresh router, on the same engines."""
    urls = engines.urls()
    direct = [{"url": url, "key": "engine"} for url in urls]
    ideal_assign = "all" if engines.setting == "ample" else "split"
    runs = {"ideal": run_load(lab, "ideal", load_job(workload, direct, ideal_assign, urls, model))}
    for policy in POLICIES:
        router = start_router(lab, f"{policy}-{engines.setting}", policy, urls, model)
        try:
            target = [{"url": router.url, "key": "client"}]
            runs[policy] = run_load(lab, policy, load_job(workload, target, "all", urls, model))
        finally:
            stop_router(lab, router)
    return runs


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def added_p50_interval(direct: list[float], routed: list[float]) -> tuple[float, float]:
    """95% bootstrap interval of p50(routed) - p50(direct), resampling whole A/B pairs."""
    rng = random.Random(0)
    pairs = list(zip(direct, routed, strict=True))
    estimates = []
    for _ in range(BOOTSTRAP_RESAMPLES):
        sample = rng.choices(pairs, k=len(pairs))
        estimates.append(
            percentile([r for _, r in sample], 50) - percentile([d for d, _ in sample], 50)
        )
    return percentile(estimates, 2.5), percentile(estimates, 97.5)


def measure_overhead(lab: Lab, engines: Engines, model: str, pairs: int) -> dict[str, Any]:
    """Direct to engine01 vs through a cache_aware router whose only worker is engine01."""
    direct = engines.urls()[0]
    print(f"  overhead: {pairs} A/B pairs ...", flush=True)
    router = start_router(lab, "overhead", "cache_aware", [direct], model)
    # "Against an idle engine": the lab's watchdogs probe their engines (a completion every
    # 2 s) on the same two cores; they are paused while this runs and started again after.
    for host in ENGINE_HOSTS:
        on(host, "systemctl", "stop", WATCHDOG_UNIT)
    try:
        job = {
            "model": model,
            "prompt": "The capital of France is",
            "direct": direct,
            "router": router.url,
            "pairs": pairs,
            "warmup": 20,
        }
        seconds = lab.client("overhead", job)
    finally:
        stop_router(lab, router)
        for host in ENGINE_HOSTS:
            on(host, "systemctl", "start", WATCHDOG_UNIT)
    ms = {name: [round(s * 1000, 3) for s in values] for name, values in seconds.items()}
    paired = [r - d for r, d in zip(ms["router"], ms["direct"], strict=True)]
    low, high = added_p50_interval(ms["direct"], ms["router"])
    return {
        "pairs": pairs,
        "direct_p50_ms": percentile(ms["direct"], 50),
        "direct_p99_ms": percentile(ms["direct"], 99),
        "router_p50_ms": percentile(ms["router"], 50),
        "router_p99_ms": percentile(ms["router"], 99),
        "added_p50_ms": percentile(ms["router"], 50) - percentile(ms["direct"], 50),
        "added_p50_ci95_ms": [low, high],
        "added_p99_ms": percentile(ms["router"], 99) - percentile(ms["direct"], 99),
        "paired_median_ms": percentile(paired, 50),
        "samples_ms": ms,
    }


# ---------------------------------------------------------------- sizing


def kv_bytes_per_token(host: str, settings: dict[str, Any]) -> int:
    from vllm_fleet.preflight.kv_planner import AttentionShape
    from vllm_fleet.preflight.kv_planner import kv_bytes_per_token as per_token

    config = json.loads(on(host, "cat", f"{settings['model_path']}/config.json"))
    shape = AttentionShape.from_config(config)
    kv_dtype = settings["kv_cache_dtype"]
    if kv_dtype == "auto":
        kv_dtype = shape.dtype if settings["dtype"] == "auto" else settings["dtype"]
    return per_token(shape, settings["tensor_parallel_size"], kv_dtype)


def pressure_bytes(
    prefix_tokens: list[int], fraction: float, per_token: int, max_model_len: int
) -> tuple[int, int]:
    """KV bytes (and blocks) that hold ``fraction`` of all prefixes' blocks."""
    prefix_blocks = sum(t // BLOCK_SIZE for t in prefix_tokens)
    blocks = math.ceil(fraction * prefix_blocks)
    if blocks * BLOCK_SIZE < max_model_len:
        raise BenchError(
            f"pressure KV ({blocks} blocks) is below max_model_len {max_model_len}: vLLM would "
            "refuse it; use more or longer prefixes, or a larger --pressure-fraction"
        )
    return blocks * BLOCK_SIZE * per_token, blocks


# ---------------------------------------------------------------- report


def summarize(
    settings: dict[str, dict[str, RunResult]], overhead: dict[str, Any]
) -> tuple[list[str], bool]:
    lines = [f"{'setting':9s} {'run':12s} {'hit ratio':>9s} {'of ideal':>8s}  target"]
    met = True
    for setting, runs in settings.items():
        ideal = runs["ideal"].ratio
        for name, run in runs.items():
            fraction = run.ratio / ideal if ideal else 0.0
            verdict = ""
            if name == "cache_aware":
                ok = fraction >= TARGET_FRACTION
                met &= ok
                verdict = f">= {TARGET_FRACTION}: {'met' if ok else 'MISSED'}"
            lines.append(f"{setting:9s} {name:12s} {run.ratio:9.3f} {fraction:8.3f}  {verdict}")
    low, high = overhead["added_p50_ci95_ms"]
    ok = overhead["added_p50_ms"] <= TARGET_ADDED_P50_MS
    met &= ok
    lines += [
        "",
        f"latency, {overhead['pairs']:.0f} interleaved pairs of 1-token completions (ms):",
        f"  direct   p50 {overhead['direct_p50_ms']:7.2f}  p99 {overhead['direct_p99_ms']:7.2f}",
        f"  router   p50 {overhead['router_p50_ms']:7.2f}  p99 {overhead['router_p99_ms']:7.2f}",
        f"  added    p50 {overhead['added_p50_ms']:7.2f}  p99 {overhead['added_p99_ms']:7.2f}",
        f"  added p50 95% interval {low:.2f} .. {high:.2f}; median of paired differences "
        f"{overhead['paired_median_ms']:.2f}",
        f"  added p50 <= {TARGET_ADDED_P50_MS} ms: {'met' if ok else 'MISSED'}",
    ]
    return lines, met


def write_report(report: dict[str, Any]) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = ROOT / "reports" / f"bench-router-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path


# ---------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--prefixes", type=int, default=8, help="distinct system prompts")
    parser.add_argument("--prefix-tokens", type=int, default=600, help="about this long each")
    parser.add_argument("--questions", type=int, default=12, help="questions per prefix")
    parser.add_argument("--concurrency", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1, help="the request order's shuffle")
    parser.add_argument(
        "--pressure-fraction",
        type=float,
        default=0.6,
        help="each engine's KV cache under pressure, as a fraction of all prefixes' blocks",
    )
    parser.add_argument("--pairs", type=int, default=500, help="overhead: A/B request pairs")
    parser.add_argument("--start-timeout", type=float, default=600, help="per engine start, s")
    parser.add_argument("--inside", metavar="OP", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def read_keys() -> dict[str, str]:
    try:
        return {name: (SECRETS / f).read_text().strip() for name, f in KEY_FILES.items()}
    except OSError as err:
        raise BenchError(f"lab keys missing ({err}); run make lab first") from None


def bring_up(lab: Lab, engines: Engines, timeout: float, model: str) -> dict[str, Any]:
    """Start a setting's engines; how long that took and the KV blocks they report."""
    print(
        f"{engines.setting}: starting bench engines ({engines.kv_bytes} KV bytes) ...", flush=True
    )
    seconds = start_engines(lab, engines, timeout)
    reported = lab.client("capacity", {"urls": engines.urls(), "model": model})["engines"]
    blocks = ", ".join(f"{e['blocks']} x {e['block_size']}" for e in reported)
    print(f"  ready in {seconds:.0f} s; KV blocks as reported: {blocks}", flush=True)
    return {"kv_bytes": engines.kv_bytes, "start_seconds": seconds, "reported": reported}


def bench(
    args: argparse.Namespace, lab: Lab, report: dict[str, Any]
) -> dict[str, dict[str, RunResult]]:
    settings = lab_engine_settings(ENGINE_HOSTS[0])
    model = settings["served_name"]
    workload = build_workload(args)
    results: dict[str, dict[str, RunResult]] = {}
    report["engines"] = {}

    ample = Engines("ample", settings["kv_cache_bytes"])
    report["engines"]["ample"] = bring_up(lab, ample, args.start_timeout, model)
    job = {"url": ample.urls()[0], "model": model, "prefixes": workload.prefixes}
    tokens = lab.client("tokens", job)["tokens"]
    print(f"  prefixes: {len(tokens)} x {min(tokens)}-{max(tokens)} tokens", flush=True)
    report["overhead"] = measure_overhead(lab, ample, model, args.pairs)
    results["ample"] = run_setting(lab, ample, workload, model)
    stop_engines(lab, ample)

    per_token = kv_bytes_per_token(ENGINE_HOSTS[0], settings)
    kv_bytes, blocks = pressure_bytes(
        tokens, args.pressure_fraction, per_token, settings["max_model_len"]
    )
    report["sizing"] = {
        "kv_bytes_per_token": per_token,
        "block_size": BLOCK_SIZE,
        "prefix_tokens": tokens,
        "prefix_blocks_total": sum(t // BLOCK_SIZE for t in tokens),
        "pressure_blocks": blocks,
    }
    pressure = Engines("pressure", kv_bytes)
    report["engines"]["pressure"] = bring_up(lab, pressure, args.start_timeout, model)
    results["pressure"] = run_setting(lab, pressure, workload, model)
    stop_engines(lab, pressure)
    return results


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.inside:
        return inside(args.inside)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the cleanup below runs
    started = time.monotonic()
    report: dict[str, Any] = {
        "args": {k: v for k, v in vars(args).items() if k != "inside"},
        "notes": [
            "each bench engine shares its container's one core with the lab's g0 engine, idle "
            "but probed by its watchdog every 2 s (vLLM's worker then busy-polls for 1 s)",
            "bench routers: the lab's router.json, policy/ports changed, request timeout 300 s",
        ],
    }
    lab = Lab(read_keys())
    try:
        lab.prepare()
        results = bench(args, lab, report)
    except BenchError as err:
        print(f"router bench failed: {err}", file=sys.stderr)
        return 1
    finally:
        with contextlib.suppress(BenchError):
            lab.cleanup()
    report["runs"] = {
        s: {n: asdict(r) | {"ratio": r.ratio} for n, r in runs.items()}
        for s, runs in results.items()
    }
    report["seconds"] = time.monotonic() - started
    lines, met = summarize(results, report["overhead"])
    report["targets_met"] = met
    print("\n" + "\n".join(lines))
    print(f"\nrun time {report['seconds']:.0f} s; report: {write_report(report).relative_to(ROOT)}")
    failed = sum(len(r.failed) for runs in results.values() for r in runs.values())
    if failed:
        print(
            f"router bench: {failed} requests failed; the ratios above are not valid",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
