"""A stack's wheelhouse: its locked wheels, downloaded by hash, plus the wheels it builds.

A stack's ``quirks.build_wheels`` names wheels no index serves as the stack needs them
(ascend-vllm: vLLM built from its sdist with ``VLLM_TARGET_DEVICE=empty``). The builder takes
the sdist pinned by sha256 from the package index, builds it with the given environment and a
fixed ``SOURCE_DATE_EPOCH`` (the same sdist and build requirements give the same wheel), and
accepts the wheel only if its sha256 is the lock's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import httpx
from packaging.utils import canonicalize_name, parse_wheel_filename

from vllm_fleet.weights.hashing import sha256_file
from vllm_fleet.wheels.lock import MANYLINUX_X86_64, lock_lines, parse_lock, unhashed_entries

SOURCE_DATE_EPOCH = "1700000000"
DEFAULT_INDEX = "https://pypi.org/simple"


class WheelhouseError(RuntimeError):
    """A wheelhouse cannot be built as its lock says; the message names the entry and the fix."""


@dataclass(frozen=True)
class BuildWheel:
    """One ``quirks.build_wheels`` entry of catalog/stacks.yml."""

    name: str
    version: str
    sdist: str
    sdist_sha256: str
    env: Mapping[str, str] = field(default_factory=dict)
    # False: build with the builder's own Python packages (build requirements preinstalled,
    # for a controller without an index that serves them).
    build_isolation: bool = True

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> BuildWheel:
        return cls(
            name=str(spec["name"]),
            version=str(spec["version"]),
            sdist=str(spec["sdist"]),
            sdist_sha256=str(spec["sdist_sha256"]),
            env={str(k): str(v) for k, v in dict(spec.get("env") or {}).items()},
            build_isolation=bool(spec.get("build_isolation", True)),
        )


class _Anchors(HTMLParser):
    """The href of each link on a PEP 503 simple index page, by its text (the file name)."""

    def __init__(self) -> None:
        super().__init__()
        self.links: dict[str, str] = {}
        self._href: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href")

    def handle_data(self, data: str) -> None:
        if self._href is not None and data.strip():
            self.links[data.strip()] = self._href
            self._href = None


def fetch_sdist(build: BuildWheel, index_url: str, dest: Path, client: httpx.Client) -> Path:
    """Download build.sdist from a PEP 503 index into dest and check its sha256."""
    page_url = f"{index_url.rstrip('/')}/{canonicalize_name(build.name)}/"
    page = client.get(page_url)
    if page.status_code != httpx.codes.OK:
        raise WheelhouseError(f"{build.name}: {page_url} answered HTTP {page.status_code}")
    anchors = _Anchors()
    anchors.feed(page.text)
    href = anchors.links.get(build.sdist)
    if href is None:
        raise WheelhouseError(f"{build.name}: {page_url} does not list {build.sdist}")
    target = dest / build.sdist
    with client.stream("GET", urljoin(page_url, href.split("#", 1)[0])) as response:
        response.raise_for_status()
        with target.open("wb") as out:
            for chunk in response.iter_bytes():
                out.write(chunk)
    digest = sha256_file(target)
    if digest != build.sdist_sha256:
        target.unlink()
        raise WheelhouseError(
            f"{build.name}: {build.sdist} from {page_url} has sha256 {digest}, the stack "
            f"pins {build.sdist_sha256}; the index serves another file under that name"
        )
    return target


def build_from_sdist(build: BuildWheel, sdist: Path, dest: Path, pip_args: list[str]) -> Path:
    """Build sdist into one wheel in dest with build.env and a fixed SOURCE_DATE_EPOCH."""
    env = {**os.environ, **build.env, "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH}
    with tempfile.TemporaryDirectory(dir=dest) as scratch:
        argv = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", scratch]
        if not build.build_isolation:
            argv.append("--no-build-isolation")
        run = subprocess.run(
            [*argv, *pip_args, str(sdist)], env=env, capture_output=True, text=True, check=False
        )
        if run.returncode != 0:
            raise WheelhouseError(
                f"{build.name}: building {sdist.name} failed: {run.stderr.strip()[-1500:]}"
            )
        wheels = list(Path(scratch).glob("*.whl"))
        if len(wheels) != 1:
            raise WheelhouseError(f"{build.name}: {sdist.name} built {len(wheels)} wheels")
        name, version, _build, _tags = parse_wheel_filename(wheels[0].name)
        if name != canonicalize_name(build.name) or str(version) != build.version:
            raise WheelhouseError(
                f"{build.name}: {sdist.name} built {wheels[0].name}, not "
                f"{build.name} {build.version}"
            )
        built = dest / wheels[0].name
        shutil.move(wheels[0], built)
    return built


def check_built(build: BuildWheel, wheel: Path, lock_text: str) -> None:
    """The built wheel must be the lock's; say the line to write when the lock has no hash."""
    version, want = parse_lock(lock_text).get(canonicalize_name(build.name), ("", ""))
    got = sha256_file(wheel)
    line = f"{canonicalize_name(build.name)}=={build.version} --hash=sha256:{got}"
    if version != build.version:
        raise WheelhouseError(f"{build.name}: the lock has no {build.name}=={build.version}")
    if not want:
        raise WheelhouseError(
            f"{build.name}: the lock line has no hash. {wheel.name} built here is "
            f"sha256 {got}; after checking it, write the lock line `{line}`"
        )
    if got != want:
        wheel.unlink()
        raise WheelhouseError(
            f"{build.name}: {wheel.name} built here has sha256 {got}, the lock says {want}; "
            "the build is not reproducible with this builder's build requirements"
        )


def download_locked(lock_text: str, dest: Path, pip_args: list[str]) -> None:
    """pip download every line of lock_text by hash into dest (skipped when all are there)."""
    wanted = parse_lock(lock_text)
    have = set()
    if dest.is_dir():
        have = {line.split(" ")[0] for line in lock_lines(dest, set())}
    if all(f"{name}=={version}" in have for name, (version, _h) in wanted.items()):
        return
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".lock") as lock:
        lock.write(lock_text)
        lock.flush()
        argv = ["download", "-q", "--no-deps", "--require-hashes", "--only-binary=:all:"]
        subprocess.run(
            [sys.executable, "-m", "pip", *argv, "-d", str(dest), "-r", lock.name, *pip_args],
            check=True,
        )


def local_find_links() -> list[Path]:
    """Directories pip is configured to find wheels in (e.g. a pre-seeded torch+cpu)."""
    values = os.environ.get("PIP_FIND_LINKS", "").split()
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    for line in listing.splitlines():
        key, _, value = line.partition("=")
        if key.endswith("find-links"):
            values += value.strip("'\"").split()
    dirs = [Path(v.removeprefix("file://")) for v in values if not v.startswith("http")]
    return [d for d in dirs if d.is_dir()]


def seed_local_wheels(lock_text: str, dest: Path) -> set[str]:
    """Copy locked wheels found in local find-links dirs into dest; returns their names."""
    wanted = parse_lock(lock_text)
    seeded = set()
    dest.mkdir(parents=True, exist_ok=True)
    for directory in local_find_links():
        for wheel in directory.glob("*.whl"):
            name, version, _build, _tags = parse_wheel_filename(wheel.name)
            if wanted.get(name, ("", ""))[0] != str(version):
                continue
            if sha256_file(wheel) == wanted[name][1]:
                if not (dest / wheel.name).exists():
                    shutil.copyfile(wheel, dest / wheel.name)
                seeded.add(name)
    return seeded


def without(lock_text: str, names: set[str]) -> str:
    """lock_text minus the entries of names (canonical)."""
    kept = []
    for raw in lock_text.splitlines():
        spec = raw.split("#", 1)[0].strip()
        if spec and canonicalize_name(spec.partition("==")[0]) in names:
            continue
        kept.append(raw)
    return "\n".join(kept) + "\n"


def build_wheelhouse(
    stack: str, spec: Mapping[str, Any], repo: Path, dest: Path, index_url: str = DEFAULT_INDEX
) -> Path:
    """Fill dest with every wheel of the stack's lock; returns dest.

    Refuses, before downloading anything, a lock with entries that have no hash and that
    the stack does not build (naming them).
    """
    lock_text = (repo / str(spec["lock"])).read_text()
    quirks = dict(spec.get("quirks") or {})
    builds = [BuildWheel.from_spec(b) for b in quirks.get("build_wheels") or []]
    built_names = {canonicalize_name(b.name) for b in builds}
    missing = [e for e in unhashed_entries(lock_text) if canonicalize_name(e.split("==")[0])
               not in built_names]  # fmt: skip
    if missing:
        raise WheelhouseError(
            f"{stack}: {spec['lock']} has entries without a hash: {', '.join(missing)}. "
            "Fill them in (vllm-fleet lock-resolve, with an index that serves them) "
            "before building this wheelhouse"
        )
    downloads = without(lock_text, built_names)
    seeded = seed_local_wheels(downloads, dest)
    platform = [arg for tag in MANYLINUX_X86_64 for arg in ("--platform", tag)]
    pip_args = ["--python-version", str(spec["python"]), "--implementation", "cp", *platform]
    extra = [a for url in spec.get("extra_index_urls", []) for a in ("--extra-index-url", url)]
    # Local-version wheels (torch==X+cpu) come from an extra index unless seeded locally.
    if any("+" in v and n not in seeded for n, (v, _h) in parse_lock(downloads).items()):
        pip_args += extra
    download_locked(downloads, dest, pip_args)
    with httpx.Client(follow_redirects=True, timeout=120) as client:
        for build in builds:
            done = [w for w in dest.glob("*.whl") if _is(w, build)]
            if done:
                check_built(build, done[0], lock_text)
                continue
            with tempfile.TemporaryDirectory() as tmp:
                sdist = fetch_sdist(build, index_url, Path(tmp), client)
                check_built(build, build_from_sdist(build, sdist, dest, extra), lock_text)
    return dest


def _is(wheel: Path, build: BuildWheel) -> bool:
    name, version, _b, _t = parse_wheel_filename(wheel.name)
    return name == canonicalize_name(build.name) and str(version) == build.version
