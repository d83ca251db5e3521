"""Host facts preflight needs, parsed from what the hosts' own tools print.

The same shapes come from fixtures in tests (for hosts that cannot exist here), so the
parsers below are exercised either way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MIB = 1024 * 1024


@dataclass
class Device:
    index: int
    memory_bytes: int
    healthy: bool = True


@dataclass
class HostFacts:
    python: str = ""
    cpu_count: int = 0
    memory_bytes: int = 0
    devices: list[Device] = field(default_factory=list)
    driver_version: str = ""
    cann_version: str = ""

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> HostFacts:
        devices = [Device(**d) for d in data.get("devices", [])]  # type: ignore[arg-type, attr-defined]
        fields = {k: v for k, v in data.items() if k != "devices"}
        return cls(devices=devices, **fields)  # type: ignore[arg-type]


def parse_nvidia_smi(csv: str) -> tuple[list[Device], str]:
    """`nvidia-smi --query-gpu=index,memory.total,driver_version --format=csv,noheader,nounits`."""
    devices, driver = [], ""
    for line in csv.strip().splitlines():
        index, memory_mib, driver = (part.strip() for part in line.split(","))
        devices.append(Device(index=int(index), memory_bytes=int(float(memory_mib)) * MIB))
    return devices, driver


# `| 0     910B3     | OK    | 93.6  40  0 / 0 |` then `| 0 | 0000:C1:00.0 | 0 0 / 0  3161 / 65536 |`
_NPU_HEAD = re.compile(r"^\|\s*(\d+)\s+\S+\s*\|\s*(\w+)\s*\|")
_NPU_HBM = re.compile(r"(\d+)\s*/\s*(\d+)\s*\|\s*$")


def parse_npu_smi(text: str) -> list[Device]:
    """`npu-smi info`: two table rows per device; Health column and HBM used / total (MB)."""
    devices: list[Device] = []
    pending: tuple[int, bool] | None = None
    for line in text.splitlines():
        head = _NPU_HEAD.match(line)
        if head and pending is None:
            pending = (int(head.group(1)), head.group(2) == "OK")
            continue
        if pending is not None:
            hbm = _NPU_HBM.search(line)
            if hbm:
                devices.append(Device(pending[0], int(hbm.group(2)) * MIB, pending[1]))
                pending = None
    return devices


def parse_version_info(text: str) -> str:
    """The first ``version=`` line of an Ascend version.info / install.info file."""
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip().lower() == "version":
            return value.strip()
    return ""
