"""The cuda_stack role's filters (vllm_fleet.ansible.cuda_stack)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

from tests.support.paths import ROOT
from vllm_fleet.ansible import cuda_stack as f

STACK = {"accelerator": "cuda", "requires": {"cuda": "13.0", "cuda_driver_min": 580}}
NAMES = {
    "meta_open": "nvidia-open-{branch}",
    "meta_proprietary": "cuda-drivers-{branch}",
    "driver": "nvidia-driver-{branch}",
    "kernel_open": "nvidia-kernel-open-{branch}",
    "kernel_proprietary": "nvidia-kernel-{branch}",
    "persistenced": "nvidia-persistenced",
    "fabricmanager": "nvidia-fabricmanager-{branch}",
    "nscq": "libnvidia-nscq-{branch}",
}
LINE = "0, NVIDIA H100 80GB HBM3, GPU-fa4e-0, 580.95.05, 81559, 00000000:18:00.0, Enabled"


def test_branch_is_the_first_number():
    assert f.cuda_driver_branch("580.95.05") == 580
    assert f.cuda_driver_branch("575.57") == 575
    for bad in ("580", "r580.95.05", "580.95.05-1", ""):
        with pytest.raises(AnsibleFilterError):
            f.cuda_driver_branch(bad)


def test_driver_version_against_the_stack():
    assert f.cuda_driver_version_problem("580.95.05", STACK) == ""
    assert f.cuda_driver_version_problem("590.44.01", STACK) == ""
    old = f.cuda_driver_version_problem("570.195.03", STACK)
    assert "R570 is older than R580, the first branch with CUDA 13.0" in old
    assert "not an NVIDIA driver version" in f.cuda_driver_version_problem("580.x", STACK)
    assert "not cuda" in f.cuda_driver_version_problem("580.95.05", {"accelerator": "ascend"})
    assert "cuda_driver_min" in f.cuda_driver_version_problem("580.95.05", {"accelerator": "cuda"})


@pytest.mark.parametrize(
    ("arch", "branch", "choice", "flavor"),
    [
        ("hopper", 580, "auto", "open"),
        ("ampere", 580, "auto", "open"),
        ("ampere", 550, "auto", "proprietary"),  # before R560 the proprietary ones were default
        ("ampere", 580, "proprietary", "proprietary"),
        ("turing", 535, "open", "open"),
        ("blackwell", 580, "auto", "open"),
        ("grace-hopper", 580, "auto", "open"),
        ("Volta", 580, "auto", "proprietary"),
        ("pascal", 580, "auto", "proprietary"),
    ],
)
def test_module_flavor_by_generation(arch, branch, choice, flavor):
    assert f.cuda_module_flavor_problem(arch, branch, choice) == ""
    assert f.cuda_module_flavor(arch, branch, choice) == flavor


@pytest.mark.parametrize(
    ("arch", "choice", "problem"),
    [
        ("blackwell", "proprietary", "supported only by the open kernel modules"),
        ("grace-blackwell", "proprietary", "supported only by the open kernel modules"),
        ("volta", "open", "not supported by the open kernel modules"),
        ("kepler", "auto", "unknown GPU generation 'kepler'"),
        ("hopper", "closed", "must be auto, open or proprietary"),
    ],
)
def test_module_flavor_refusals(arch, choice, problem):
    assert problem in f.cuda_module_flavor_problem(arch, 580, choice)
    with pytest.raises(AnsibleFilterError, match=problem):
        f.cuda_module_flavor(arch, 580, choice)


def test_package_names_follow_flavor_and_nvswitch():
    assert f.cuda_package_names(NAMES, "open", 580, False) == [
        "nvidia-open-580",
        "nvidia-driver-580",
        "nvidia-kernel-open-580",
        "nvidia-persistenced",
    ]
    assert f.cuda_package_names(NAMES, "proprietary", 580, True) == [
        "cuda-drivers-580",
        "nvidia-driver-580",
        "nvidia-kernel-580",
        "nvidia-persistenced",
        "nvidia-fabricmanager-580",
        "libnvidia-nscq-580",
    ]
    with pytest.raises(AnsibleFilterError, match="lacks nscq"):
        f.cuda_package_names({k: v for k, v in NAMES.items() if k != "nscq"}, "open", 580, True)


def test_pinned_and_packages_to_change():
    assert f.cuda_pinned(["a", "b"], "580.95.05-1") == ["a=580.95.05-1", "b=580.95.05-1"]
    installed = {
        "nvidia-driver-580": [{"version": "580.95.05-1"}],
        "nvidia-fabricmanager-580": [{"version": "580.82.07-1"}],
    }
    wanted = ["nvidia-driver-580", "nvidia-fabricmanager-580", "libnvidia-nscq-580"]
    assert f.cuda_packages_to_change(wanted, "580.95.05-1", installed) == [
        "nvidia-fabricmanager-580",
        "libnvidia-nscq-580",
    ]
    assert f.cuda_packages_to_change(wanted[:1], "580.95.05-1", installed) == []


def probe(flag="0", packages="", loaded="580.95.05", nouveau="0"):
    return f"flag={flag}\npackages={packages}\nloaded={loaded}\nnouveau={nouveau}\n"


def test_reboot_reasons():
    assert f.cuda_reboot_reasons(probe(), "580.95.05") == []
    reasons = f.cuda_reboot_reasons(
        probe("1", "nvidia-kernel-open-580 nvidia-kernel-open-580 ", "580.82.07", "1"), "580.95.05"
    )
    assert reasons == [
        "/run/reboot-required is set (nvidia-kernel-open-580)",
        "the loaded NVIDIA kernel module is 580.82.07, the installed driver 580.95.05",
        "the nouveau module is loaded (it is blacklisted from the next boot)",
    ]
    assert f.cuda_reboot_reasons(probe(loaded=""), "580.95.05") == [
        "no NVIDIA kernel module is loaded (driver 580.95.05 installed)"
    ]
    with pytest.raises(AnsibleFilterError, match="printed no loaded, nouveau"):
        f.cuda_reboot_reasons("flag=0\npackages=\n", "580.95.05")


def test_unheld_reads_dpkg_query():
    lines = [
        "nvidia-driver-580 hold ok installed",
        "nvidia-open-580 install ok installed",
        "nvidia-kernel-open-580 hold ok installed",
    ]
    wanted = [
        "nvidia-open-580",
        "nvidia-driver-580",
        "nvidia-kernel-open-580",
        "libnvidia-nscq-580",
    ]
    assert f.cuda_unheld(wanted, lines) == ["nvidia-open-580", "libnvidia-nscq-580"]
    assert f.cuda_unheld(wanted, []) == wanted


def test_parse_smi_csv():
    text = LINE + "\n" + LINE.replace("0, ", "1, ", 1).replace(":18:", ":28:") + "\n\n"
    gpus = f.cuda_parse_smi(text)
    assert gpus[0] == {
        "index": 0,
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": "GPU-fa4e-0",
        "driver_version": "580.95.05",
        "memory_total_mib": 81559,
        "pci_bus_id": "00000000:18:00.0",
        "persistence_mode": "Enabled",
    }
    assert [g["index"] for g in gpus] == [0, 1]
    assert f.cuda_parse_smi("") == []


@pytest.mark.parametrize(
    "bad",
    [
        "0, NVIDIA H100, GPU-1, 580.95.05, 81559, 00000000:18:00.0",  # a column short
        LINE.replace("81559", "81559 MiB"),  # units were not switched off
        LINE.replace("0, ", "[N/A], ", 1),
    ],
)
def test_parse_smi_refuses_malformed_lines(bad):
    with pytest.raises(AnsibleFilterError):
        f.cuda_parse_smi(bad)


def test_gpu_problems():
    gpu = f.cuda_parse_smi(LINE)[0]
    assert f.cuda_gpu_problems([gpu], "580.95.05") == []
    assert f.cuda_gpu_problems([gpu], "580.95.05", 8) == ["nvidia-smi lists 1 GPUs, 8 expected"]
    assert f.cuda_gpu_problems([], "580.95.05") == ["nvidia-smi lists no GPU"]
    off = {**gpu, "persistence_mode": "Disabled", "driver_version": "580.82.07"}
    assert f.cuda_gpu_problems([off], "580.95.05") == [
        "GPU 0 (00000000:18:00.0) runs driver 580.82.07, not 580.95.05",
        "GPU 0 (00000000:18:00.0) has persistence mode Disabled (nvidia-persistenced)",
    ]


def test_example_cuda_inventory_fits_the_role():
    import json
    import subprocess
    import sys

    import yaml

    spec = yaml.safe_load((ROOT / "roles/cuda_stack/meta/argument_specs.yml").read_text())
    options = spec["argument_specs"]["main"]["options"]
    catalog = yaml.safe_load((ROOT / "catalog/stacks.yml").read_text())["fleet_stacks"]
    out = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-inventory"),
            "-i",
            str(ROOT / "inventories/example-cuda"),
            "--list",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    engines = [
        hv for hv in json.loads(out)["_meta"]["hostvars"].values() if "fleet_engine_groups" in hv
    ]
    assert len(engines) >= 2
    for hv in engines:
        keys = {k for k in hv if k.startswith("cuda_stack_")}
        assert keys and keys <= set(options), keys - set(options)
        for key in keys:
            if "choices" in options[key]:
                assert hv[key] in options[key]["choices"], key
        stack = catalog[hv["fleet_engine_stack"]]
        assert f.cuda_driver_version_problem(hv["cuda_stack_driver_version"], stack) == ""
        branch = f.cuda_driver_branch(hv["cuda_stack_driver_version"])
        assert (
            f.cuda_module_flavor(hv["cuda_stack_gpu_arch"], branch, hv["cuda_stack_kernel_modules"])
            == "open"
        )
