"""The CUDA fixtures follow the vendor interfaces the role reads: the fake nvidia-smi's CSV
parses with the role's parser, its failures look like the real tool's, and the fabric
manager refuses a driver of another version. Also the repository's metadata is signed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.fixtures.cuda import build_repo
from tests.support.paths import ROOT
from vllm_fleet.ansible import cuda_stack as filters

QUERY = "--query-gpu=" + ",".join(filters.SMI_FIELDS)


def fake(tmp_path: Path, name: str, version: str = "580.95.05") -> Path:
    script = tmp_path / name
    text = (ROOT / "tests/fixtures/cuda/payload" / name).read_text()
    script.write_text(text.replace("@VERSION@", version))
    return script


def run(tmp_path: Path, script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FAKE_NVIDIA_ROOT": str(tmp_path)}
    return subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, env=env, check=False
    )


def load_module(tmp_path: Path, version: str) -> None:
    module = tmp_path / "run/fake-nvidia/module-version"
    module.parent.mkdir(parents=True, exist_ok=True)
    module.write_text(version + "\n")


def test_smi_csv_parses_with_the_roles_parser(tmp_path):
    smi = fake(tmp_path, "nvidia-smi")
    load_module(tmp_path, "580.95.05")
    out = run(tmp_path, smi, QUERY, "--format=csv,noheader,nounits")
    assert out.returncode == 0, out.stdout
    gpus = filters.cuda_parse_smi(out.stdout)
    assert len(gpus) == 8
    assert {g["driver_version"] for g in gpus} == {"580.95.05"}
    assert {g["persistence_mode"] for g in gpus} == {"Disabled"}
    assert filters.cuda_gpu_problems(gpus, "580.95.05", 8) == [
        f"GPU {g['index']} ({g['pci_bus_id']}) has persistence mode Disabled (nvidia-persistenced)"
        for g in gpus
    ]
    with_units = run(tmp_path, smi, "--query-gpu=index,memory.total", "--format=csv")
    assert with_units.stdout.splitlines()[:2] == ["index, memory.total [MiB]", "0, 81559 MiB"]


def test_smi_failures_look_like_the_real_tool(tmp_path):
    smi = fake(tmp_path, "nvidia-smi")
    out = run(tmp_path, smi, QUERY, "--format=csv,noheader,nounits")
    assert out.returncode == 9
    assert "couldn't communicate with the NVIDIA driver" in out.stdout
    load_module(tmp_path, "580.82.07")
    out = run(tmp_path, smi, QUERY, "--format=csv,noheader,nounits")
    assert (out.returncode, out.stdout.splitlines()[0]) == (
        18,
        "Failed to initialize NVML: Driver/library version mismatch",
    )
    load_module(tmp_path, "580.95.05")
    switches = tmp_path / "etc/fake-nvidia"
    switches.mkdir(parents=True)
    (switches / "gpu-lost").touch()
    out = run(tmp_path, smi, QUERY, "--format=csv,noheader,nounits")
    assert out.returncode == 15 and "GPU is lost" in out.stdout
    assert run(tmp_path, smi, "--query-gpu=bogus", "--format=csv").returncode == 2


def test_fabric_manager_refuses_another_driver_version(tmp_path):
    fm = fake(tmp_path, "nv-fabricmanager", "580.95.05")
    load_module(tmp_path, "580.82.07")
    out = run(tmp_path, fm)
    assert out.returncode == 1
    log = (tmp_path / "var/log/fake-nvidia/fabricmanager.log").read_text()
    assert "refused: fabric manager 580.95.05 is not compatible with loaded driver 580.82.07" in log


def test_repository_is_signed_and_locks_versions(tmp_path):
    repo = build_repo.build(tmp_path, ("580.95.05",))
    verified = subprocess.run(
        ["gpgv", "--keyring", str(repo / build_repo.KEYRING), str(repo / "InRelease")],
        capture_output=True,
        check=False,
    )
    assert verified.returncode == 0, verified.stderr
    index = (repo / "Packages").read_text()
    assert "Package: nvidia-fabricmanager-580\nVersion: 580.95.05-1" in index
    assert "Depends: nvidia-driver-580 (= 580.95.05-1)" in index
