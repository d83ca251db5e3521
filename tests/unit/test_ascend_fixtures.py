"""The fake Ascend packages (tests/fixtures/ascend/build.py) follow the vendor's interfaces.

Only what runs without installing is exercised here (installing writes /usr/local/Ascend and
/etc: that happens in the ascend_stack Molecule scenario's container).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.ascend import build
from vllm_fleet.ansible import ascend_stack as af

VERSIONS = {
    "driver": "25.2.0",
    "firmware": "7.5.0.1.129",
    "toolkit": "9.1.0",
    "ops": "9.1.0",
    "nnal": "9.1.0",
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, str]]]:
    out = tmp_path_factory.mktemp("ascend")
    return out, build.build(out, VERSIONS)


def test_file_names_versions_and_sha256(built: tuple[Path, dict[str, dict[str, str]]]) -> None:
    out, pkgs = built
    assert pkgs["driver"]["file"] == "Ascend-hdk-910b-npu-driver_25.2.0_linux-x86_64.run"
    assert pkgs["firmware"]["file"] == "Ascend-hdk-910b-npu-firmware_7.5.0.1.129.run"
    assert pkgs["ops"]["file"] == "Ascend-cann-910b-ops_9.1.0_linux-x86_64.run"
    for pkg in pkgs.values():
        assert hashlib.sha256((out / pkg["file"]).read_bytes()).hexdigest() == pkg["sha256"]
    # What the builder prints is an inventory the role accepts.
    assert af.ascend_validate(pkgs, str(out), "", {"cann": "9.1.0", "nnal": "9.1.0"}, "h") == []


@pytest.mark.parametrize("kind", sorted(VERSIONS))
def test_check_succeeds_without_installing(
    built: tuple[Path, dict[str, dict[str, str]]], kind: str
) -> None:
    out, pkgs = built
    run = subprocess.run(
        ["bash", str(out / pkgs[kind]["file"]), "--nox11", "--check", "--quiet"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"package {VERSIONS[kind]} check success" in run.stdout


def test_unknown_flags_and_a_missing_mode_are_refused(
    built: tuple[Path, dict[str, dict[str, str]]],
) -> None:
    out, pkgs = built
    path = str(out / pkgs["driver"]["file"])
    bad = subprocess.run(["bash", path, "--silent"], capture_output=True, text=True, check=False)
    assert bad.returncode == 1
    assert "Unsupported parameter: --silent" in bad.stdout


def test_libraries_are_real_elf_with_the_same_soname_and_distinct_markers(tmp_path: Path) -> None:
    libs = build.build_libraries(tmp_path)
    for lib in libs.values():
        assert lib.read_bytes()[:4] == b"\x7fELF"

    def dyn(lib: Path) -> str:
        return subprocess.run(
            ["readelf", "-dW", str(lib)], capture_output=True, text=True, check=True
        ).stdout

    def syms(lib: Path) -> str:
        return subprocess.run(
            ["readelf", "-sW", str(lib)], capture_output=True, text=True, check=True
        ).stdout

    assert "Library soname: [libascend_hal.so]" in dyn(libs["hal_driver"])
    assert "Library soname: [libascend_hal.so]" in dyn(libs["hal_stub"])
    assert "Shared library: [libascend_hal.so]" in dyn(libs["acl"])
    assert "Shared library: [libascendcl.so]" in dyn(libs["atb"])
    assert "ascend_fixture_hal_origin" in syms(libs["hal_driver"])
    assert libs["hal_driver"].read_bytes() != libs["hal_stub"].read_bytes()


def test_the_loaded_hal_says_where_it_comes_from(tmp_path: Path) -> None:
    libs = build.build_libraries(tmp_path)
    code = (
        "import ctypes, sys; ctypes.CDLL('libascendcl.so'); "
        "f = ctypes.CDLL('libascend_hal.so').ascend_fixture_hal_origin; "
        "f.restype = ctypes.c_char_p; print(f().decode())"
    )
    for first, origin in ((libs["hal_driver"].parent, "driver"), (libs["hal_stub"].parent, "stub")):
        env = {**os.environ, "LD_LIBRARY_PATH": f"{first}:{libs['acl'].parent}"}
        run = subprocess.run(
            ["python3", "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert run.stdout.strip() == origin


@pytest.mark.parametrize(("unhealthy", "count", "bad"), [("", 2, []), ("1", 3, [1])])
def test_fake_npu_smi_prints_the_documented_table(
    tmp_path: Path, unhealthy: str, count: int, bad: list[int]
) -> None:
    root = tmp_path / "Ascend"
    (root / "driver").mkdir(parents=True)
    (root / "driver/version.info").write_text("Version=25.2.0\n")
    smi = tmp_path / "npu-smi"
    smi.write_text(build._NPU_SMI.replace("@ROOT@", str(root)))
    conf = tmp_path / "npu.conf"
    conf.write_text(f'COUNT={count}\nUNHEALTHY="{unhealthy}"\n')
    env = {**os.environ, "ASCEND_FIXTURE_NPU_CONF": str(conf)}
    run = subprocess.run(
        ["bash", str(smi), "info"], env=env, capture_output=True, text=True, check=True
    )
    facts = af.ascend_npu_smi(run.stdout)
    assert facts["count"] == count
    assert facts["unhealthy"] == bad
    assert {d["hbm_total_mb"] for d in facts["devices"]} == {65536}
    assert "| npu-smi 25.2.0" in run.stdout
    # Every table line is as wide as the vendor's.
    assert {len(line) for line in run.stdout.splitlines()} == {98}


def test_fake_npu_smi_fails_like_the_real_one_without_a_driver(tmp_path: Path) -> None:
    smi = tmp_path / "npu-smi"
    smi.write_text(build._NPU_SMI.replace("@ROOT@", str(tmp_path / "none")))
    run = subprocess.run(["bash", str(smi), "info"], capture_output=True, text=True, check=False)
    assert run.returncode == 1
    assert "dcmi module initialize failed" in run.stdout
