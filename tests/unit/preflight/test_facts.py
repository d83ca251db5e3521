"""Parsers of what nvidia-smi, npu-smi and Ascend's version files print."""

from tests.fixtures.ascend import NPU_SMI_SAMPLE
from vllm_fleet.preflight.facts import parse_npu_smi, parse_nvidia_smi, parse_version_info

MIB = 1024 * 1024

NPU_SMI_INFO = NPU_SMI_SAMPLE.read_text()


def test_npu_smi_gives_index_health_and_hbm_total():
    devices = parse_npu_smi(NPU_SMI_INFO)
    assert [(d.index, d.healthy, d.memory_bytes) for d in devices] == [
        (0, True, 65536 * MIB),
        (1, False, 65536 * MIB),
    ]


def test_nvidia_smi_csv_gives_memory_and_driver():
    devices, driver = parse_nvidia_smi("0, 81559, 580.95.05\n1, 81559, 580.95.05\n")
    assert [(d.index, d.memory_bytes) for d in devices] == [(0, 81559 * MIB), (1, 81559 * MIB)]
    assert driver == "580.95.05"


def test_ascend_version_files():
    assert parse_version_info("Version=25.2.0\nascendhal_version=7.35.23\n") == "25.2.0"
    assert parse_version_info("package_name=Ascend-cann-toolkit\nversion=9.1.0\n") == "9.1.0"
    assert parse_version_info("nothing here\n") == ""
