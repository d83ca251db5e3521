"""The wheelhouse builder's build_wheels quirk, with a real pip, a real build backend
(hatchling) and a real PEP 503 index on loopback serving a fixture sdist."""

from __future__ import annotations

import hashlib
import io
import re
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.support.paths import ROOT as REPO
from vllm_fleet.wheels.wheelhouse import WheelhouseError, build_wheelhouse

# A build hook that bakes FIXTURE_TARGET_DEVICE into the package, as vLLM's setup.py bakes
# VLLM_TARGET_DEVICE: the wheel shows whether the stack's build environment reached it.
HOOK = """\
import os
from hatchling.builders.hooks.plugin.interface import BuildHookInterface

class CustomBuildHook(BuildHookInterface):
    def initialize(self, version, build_data):
        target = os.environ.get("FIXTURE_TARGET_DEVICE", "unset")
        with open(os.path.join(self.root, "fixture_pkg", "_target.py"), "w") as out:
            out.write(f"TARGET = {target!r}\\n")
"""
PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fixture-pkg"
version = "1.0"

[tool.hatch.build.hooks.custom]

[tool.hatch.build.targets.wheel]
packages = ["fixture_pkg"]
"""
SDIST = "fixture_pkg-1.0.tar.gz"


def _sdist() -> bytes:
    files = {
        "pyproject.toml": PYPROJECT,
        "hatch_build.py": HOOK,
        "fixture_pkg/__init__.py": "",
        "PKG-INFO": "Metadata-Version: 2.1\nName: fixture-pkg\nVersion: 1.0\n",
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"fixture_pkg-1.0/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.fixture
def index(http_dir: tuple[str, Path]) -> tuple[str, str]:
    """(simple index URL, sdist sha256) of a PEP 503 index listing the fixture sdist."""
    base, root = http_dir
    data = _sdist()
    digest = hashlib.sha256(data).hexdigest()
    (root / "files").mkdir()
    (root / "files" / SDIST).write_bytes(data)
    page = root / "simple" / "fixture-pkg"
    page.mkdir(parents=True)
    (page / "index.html").write_text(
        f'<html><body><a href="../../files/{SDIST}#sha256={digest}">{SDIST}</a></body></html>\n'
    )
    return f"{base}/simple", digest


def _spec(repo: Path, lock: str, sdist_sha256: str) -> dict[str, object]:
    (repo / "lock.txt").write_text(lock)
    build = {
        "name": "fixture-pkg",
        "version": "1.0",
        "sdist": SDIST,
        "sdist_sha256": sdist_sha256,
        "env": {"FIXTURE_TARGET_DEVICE": "empty"},
        "build_isolation": False,  # hatchling from this venv: no index needed for it
    }
    return {"lock": "lock.txt", "python": "3.11", "quirks": {"build_wheels": [build]}}


def _hash_from(error: WheelhouseError) -> str:
    match = re.search(r"--hash=sha256:([0-9a-f]{64})`", str(error))
    assert match, str(error)
    return match.group(1)


def test_unhashed_build_says_the_line_then_a_second_build_matches_it(
    index: tuple[str, str], tmp_path: Path
) -> None:
    url, sdist_sha = index
    spec = _spec(tmp_path, "fixture-pkg==1.0  # UNHASHED: built from the sdist\n", sdist_sha)
    with pytest.raises(WheelhouseError, match="the lock line has no hash") as raised:
        build_wheelhouse("s", spec, tmp_path, tmp_path / "first", url)
    digest = _hash_from(raised.value)

    # An independent build into a fresh wheelhouse gives the same bytes (SOURCE_DATE_EPOCH).
    spec = _spec(tmp_path, f"fixture-pkg==1.0 --hash=sha256:{digest}\n", sdist_sha)
    dest = build_wheelhouse("s", spec, tmp_path, tmp_path / "second", url)
    (wheel,) = dest.glob("*.whl")
    assert wheel.name == "fixture_pkg-1.0-py2.py3-none-any.whl"
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == digest
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read("fixture_pkg/_target.py").decode() == "TARGET = 'empty'\n"

    # Built already and matching: a re-run accepts it without fetching or building.
    (tmp_path / "mirror" / "files" / SDIST).unlink()
    assert build_wheelhouse("s", spec, tmp_path, dest, url) == dest


def test_a_wheel_unlike_the_lock_is_refused_and_removed(
    index: tuple[str, str], tmp_path: Path
) -> None:
    url, sdist_sha = index
    spec = _spec(tmp_path, f"fixture-pkg==1.0 --hash=sha256:{'0' * 64}\n", sdist_sha)
    with pytest.raises(WheelhouseError, match=f"the lock says {'0' * 64}.*not reproducible"):
        build_wheelhouse("s", spec, tmp_path, tmp_path / "wh", url)
    assert list((tmp_path / "wh").glob("*.whl")) == []


def test_an_sdist_unlike_its_pin_is_never_built(index: tuple[str, str], tmp_path: Path) -> None:
    url, sdist_sha = index
    spec = _spec(tmp_path, "fixture-pkg==1.0\n", "f" * 64)
    with pytest.raises(WheelhouseError) as raised:
        build_wheelhouse("s", spec, tmp_path, tmp_path / "wh", url)
    assert f"has sha256 {sdist_sha}, the stack pins {'f' * 64}" in str(raised.value)
    assert list((tmp_path / "wh").glob("*")) == []


def test_an_sdist_the_index_does_not_list(index: tuple[str, str], tmp_path: Path) -> None:
    url, sdist_sha = index
    spec = _spec(tmp_path, "fixture-pkg==1.0\n", sdist_sha)
    spec["quirks"]["build_wheels"][0]["sdist"] = "fixture_pkg-1.1.tar.gz"  # type: ignore[index]
    with pytest.raises(WheelhouseError, match=r"fixture-pkg/ does not list fixture_pkg-1.1"):
        build_wheelhouse("s", spec, tmp_path, tmp_path / "wh", url)


def test_ascend_stack_refused_before_any_download(tmp_path: Path) -> None:
    """The real ascend lock: the entries it cannot hash from PyPI are named up front."""
    stacks = yaml.safe_load((REPO / "catalog" / "stacks.yml").read_text())["fleet_stacks"]
    with pytest.raises(WheelhouseError) as raised:
        build_wheelhouse(
            "ascend-vllm-0.23.0", stacks["ascend-vllm-0.23.0"], REPO, tmp_path / "wh",
            "http://127.0.0.1:9/simple",
        )  # fmt: skip
    message = str(raised.value)
    for entry in ("torch==2.10.0+cpu", "torchvision==0.25.0+cpu", "triton-ascend==3.2.2",
                  "arctic-inference==0.1.1"):  # fmt: skip
        assert entry in message
    assert "vllm==" not in message  # built by the quirk, not downloaded
    assert not (tmp_path / "wh").exists()
