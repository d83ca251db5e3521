"""Verifying model weights: coreutils sha256sum against vllm_fleet's parallel verify, and
a stamped re-verify against a full one.

    python bench/hash_bench.py               # 4 GiB under $VLLM_FLEET_CACHE/bench-hash
    python bench/hash_bench.py --gib 0.1     # a quick, rough run

The data set has a model's shape: a few multi-hundred-MB shards (the last one half size,
as Hugging Face's sharding leaves it) plus small JSON files. It is generated once, hashed
while written, and reused while the requested size matches. Measured side by side in one
run, the arms interleaved round by round (--repeat rounds, medians reported):

- ``sha256sum``: the coreutils binary over every file, one after another (one process);
- ``verify_dir`` full, 1 worker: vllm_fleet's verification without parallelism;
- ``verify_dir`` full, one worker per core: what ``weights verify --full`` does;
- ``verify_dir`` stamped: the verified stamp present, size/mtime/inode unchanged.

Targets: parallel verify >= 1.8x sha256sum's throughput; stamped re-verify >= 50x faster
than a full one. The ratio to sha256sum mixes two things, the hash implementation
(OpenSSL in Python's hashlib, SHA extensions where the CPU has them, against coreutils'
own C code) and parallelism; the ratio to 1 worker isolates the parallelism.

Page cache: as root with a writable /proc/sys/vm/drop_caches, caches are dropped before
every measurement (all arms cold) unless --warm. Otherwise every file is read once first and
all arms run warm; the output says which. A missed target is printed as MISSED; only errors (a digest
that does not match) make the exit status non-zero.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import shutil
import ssl
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from vllm_fleet.weights.base import MANIFEST_NAME, verify_dir, write_stamp
from vllm_fleet.weights.hashing import BLOCK_SIZE
from vllm_fleet.weights.manifest import Manifest, ManifestFile, canonical_json

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("VLLM_FLEET_CACHE", "/var/cache/vllm-fleet"))
GIB = 1024**3
MIB = 1024**2
SHARD_BYTES = 512 * MIB  # "a few multi-hundred-MB shards" at the default 4 GiB
MIN_SHARDS = 3  # so even a small run has more shards than 2 cores
TOKENIZER_BYTES = 2 * MIB  # a real tokenizer.json is a few MB


# Beside the data set, not in it (verify reports files its manifest does not list); written
# last, so an interrupted generation is not reused.
def meta_path(data_dir: Path) -> Path:
    return data_dir.with_name(data_dir.name + ".json")


DROP_CACHES = Path("/proc/sys/vm/drop_caches")
TARGET_PARALLEL = 1.8
TARGET_STAMPED = 50.0


class BenchError(Exception):
    pass


# ---------------------------------------------------------------- the data set


def shard_sizes(total: int) -> list[int]:
    """Shard sizes summing to total: equal shards, the last half size (HF leaves a remainder)."""
    count = max(MIN_SHARDS, math.ceil(total / SHARD_BYTES))
    full = int(total / (count - 0.5))
    return [full] * (count - 1) + [total - full * (count - 1)]


def json_files(shards: list[str]) -> dict[str, bytes]:
    """The small files of a model: config, generation config, tokenizer, index."""
    vocab = {f"tok{i}": i for i in range(TOKENIZER_BYTES // 16)}
    weight_map = {f"model.layers.{i}.weight": name for i, name in enumerate(shards)}
    files: dict[str, object] = {
        "config.json": {"model_type": "llama", "num_hidden_layers": len(shards)},
        "generation_config.json": {"bos_token_id": 1, "eos_token_id": 2},
        "tokenizer_config.json": {"tokenizer_class": "PreTrainedTokenizerFast"},
        "tokenizer.json": {"version": "1.0", "model": {"type": "BPE", "vocab": vocab}},
        "model.safetensors.index.json": {"metadata": {}, "weight_map": weight_map},
    }
    return {name: json.dumps(value).encode() for name, value in files.items()}


def write_random(path: Path, size: int) -> ManifestFile:
    """Random bytes (no filesystem compresses or dedups them), hashed while written."""
    digest = hashlib.sha256()
    with path.open("wb") as out:
        left = size
        while left:
            block = os.urandom(min(BLOCK_SIZE, left))
            digest.update(block)
            out.write(block)
            left -= len(block)
    return ManifestFile(path=path.name, size=size, sha256=digest.hexdigest())


def generate(data_dir: Path, total: int) -> Manifest:
    meta_path(data_dir).unlink(missing_ok=True)
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    sizes = shard_sizes(total)
    names = [f"model-{i:05d}-of-{len(sizes):05d}.safetensors" for i in range(1, len(sizes) + 1)]
    print(f"generating {total / GIB:.2f} GiB in {data_dir} (reused by later runs) ...", flush=True)
    entries = [write_random(data_dir / n, s) for n, s in zip(names, sizes, strict=True)]
    for name, content in json_files(names).items():
        (data_dir / name).write_bytes(content)
        digest = hashlib.sha256(content).hexdigest()
        entries.append(ManifestFile(path=name, size=len(content), sha256=digest))
    manifest = Manifest(model="bench-hash", files=entries)
    (data_dir / MANIFEST_NAME).write_bytes(canonical_json(manifest.model_dump()))
    meta_path(data_dir).write_text(json.dumps({"requested_bytes": total}))
    return manifest


def reusable(data_dir: Path, total: int) -> Manifest | None:
    """The data set's manifest when data_dir holds a complete one of this size."""
    try:
        meta = json.loads(meta_path(data_dir).read_text())
        manifest = Manifest.model_validate_json((data_dir / MANIFEST_NAME).read_bytes())
    except (OSError, ValueError):
        return None
    if meta.get("requested_bytes") != total:
        return None
    for entry in manifest.files:
        path = data_dir / entry.path
        if not path.is_file() or path.stat().st_size != entry.size:
            return None
    return manifest


# ---------------------------------------------------------------- measuring


def drop_caches() -> bool:
    """Drop the page cache; False where that is not allowed (not root, a container)."""
    if os.geteuid() != 0:
        return False
    try:
        os.sync()
        DROP_CACHES.write_text("3\n")
    except OSError:
        return False
    return True


def read_all(paths: list[Path]) -> None:
    """Read every file once, so that every arm afterwards starts equally warm."""
    buffer = bytearray(BLOCK_SIZE)
    for path in paths:
        with path.open("rb", buffering=0) as handle:
            while handle.readinto(buffer):
                pass


def run_sha256sum(paths: list[Path]) -> dict[str, str]:
    """coreutils sha256sum over every file, sequentially: {file name: digest}."""
    proc = subprocess.run(
        ["sha256sum", "--", *map(str, paths)], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise BenchError(f"sha256sum exited {proc.returncode}: {proc.stderr.strip()}")
    digests = {}
    for line in proc.stdout.splitlines():
        digest, name = line.split(maxsplit=1)
        digests[Path(name.lstrip("*")).name] = digest
    return digests


@dataclass
class Arm:
    name: str
    run: Callable[[], None]
    hashes: bool  # reads every byte: throughput is meaningful


def arms(data_dir: Path, manifest: Manifest, paths: list[Path], workers: int) -> list[Arm]:
    expected = {e.path: e.sha256 for e in manifest.files}

    def sha256sum() -> None:
        if run_sha256sum(paths) != expected:
            raise BenchError("sha256sum's digests differ from the manifest's")

    def verify(full: bool, n: int) -> Callable[[], None]:
        def arm() -> None:
            rehashed: list[Path] = []
            problems = verify_dir(data_dir, manifest, full, n, rehashed=rehashed)
            if problems:
                raise BenchError("verify_dir: " + "; ".join(problems))
            if not full and rehashed:
                raise BenchError(f"stamped verify re-hashed {len(rehashed)} files")

        return arm

    return [
        Arm("sha256sum, sequential", sha256sum, True),
        Arm("verify_dir full, 1 worker", verify(True, 1), True),
        Arm(f"verify_dir full, {workers} workers", verify(True, workers), True),
        Arm("verify_dir stamped", verify(False, workers), False),
    ]


def cpu_seconds() -> float:
    """CPU time of this process and its waited-for children (sha256sum)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@dataclass
class Timings:
    seconds: dict[str, list[float]]
    # CPU seconds per wall second: how many cores an arm kept busy. On a busy machine it
    # tells "not parallel" apart from "parallel, but the cores were taken".
    cores_busy: dict[str, list[float]]


def measure(arm_list: list[Arm], rounds: int, cold: bool) -> Timings:
    """Each arm once per round; rounds interleave the arms so load drifts hit all alike."""
    timings = Timings({a.name: [] for a in arm_list}, {a.name: [] for a in arm_list})
    for index in range(rounds):
        print(f"round {index + 1}/{rounds} ...", flush=True)
        for arm in arm_list:
            if cold:
                drop_caches()
            cpu, started = cpu_seconds(), time.perf_counter()
            arm.run()
            wall = time.perf_counter() - started
            timings.seconds[arm.name].append(wall)
            timings.cores_busy[arm.name].append((cpu_seconds() - cpu) / wall)
    return timings


# ---------------------------------------------------------------- reporting


def ratio_line(label: str, ratio: float, target: float) -> str:
    verdict = "met" if ratio >= target else "MISSED"
    return f"{label}: {ratio:.2f}x (target >= {target:g}x: {verdict})"


def summary(arm_list: list[Arm], timings: Timings, total: int) -> tuple[list[str], dict[str, Any]]:
    median = {name: statistics.median(values) for name, values in timings.seconds.items()}
    busy = {name: statistics.median(values) for name, values in timings.cores_busy.items()}
    lines = [f"{'arm':<30} {'median s':>10} {'MB/s':>8} {'cores':>6}   rounds (s)"]
    for arm in arm_list:
        rate = f"{total / median[arm.name] / 1e6:8.0f}" if arm.hashes else f"{'-':>8}"
        rounds = ", ".join(f"{s:.4g}" for s in timings.seconds[arm.name])
        lines.append(
            f"{arm.name:<30} {median[arm.name]:>10.4g} {rate} {busy[arm.name]:>6.2f}   {rounds}"
        )
    sha256sum, one, parallel, stamped = (median[a.name] for a in arm_list)
    ratios = {
        "parallel_vs_sha256sum": sha256sum / parallel,
        "parallel_vs_1_worker": one / parallel,
        "full_vs_stamped": parallel / stamped,
    }
    lines += [
        "",
        ratio_line(
            "parallel verify vs sha256sum (throughput)",
            ratios["parallel_vs_sha256sum"],
            TARGET_PARALLEL,
        ),
        f"parallel verify vs 1 worker (throughput): {ratios['parallel_vs_1_worker']:.2f}x "
        "(the parallelism alone; the line above also holds the hash implementation)",
        ratio_line(
            "stamped re-verify vs full verify (time)", ratios["full_vs_stamped"], TARGET_STAMPED
        ),
    ]
    met = {
        "parallel_vs_sha256sum": ratios["parallel_vs_sha256sum"] >= TARGET_PARALLEL,
        "full_vs_stamped": ratios["full_vs_stamped"] >= TARGET_STAMPED,
    }
    results = {"median_seconds": median, "median_cores_busy": busy, "ratios": ratios}
    return lines, results | {"targets_met": met}


def sha_extensions() -> bool:
    """Whether the CPU advertises SHA instructions (x86 sha_ni, arm64 sha2)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(word in flags.split() for word in ("sha_ni", "sha2"))


def environment(workers: int) -> dict[str, Any]:
    version = subprocess.run(
        ["sha256sum", "--version"], capture_output=True, text=True, check=False
    ).stdout
    return {
        "cores": len(os.sched_getaffinity(0)),
        "workers": workers,
        "machine": platform.machine(),
        "cpu_sha_extensions": sha_extensions(),
        "sha256sum": version.splitlines()[0] if version else "unknown",
        "hashlib": ssl.OPENSSL_VERSION,
        "python": platform.python_version(),
    }


def available_memory() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def cache_note(cold: bool, total: int) -> str:
    if cold:
        return "page cache dropped before every measurement: all arms cold"
    note = "page cache warm: every file read once first, all arms warm (caches not dropped)"
    if total > available_memory():
        note += "; the data set exceeds available memory, so the reads are partly cold"
    return note


def write_report(report: dict[str, Any]) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out_file = ROOT / "reports" / f"bench-hash-{stamp}.json"
    out_file.parent.mkdir(exist_ok=True)
    out_file.write_text(json.dumps(report, indent=2))
    return out_file


# ---------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--gib", type=float, default=4.0, help="data set size in GiB")
    parser.add_argument(
        "--dir", type=Path, default=CACHE / "bench-hash", help="where the data set lives"
    )
    parser.add_argument("--repeat", type=int, default=3, help="rounds of every arm")
    parser.add_argument(
        "--warm",
        action="store_true",
        help="never drop the page cache (a shared machine: it slows everyone else's I/O)",
    )
    parser.add_argument(
        "--workers", type=int, default=len(os.sched_getaffinity(0)), help="default: cores"
    )
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    total = int(args.gib * GIB)
    if total < MIN_SHARDS or args.repeat < 1 or args.workers < 1:
        sys.exit("hash bench: --gib, --repeat and --workers must be positive")
    manifest = reusable(args.dir, total) or generate(args.dir, total)
    paths = [args.dir / e.path for e in manifest.files]
    total_bytes = manifest.total_bytes
    write_stamp(args.dir, manifest)
    cold = not args.warm and drop_caches()
    if not cold:
        read_all(paths)
    env = environment(args.workers)
    shards = sum(p.suffix == ".safetensors" for p in paths)
    print(
        f"hash bench: {total_bytes / GIB:.2f} GiB, {shards} shards + {len(paths) - shards} "
        f"JSON files in {args.dir}; {env['cores']} cores, {args.workers} workers"
    )
    print(
        f"{env['sha256sum']}; hashlib: {env['hashlib']}; CPU SHA extensions: "
        f"{'yes' if env['cpu_sha_extensions'] else 'no'}"
    )
    print(cache_note(cold, total_bytes))
    load = os.getloadavg()
    # Other work on the cores shows as lower figures, the parallel arm's first.
    print(f"load average before measuring: {load[0]:.2f} (1 min) on {env['cores']} cores")
    arm_list = arms(args.dir, manifest, paths, args.workers)
    try:
        timings = measure(arm_list, args.repeat, cold)
    except BenchError as err:
        print(f"hash bench failed: {err}", file=sys.stderr)
        return 1
    lines, results = summary(arm_list, timings, total_bytes)
    print("\n" + "\n".join(lines))
    report = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "bytes": total_bytes,
        "files": len(paths),
        "environment": env,
        "cache": "cold" if cold else "warm",
        "load_average": load,
        "seconds": timings.seconds,
        "cores_busy": timings.cores_busy,
        **results,
    }
    print(f"report: {write_report(report).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
