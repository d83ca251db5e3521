"""Hash-locked requirement files for a wheelhouse (``pip install --require-hashes``)."""

from __future__ import annotations

from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from vllm_fleet.hashing import sha256_files


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
