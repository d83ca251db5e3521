"""Filters of the cuda_stack role: driver version logic, kernel module flavour, nvidia-smi parsing.

Kept here, in Python, so the decisions are unit-tested (tests/unit/test_cuda_filters.py) and the
role's Jinja stays one line per value; nvidia-smi's output is read by preflight's parser.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from vllm_fleet.preflight.facts import UnreadableOutput, read_nvidia_smi

try:  # Ansible is there when the role runs (on the controller); not in a host's agent venv.
    from ansible.errors import AnsibleFilterError as _FilterError
except ImportError:  # pragma: no cover - only outside Ansible
    _FilterError = ValueError  # type: ignore[assignment,misc]

# NVIDIA driver versions: <branch>.<minor>[.<patch>], e.g. 580.95.05 or 580.65.
_VERSION = re.compile(r"^(\d{3})\.\d{2,3}(\.\d{2,3})?$")

# GPU generations (architectures). NVIDIA's open kernel modules support Turing and newer;
# Maxwell, Pascal and Volta need the proprietary ones; Grace Hopper and Blackwell support
# only the open ones. From R560 the open modules are the default (NVIDIA Driver Installation
# Guide, "Open GPU Kernel Modules" / "Choosing an Installation Method").
OPEN_ONLY = frozenset({"grace-hopper", "blackwell", "grace-blackwell"})
PROPRIETARY_ONLY = frozenset({"maxwell", "pascal", "volta"})
EITHER = frozenset({"turing", "ampere", "ada", "hopper"})
KNOWN_ARCHES = OPEN_ONLY | PROPRIETARY_ONLY | EITHER
OPEN_DEFAULT_FROM_BRANCH = 560

# nvidia-smi --query-gpu fields the role reads, in order, and their key in the facts.
SMI_FIELDS: tuple[str, ...] = (
    "index",
    "name",
    "uuid",
    "driver_version",
    "memory.total",
    "pci.bus_id",
    "persistence_mode",
)


def cuda_driver_branch(version: str) -> int:
    """The branch (major) of a driver version: 580 for 580.95.05. Raises on a malformed one."""
    match = _VERSION.match(str(version))
    if not match:
        raise _FilterError(f"{version!r} is not an NVIDIA driver version (expected like 580.95.05)")
    return int(match.group(1))


def cuda_driver_version_problem(version: str, stack: Mapping[str, Any]) -> str:
    """Why ``version`` cannot serve ``stack`` (a catalog entry), or "" when it can."""
    if not _VERSION.match(str(version)):
        return f"{version!r} is not an NVIDIA driver version (expected like 580.95.05)"
    if stack.get("accelerator") != "cuda":
        return f"the stack is for accelerator {stack.get('accelerator')!r}, not cuda"
    requires = stack.get("requires") or {}
    minimum = requires.get("cuda_driver_min")
    if minimum is None:
        return "the stack declares no requires.cuda_driver_min in catalog/stacks.yml"
    branch = cuda_driver_branch(version)
    if branch < int(minimum):
        cuda = requires.get("cuda", "?")
        return (
            f"driver branch R{branch} is older than R{minimum}, the first branch with CUDA {cuda} "
            "that the stack's wheels link against"
        )
    return ""


def cuda_module_flavor_problem(arch: str, branch: int, choice: str) -> str:
    """Why kernel modules ``choice`` (open, proprietary or auto) cannot run ``arch``, or ""."""
    arch = str(arch).lower()
    if arch not in KNOWN_ARCHES:
        return f"unknown GPU generation {arch!r}; use one of: {', '.join(sorted(KNOWN_ARCHES))}"
    if choice not in ("auto", "open", "proprietary"):
        return f"kernel modules {choice!r} must be auto, open or proprietary"
    if choice == "proprietary" and arch in OPEN_ONLY:
        return f"{arch} GPUs are supported only by the open kernel modules"
    if choice == "open" and arch in PROPRIETARY_ONLY:
        return f"{arch} GPUs are not supported by the open kernel modules (Turing and newer only)"
    return ""


def cuda_module_flavor(arch: str, branch: int, choice: str = "auto") -> str:
    """open or proprietary: the kernel modules for this GPU generation and driver branch."""
    problem = cuda_module_flavor_problem(arch, branch, choice)
    if problem:
        raise _FilterError(problem)
    arch = str(arch).lower()
    if choice != "auto":
        return choice
    if arch in OPEN_ONLY:
        return "open"
    if arch in PROPRIETARY_ONLY:
        return "proprietary"
    return "open" if int(branch) >= OPEN_DEFAULT_FROM_BRANCH else "proprietary"


def cuda_package_names(
    names: Mapping[str, Any], flavor: str, branch: int, nvswitch: bool
) -> list[str]:
    """The version-locked packages to install for a flavour, branch and NVSwitch setting.

    ``names`` maps roles to name templates with ``{branch}`` (cuda_stack_package_names).
    """
    keys = ["meta_" + flavor, "driver", "kernel_" + flavor, "persistenced"]
    if nvswitch:
        keys += ["fabricmanager", "nscq"]
    missing = [k for k in keys if k not in names]
    if missing:
        raise _FilterError(f"cuda_stack_package_names lacks {', '.join(missing)}")
    return [str(names[k]).format(branch=branch) for k in keys]


def cuda_pinned(packages: Sequence[str], package_version: str) -> list[str]:
    """apt's name=version for each package."""
    return [f"{p}={package_version}" for p in packages]


def cuda_packages_to_change(
    packages: Sequence[str], package_version: str, installed: Mapping[str, Any]
) -> list[str]:
    """Packages not installed at exactly ``package_version`` (``installed``: package_facts)."""
    return [
        name
        for name in packages
        if package_version not in [str(p.get("version")) for p in installed.get(name, [])]
    ]


def cuda_unheld(packages: Sequence[str], selections: Sequence[str]) -> list[str]:
    """Packages not on hold, from ``dpkg-query --show --showformat='${Package} ${Status}\\n'``."""
    held = {line.split()[0] for line in selections if line.split()[1:2] == ["hold"]}
    return [p for p in packages if p not in held]


def cuda_reboot_reasons(probe: str, driver_version: str) -> list[str]:
    """Why this host must reboot before the driver can run: [] when it need not.

    ``probe``: key=value lines (reboot_reasons.yml): flag (1 when /run/reboot-required exists),
    packages (its .pkgs file), loaded (the loaded kernel module's version, empty when none) and
    nouveau (1 when the nouveau module is loaded).
    """
    values = dict(line.split("=", 1) for line in str(probe).splitlines() if "=" in line)
    missing = {"flag", "packages", "loaded", "nouveau"} - set(values)
    if missing:
        raise _FilterError(f"the reboot probe printed no {', '.join(sorted(missing))}: {probe!r}")
    reasons = []
    if values["flag"] == "1":
        names = ", ".join(sorted(set(values["packages"].split()))) or "no package named"
        reasons.append(f"/run/reboot-required is set ({names})")
    loaded = values["loaded"].strip()
    if not loaded:
        reasons.append(f"no NVIDIA kernel module is loaded (driver {driver_version} installed)")
    elif loaded != driver_version:
        reasons.append(
            f"the loaded NVIDIA kernel module is {loaded}, the installed driver {driver_version}"
        )
    if values["nouveau"] == "1":
        reasons.append("the nouveau module is loaded (it is blacklisted from the next boot)")
    return reasons


def cuda_parse_smi(stdout: str) -> list[dict[str, Any]]:
    """``nvidia-smi --query-gpu=<SMI_FIELDS> --format=csv,noheader,nounits``, read by
    preflight's parser of it: every non-empty line must have one value per field."""
    try:
        rows = read_nvidia_smi(str(stdout), SMI_FIELDS)
    except UnreadableOutput as err:
        raise _FilterError(
            f"nvidia-smi printed a line of another shape than --query-gpu={','.join(SMI_FIELDS)} "
            f"asks for: {str(err)!r}"
        ) from err
    return [
        {
            "index": int(cells["index"]),
            "name": cells["name"],
            "uuid": cells["uuid"],
            "driver_version": cells["driver_version"],
            "memory_total_mib": int(float(cells["memory.total"])),
            "pci_bus_id": cells["pci.bus_id"],
            "persistence_mode": cells["persistence_mode"],
        }
        for cells in rows
    ]


def cuda_gpu_problems(
    gpus: Sequence[Mapping[str, Any]], driver_version: str, expected_count: int = 0
) -> list[str]:
    """What is wrong with the parsed GPUs, as sentences: [] when all is well.

    ``expected_count`` 0 means at least one GPU.
    """
    problems = []
    if not gpus:
        problems.append("nvidia-smi lists no GPU")
    elif expected_count and len(gpus) != int(expected_count):
        problems.append(f"nvidia-smi lists {len(gpus)} GPUs, {expected_count} expected")
    for gpu in gpus:
        label = f"GPU {gpu['index']} ({gpu['pci_bus_id']})"
        if gpu["driver_version"] != driver_version:
            problems.append(f"{label} runs driver {gpu['driver_version']}, not {driver_version}")
        if gpu["persistence_mode"] != "Enabled":
            problems.append(
                f"{label} has persistence mode {gpu['persistence_mode']} (nvidia-persistenced)"
            )
    return problems


FILTERS = {
    "cuda_stack_driver_branch": cuda_driver_branch,
    "cuda_stack_driver_version_problem": cuda_driver_version_problem,
    "cuda_stack_module_flavor_problem": cuda_module_flavor_problem,
    "cuda_stack_module_flavor": cuda_module_flavor,
    "cuda_stack_package_names": cuda_package_names,
    "cuda_stack_pinned": cuda_pinned,
    "cuda_stack_packages_to_change": cuda_packages_to_change,
    "cuda_stack_reboot_reasons": cuda_reboot_reasons,
    "cuda_stack_unheld": cuda_unheld,
    "cuda_stack_parse_smi": cuda_parse_smi,
    "cuda_stack_gpu_problems": cuda_gpu_problems,
}
