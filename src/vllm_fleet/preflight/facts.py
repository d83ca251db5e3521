"""Host facts preflight needs, parsed from what the hosts' own tools print.

The same shapes come from fixtures in tests (for hosts that cannot exist here), so the
parsers below are exercised either way. Nothing here raises on a bad fixture or an
unexpected probe output: each becomes a FactProblem that preflight reports with the host.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

MIB = 1024 * 1024
INT64_MAX = 2**63 - 1
FACT_KEYS = ("python", "cpu_count", "memory_bytes", "devices", "driver_version", "cann_version")
DEVICE_KEYS = ("index", "memory_bytes", "healthy")
EXAMPLES = {"python": "3.11", "driver_version": "580.95.05", "cann_version": "9.1.0"}
FIXTURE_FIX = (
    "write preflight_facts as {python: '3.11', cpu_count: N, memory_bytes: N, driver_version: '...', "
    "cann_version: '...', devices: [{index: N, memory_bytes: N, healthy: true}], models: {...}}"
)


class UnreadableOutput(ValueError):
    """A line of a probe's output that does not have the expected shape."""


@dataclass
class FactProblem:
    """A fact preflight could not use; an error for a fixture, a warning for a probe."""

    key: str
    value: object
    message: str
    fix: str
    severity: Literal["error", "warning"] = "error"


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
    problems: list[FactProblem] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: object, where: str = "preflight_facts") -> HostFacts:
        """Facts from a fixture mapping; a key or value of the wrong shape becomes a problem."""
        facts = cls()
        if not isinstance(data, Mapping):
            facts.problem(where, data, "must be a mapping of the host's facts", FIXTURE_FIX)
            return facts
        for key, value in data.items():
            name = f"{where}.{key}"
            if key in ("python", "driver_version", "cann_version"):
                if isinstance(value, str):
                    setattr(facts, key, value)
                else:
                    facts.problem(
                        name, value, "must be a string",
                        f"quote it, e.g. {key}: '{EXAMPLES[key]}' (YAML reads 3.10 as the number 3.1)",
                    )  # fmt: skip
            elif key in ("cpu_count", "memory_bytes"):
                if is_count(value):
                    setattr(facts, key, value)
                else:
                    facts.problem(
                        name, value, "must be a whole number >= 0",
                        f"write the number without quotes or units, e.g. {key}: 224",
                    )  # fmt: skip
            elif key == "devices":
                facts.devices = facts.read_devices(name, value)
            else:
                facts.problem(
                    name, value, "unknown fact", f"use {', '.join(FACT_KEYS)} (and models)"
                )
        return facts

    def read_devices(self, where: str, value: object) -> list[Device]:
        if not isinstance(value, list):
            self.problem(where, value, "must be a list of devices", FIXTURE_FIX)
            return []
        devices = []
        for i, item in enumerate(value):
            good = (
                isinstance(item, Mapping)
                and set(item) <= set(DEVICE_KEYS)
                and is_count(item.get("index"))
                and is_count(item.get("memory_bytes"))
                and isinstance(item.get("healthy", True), bool)
            )
            if not good:
                self.problem(
                    f"{where}[{i}]",
                    item,
                    "a device needs index and memory_bytes (whole numbers >= 0) and may say "
                    "healthy: true or false",
                    "write {index: 0, memory_bytes: 85520809984, healthy: true}",
                )
                continue
            assert isinstance(item, Mapping)
            devices.append(Device(item["index"], item["memory_bytes"], item.get("healthy", True)))
        return devices

    def problem(
        self,
        key: str,
        value: object,
        message: str,
        fix: str,
        severity: Literal["error", "warning"] = "error",
    ) -> None:
        self.problems.append(FactProblem(key, value, message, fix, severity))


def is_count(value: object) -> bool:
    """A whole number from 0 to the largest 64-bit integer (bool is not a number here)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= INT64_MAX


def from_fixture(data: object) -> tuple[HostFacts, dict[str, dict[str, object]]]:
    """preflight_facts: the facts and the installed models ({name: {config, weight_bytes}})."""
    if not isinstance(data, Mapping):
        return HostFacts.from_dict(data), {}
    facts = HostFacts.from_dict({k: v for k, v in data.items() if k != "models"})
    installed = data.get("models")
    models: dict[str, dict[str, object]] = {}
    if installed is None:
        return facts, models
    if not isinstance(installed, Mapping):
        facts.problem(
            "preflight_facts.models", installed, "must be a mapping of model name to its facts",
            "write models: {<name>: {config: {...}, weight_bytes: N}}",
        )  # fmt: skip
        return facts, models
    for name, model in installed.items():
        if isinstance(model, Mapping):
            models[str(name)] = dict(model)
        else:
            facts.problem(
                f"preflight_facts.models.{name}", model, "must be a mapping",
                "write {config: {...}, weight_bytes: N}",
            )  # fmt: skip
    return facts, models


def _probed_count(facts: HostFacts, probe: Mapping[str, object], key: str) -> int:
    """A number the probe rendered (set_fact makes it a string); 0 when it is not one."""
    value = probe.get(key)
    text = str(value).strip() if value is not None else ""
    if not text:
        return 0
    if re.fullmatch(r"[0-9]{1,18}", text):
        return int(text)
    facts.problem(
        f"preflight_probe.{key}", value, "the host's facts gave no number here: checks of it skipped",
        "check the host's Python facts (ansible -m setup)", "warning",
    )  # fmt: skip
    return 0


def from_probe(probe: object) -> HostFacts:
    """Facts from the read-only probe tasks (setup, nvidia-smi, npu-smi, version files)."""
    facts = HostFacts()
    if not isinstance(probe, Mapping):
        return facts
    facts.python = str(probe.get("python") or "")
    facts.cpu_count = _probed_count(facts, probe, "cpu_count")
    facts.memory_bytes = min(_probed_count(facts, probe, "memory_mb") * MIB, INT64_MAX)
    nvidia_smi = probe.get("nvidia_smi")
    if nvidia_smi:
        try:
            facts.devices, facts.driver_version = parse_nvidia_smi(str(nvidia_smi))
        except UnreadableOutput as err:
            facts.problem(
                "preflight_nvidia_smi", str(err),
                "nvidia-smi printed a line preflight cannot read: GPU checks and the KV plan skipped",
                "run nvidia-smi on the host and repair the driver, or set kv_cache_bytes",
                "warning",
            )  # fmt: skip
    npu_smi = probe.get("npu_smi")
    if npu_smi:
        facts.devices = parse_npu_smi(str(npu_smi))
        facts.driver_version = parse_version_info(str(probe.get("ascend_driver_info") or ""))
        facts.cann_version = parse_version_info(str(probe.get("cann_info") or ""))
    return facts


def read_model_info(model_info: object, facts: HostFacts) -> dict[str, dict[str, object]]:
    """What the agent's model-info said of each installed model; unreadable output is a warning."""
    models: dict[str, dict[str, object]] = {}
    results = model_info.get("results") if isinstance(model_info, Mapping) else None
    for read in results if isinstance(results, list) else []:
        if not isinstance(read, Mapping) or read.get("rc") != 0 or not read.get("stdout"):
            continue
        item = str(read.get("item"))
        try:
            info = json.loads(str(read["stdout"]))
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
            info = None
        if isinstance(info, dict):
            models[item] = info
        else:
            facts.problem(
                f"preflight_model_info[{item}]", str(read["stdout"])[:200],
                "the agent's model-info printed no JSON mapping: the catalog's config and "
                "weight_bytes are used instead",
                f"run vllm-fleet model-info on the host's copy of {item}",
                "warning",
            )  # fmt: skip
    return models


# nvidia-smi's memory.total in MiB (a value like [N/A] is not one).
_NUMBER = re.compile(r"[0-9]{1,12}(\.[0-9]+)?")
# The fields preflight's probe asks for (roles/preflight/tasks), in its order.
PREFLIGHT_SMI_FIELDS = ("index", "memory.total", "driver_version")


def read_nvidia_smi(stdout: str, fields: Sequence[str]) -> list[dict[str, str]]:
    """``nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits``: a mapping per GPU.

    The one parser of that output (preflight's probe and the cuda_stack role both use it).
    A non-empty line without one value per field, or whose ``index`` or ``memory.total`` is
    not a number, raises UnreadableOutput with that line: never a silently shorter list.
    """
    gpus: list[dict[str, str]] = []
    for line in str(stdout).splitlines():
        if not line.strip():
            continue
        row = next(csv.reader([line], skipinitialspace=True), [])
        cells = [cell.strip() for cell in row]
        if len(cells) != len(fields):
            raise UnreadableOutput(line)
        gpu = dict(zip(fields, cells, strict=True))
        if "index" in gpu and not gpu["index"].isdecimal():
            raise UnreadableOutput(line)
        if "memory.total" in gpu and not _NUMBER.fullmatch(gpu["memory.total"]):
            raise UnreadableOutput(line)
        gpus.append(gpu)
    return gpus


def parse_nvidia_smi(stdout: str) -> tuple[list[Device], str]:
    """Preflight's probe (PREFLIGHT_SMI_FIELDS): devices with their memory, and the driver."""
    gpus = read_nvidia_smi(stdout, PREFLIGHT_SMI_FIELDS)
    devices = [
        Device(index=int(gpu["index"]), memory_bytes=int(float(gpu["memory.total"])) * MIB)
        for gpu in gpus
    ]
    return devices, gpus[-1]["driver_version"] if gpus else ""


@dataclass(frozen=True)
class NpuRow:
    """One device of ``npu-smi info``: its two table rows read together."""

    index: int
    name: str
    health: str
    hbm_used_mb: int
    hbm_total_mb: int

    @property
    def healthy(self) -> bool:
        return self.health == "OK"


# Huawei's documented table, two rows per device:
# `| 0     910B3     | OK    | 93.6  40  0 / 0 |` then `| 0 | 0000:C1:00.0 | 0 0 / 0  3161 / 65536 |`
_NPU_HEAD = re.compile(r"^\|\s*(\d+)\s+(\S+)\s*\|\s*([A-Za-z]+)\s*\|")
_NPU_HBM = re.compile(r"^\|\s*\d+\s*\|\s*[0-9A-Fa-f:.]+\s*\|.*?(\d+)\s*/\s*(\d{1,12})\s*\|\s*$")


def read_npu_smi(text: str) -> list[NpuRow]:
    """``npu-smi info``: the one parser of it (preflight's probe and the ascend_stack role).

    A device is its head row (index, name, Health) followed by its chip row (bus id, HBM used /
    total in MB); a head row without its chip row is no device.
    """
    rows: list[NpuRow] = []
    pending: tuple[int, str, str] | None = None
    for line in str(text or "").splitlines():
        head = _NPU_HEAD.match(line)
        if head and pending is None:
            pending = (int(head.group(1)), head.group(2), head.group(3))
            continue
        if pending is not None:
            hbm = _NPU_HBM.match(line)
            if hbm:
                rows.append(NpuRow(*pending, int(hbm.group(1)), int(hbm.group(2))))
                pending = None
    return rows


def parse_npu_smi(text: str) -> list[Device]:
    """Preflight's view of ``npu-smi info``: index, HBM total and health per device."""
    return [Device(row.index, row.hbm_total_mb * MIB, row.healthy) for row in read_npu_smi(text)]


def parse_version_info(text: str) -> str:
    """The first ``version=`` (any case) line of an Ascend version.info / install.info file;
    '' if none. The one parser of those files (preflight and the ascend_stack role)."""
    for line in str(text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip().lower() == "version":
            return value.strip()
    return ""
