"""Hash-locked requirement files for a wheelhouse (``pip install --require-hashes``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name, parse_wheel_filename

from vllm_fleet.weights.hashing import sha256_files


def lock_lines(wheelhouse: Path, exclude: set[str], workers: int = 4) -> list[str]:
    """One ``name==version --hash=sha256:...`` line per wheel, minus excluded names."""
    excluded = {canonicalize_name(n) for n in exclude}
    wheels = []
    for wheel in sorted(wheelhouse.glob("*.whl")):
        name, version, _build, _tags = parse_wheel_filename(wheel.name)
        if name not in excluded:
            wheels.append((name, str(version), wheel))
    seen: dict[str, str] = {}
    for name, _version, wheel in wheels:
        if name in seen:
            raise ValueError(f"{wheelhouse}: two wheels for {name}: {seen[name]} and {wheel.name}")
        seen[name] = wheel.name
    digests = sha256_files([w for _, _, w in wheels], workers)
    return [f"{name}=={version} --hash=sha256:{digests[w]}" for name, version, w in wheels]


def parse_lock(text: str) -> dict[str, tuple[str, str]]:
    """{name: (version, sha256)} from lock text written by lock_lines."""
    entries = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        spec, _, hash_part = line.partition(" --hash=sha256:")
        name, _, version = spec.partition("==")
        entries[canonicalize_name(name)] = (version, hash_part.strip())
    return entries


# Platform tags a lock is resolved for: every manylinux x86_64 glibc a wheelhouse accepts
# (the same list the lab's wheelhouse download uses).
MANYLINUX_X86_64 = ["manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64"] + [
    f"manylinux_2_{minor}_x86_64" for minor in range(5, 37)
]


def unhashed_entries(text: str) -> list[str]:
    """Lock entries pip could not verify: ``name==version`` of each line without a hash."""
    return [
        f"{name}=={version}" for name, (version, digest) in parse_lock(text).items() if not digest
    ]


def resolve_command(
    requirements: list[str],
    report: Path,
    *,
    python_version: str = "3.11",
    platforms: list[str] | None = None,
    index_url: str = "https://pypi.org/simple",
    extra_index_urls: list[str] | None = None,
    constraints: Path | None = None,
) -> list[str]:
    """pip arguments that resolve ``requirements`` for a target without downloading wheels.

    ``--dry-run --report`` reads each wheel's metadata (PEP 658) and writes the chosen
    files, with their sha256, to ``report``.
    """
    argv = [
        "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
        "--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
        "--target", str(report.parent / "target-unused"), "--index-url", index_url,
    ]  # fmt: skip
    for tag in platforms if platforms is not None else MANYLINUX_X86_64:
        argv += ["--platform", tag]
    for url in extra_index_urls or []:
        argv += ["--extra-index-url", url]
    if constraints is not None:
        argv += ["--constraint", str(constraints)]
    return argv + requirements


def lock_from_report(report: dict[str, Any], exclude: set[str] | None = None) -> list[str]:
    """Sorted ``name==version --hash=sha256:...`` lines of a ``pip install --report``."""
    excluded = {canonicalize_name(n) for n in exclude or set()}
    lines = {}
    for item in report["install"]:
        name = canonicalize_name(item["metadata"]["name"])
        if name in excluded:
            continue
        info = item["download_info"]
        digest = info.get("archive_info", {}).get("hashes", {}).get("sha256", "")
        if not digest or not info["url"].split("#", 1)[0].endswith(".whl"):
            raise ValueError(f"{name}: resolved to {info['url']} with no wheel sha256 to lock")
        lines[name] = f"{name}=={item['metadata']['version']} --hash=sha256:{digest}"
    return [lines[n] for n in sorted(lines)]


def resolve_lock(
    requirements: list[str],
    workdir: Path,
    exclude: set[str] | None = None,
    **options: Any,
) -> list[str]:
    """Resolve requirements with pip (metadata only) and return their lock lines.

    pip's own configuration is ignored (PIP_CONFIG_FILE=/dev/null, no PIP_FIND_LINKS or
    PIP_INDEX_URL), so local wheel directories or constraints of the machine resolving
    cannot leak into a lock.
    """
    report = workdir / "pip-report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k == "PIP_CERT"}
    env["PIP_CONFIG_FILE"] = os.devnull
    argv = [sys.executable, "-m", "pip", *resolve_command(requirements, report, **options)]
    run = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if run.returncode != 0:
        raise RuntimeError(f"pip could not resolve {requirements}: {run.stderr.strip()[-2000:]}")
    return lock_from_report(json.loads(report.read_text()), exclude)
