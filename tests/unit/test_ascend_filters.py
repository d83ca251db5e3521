"""The ascend_stack role's filters: npu-smi parsing, inventory checks, install plan, env capture."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.fixtures.ascend import NPU_SMI_SAMPLE
from tests.support.paths import ROOT as REPO
from vllm_fleet.ansible import ascend_stack as af

# npu-smi info's documented table (two rows per device), one device unhealthy.
NPU_SMI_INFO = NPU_SMI_SAMPLE.read_text()

SHA = "a" * 64


def packages(**versions: str) -> dict[str, dict[str, str]]:
    v = {"driver": "25.2.0", "firmware": "7.5.0.1.129", "toolkit": "9.1.0", "ops": "9.1.0"}
    v |= {"nnal": "9.1.0", **versions}
    names = {
        "driver": "Ascend-hdk-910b-npu-driver_{}_linux-x86_64.run",
        "firmware": "Ascend-hdk-910b-npu-firmware_{}.run",
        "toolkit": "Ascend-cann-toolkit_{}_linux-x86_64.run",
        "ops": "Ascend-cann-910b-ops_{}_linux-x86_64.run",
        "nnal": "Ascend-cann-nnal_{}_linux-x86_64.run",
    }
    return {k: {"file": names[k].format(v[k]), "version": v[k], "sha256": SHA} for k in names}


FLAGS = {k: {"first": [f"--{k}-first"], "upgrade": [f"--{k}-up"]} for k in af.KINDS}


def test_npu_smi_table_gives_count_health_and_hbm() -> None:
    facts = af.ascend_npu_smi(NPU_SMI_INFO)
    assert facts["count"] == 2
    assert facts["unhealthy"] == [1]
    assert [
        (d["index"], d["name"], d["health"], d["hbm_used_mb"], d["hbm_total_mb"])
        for d in facts["devices"]
    ] == [
        (0, "910B3", "OK", 3161, 65536),
        (1, "910B3", "Warning", 3160, 65536),
    ]


@pytest.mark.parametrize(
    "text", ["", "dcmi module initialize failed. ret is -8005\n", "| 0 910B3 | OK | 1 |\n"]
)
def test_npu_smi_without_a_device_table_gives_no_devices(text: str) -> None:
    assert af.ascend_npu_smi(text) == {"count": 0, "devices": [], "unhealthy": []}


def test_version_info_reads_the_first_version_line() -> None:
    assert (
        af.ascend_version_info("Version=25.2.0\nascendhal_version=7.35.23\nversion=1\n") == "25.2.0"
    )
    assert af.ascend_version_info("package_name=Ascend-cann-toolkit\nversion=9.1.0\n") == "9.1.0"
    assert af.ascend_version_info("no version here\n") == ""


def test_the_probes_version_files_are_parsed_on_the_controller() -> None:
    """The host-side probe sends each file's text; the one parser reads them."""
    files = {"driver": "Version=25.2.0\nascendhal_version=7.35.23\n", "nnal": ""}
    assert af.ascend_versions(files) == {"driver": "25.2.0", "nnal": ""}


def test_a_good_inventory_has_no_problems() -> None:
    assert (
        af.ascend_validate(packages(), "/srv/pkgs", "", {"cann": "9.1.0", "nnal": "9.1.0"}, "h1")
        == []
    )


def test_every_problem_names_host_key_value_and_fix() -> None:
    pkgs = packages(ops="9.0.0", toolkit="9.2.0", nnal="9.2.0")
    pkgs["driver"]["version"] = "25.2.1"
    pkgs["firmware"]["sha256"] = "REPLACE-ME"
    del pkgs["nnal"]
    problems = af.ascend_validate(pkgs, "", "", {"cann": "9.1.0"}, "h1")
    text = "\n".join(problems)
    assert "ascend_stack_package_dir='' and ascend_stack_package_url='': set exactly one" in text
    assert "ascend_stack_packages.nnal=None: missing" in text
    assert (
        "driver.version=25.2.1 does not match the file name Ascend-hdk-910b-npu-driver_25.2.0"
        in text
    )
    assert "firmware.sha256=REPLACE-ME is not a sha256" in text
    assert "ops.version=9.0.0 but toolkit is 9.2.0" in text
    assert "toolkit.version=9.2.0 but the engine stack requires cann 9.1.0" in text
    assert all(p.startswith("host h1: ") for p in problems)
    assert len(problems) == 6


def test_a_non_mapping_inventory_is_refused() -> None:
    assert af.ascend_validate(["driver"], "/d", "", {}, "h1") == [
        "host h1: ascend_stack_packages=['driver'] must be a mapping of driver, firmware, toolkit, ops, nnal"
    ]


def test_first_install_is_driver_then_firmware_then_cann() -> None:
    plan = af.ascend_install_plan(packages(), {}, False, FLAGS)
    assert [(p["kind"], p["mode"], p["flags"]) for p in plan] == [
        ("driver", "first", ["--driver-first"]),
        ("firmware", "first", ["--firmware-first"]),
        ("toolkit", "first", ["--toolkit-first"]),
        ("ops", "first", ["--ops-first"]),
        ("nnal", "first", ["--nnal-first"]),
    ]


def test_upgrade_is_firmware_then_driver_and_skips_what_is_installed() -> None:
    installed = {
        "driver": "25.2.0",
        "firmware": "7.5.0.1.129",
        "toolkit": "9.1.0",
        "ops": "9.1.0",
        "nnal": "9.1.0",
    }
    plan = af.ascend_install_plan(
        packages(driver="25.3.0", firmware="7.7.0.1.231"), installed, True, FLAGS
    )
    assert [(p["kind"], p["mode"], p["installed"]) for p in plan] == [
        ("firmware", "upgrade", "7.5.0.1.129"),
        ("driver", "upgrade", "25.2.0"),
    ]
    assert af.ascend_install_plan(packages(), installed, True, FLAGS) == []


def test_npu_smi_without_version_file_still_counts_as_an_overwrite() -> None:
    # Huawei's deployer: driver/version.info OR npu-smi present -> firmware first.
    plan = af.ascend_install_plan(packages(), {}, True, FLAGS)
    assert [p["kind"] for p in plan][:2] == ["firmware", "driver"]


def test_env_capture_keeps_changes_and_drops_stub_and_devlib_dirs() -> None:
    before = {"PATH": "/usr/bin:/bin", "HOME": "/root", "SHLVL": "1"}
    after = {
        **before,
        "SHLVL": "2",
        "PATH": "/opt/tk/bin:/usr/bin:/bin",
        "ASCEND_TOOLKIT_HOME": "/opt/tk",
        "LD_LIBRARY_PATH": "/opt/tk/lib64:/opt/tk/x86_64-linux/devlib:/opt/tk/runtime/lib64/stub:/drv/lib64/driver",
    }
    env = af.ascend_env_capture(json.dumps(before), json.dumps(after))
    assert env == {
        "ASCEND_TOOLKIT_HOME": "/opt/tk",
        "LD_LIBRARY_PATH": "/opt/tk/lib64:/drv/lib64/driver",
        "PATH": "/opt/tk/bin:/usr/bin:/bin",
    }


def test_resolution_to_the_stub_is_a_problem() -> None:
    root = "/usr/local/Ascend"
    hal = f"{root}/driver/lib64/driver/libascend_hal.so"
    good = {
        "plain": {"libascend_hal.so": hal},
        "service": {
            "libascendcl.so": f"{root}/ascend-toolkit/9.1.0/lib64/libascendcl.so",
            "libatb.so": f"{root}/nnal/atb/9.1.0/atb/cxx_abi_1/lib/libatb.so",
            "libascend_hal.so": hal,
        },
    }
    assert af.ascend_resolution_problems(good, root, "h1") == []
    stub = f"{root}/ascend-toolkit/9.1.0/x86_64-linux/devlib/libascend_hal.so"
    bad = {"plain": {"libascend_hal.so": stub}, "service": None}
    problems = af.ascend_resolution_problems(bad, root, "h1")
    assert problems[0].startswith(
        f"host h1: libascend_hal.so resolves to {stub} for a plain process, expected {hal}"
    )
    # Without the EnvironmentFile every service library is reported as not loaded.
    assert sum("not loaded" in p for p in problems) == 3


def test_the_example_inventory_pins_every_package_and_marks_its_placeholders() -> None:
    hv = yaml.safe_load((REPO / "inventories/example-ascend/group_vars/engines.yml").read_text())
    stacks = yaml.safe_load((REPO / "catalog/stacks.yml").read_text())["fleet_stacks"]
    requires = stacks["ascend-vllm-0.23.0"]["requires"]
    problems = af.ascend_validate(
        hv["ascend_stack_packages"], "", hv["ascend_stack_package_url"], requires, "h"
    )
    # Only the clearly marked placeholder hashes are refused; versions and names fit the stack.
    assert len(problems) == 5
    assert all(".sha256=PLACEHOLDER-" in p and "is not a sha256" in p for p in problems)
