"""Filters of the ascend_stack role: inventory checks, the install plan and what the vendor's
tools print (npu-smi info and version.info through preflight's parsers, set_env.sh), as Huawei's
guides document."""

from __future__ import annotations

import json
import re

from vllm_fleet.preflight.facts import parse_version_info, read_npu_smi

HDK = ("driver", "firmware")
CANN = ("toolkit", "ops", "nnal")
KINDS = HDK + CANN
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def ascend_npu_smi(text: str) -> dict[str, object]:
    """`npu-smi info` -> {count, devices: [{index, name, health, healthy, hbm_used_mb,
    hbm_total_mb}], unhealthy: [index, ...]}, read by preflight's parser of it."""
    devices: list[dict[str, object]] = [
        {
            "index": row.index,
            "name": row.name,
            "health": row.health,
            "healthy": row.healthy,
            "hbm_used_mb": row.hbm_used_mb,
            "hbm_total_mb": row.hbm_total_mb,
        }
        for row in read_npu_smi(text)
    ]
    return {
        "count": len(devices),
        "devices": devices,
        "unhealthy": [d["index"] for d in devices if not d["healthy"]],
    }


def ascend_version_info(text: str) -> str:
    """The first ``version=`` line of a version.info / install.info file; '' if none."""
    return parse_version_info(text)


def ascend_versions(files: dict[str, str]) -> dict[str, str]:
    """Package kind -> its installed version, from the probe's version file texts."""
    return {kind: parse_version_info(text) for kind, text in files.items()}


def ascend_validate(
    packages: object,
    source_dir: str,
    source_url: str,
    requires: dict[str, str] | None,
    host: str,
) -> list[str]:
    """Every problem of the package inventory, each naming host, key, value and the fix."""
    problems: list[str] = []
    key = "ascend_stack_packages"
    if bool(source_dir) == bool(source_url):
        problems.append(
            f"host {host}: ascend_stack_package_dir={source_dir!r} and ascend_stack_package_url="
            f"{source_url!r}: set exactly one (a controller directory or a URL the host can reach)"
        )
    if not isinstance(packages, dict):
        return [
            *problems,
            f"host {host}: {key}={packages!r} must be a mapping of {', '.join(KINDS)}",
        ]
    for kind in KINDS:
        pkg = packages.get(kind)
        if not isinstance(pkg, dict):
            problems.append(
                f"host {host}: {key}.{kind}={pkg!r}: missing; give file, version and sha256 of the "
                f"{kind} .run package"
            )
            continue
        file, version, sha = (str(pkg.get(k, "")) for k in ("file", "version", "sha256"))
        if not file.endswith(".run") or "/" in file:
            problems.append(f"host {host}: {key}.{kind}.file={file}: must be the .run file name")
        if not version or f"_{version}" not in file:
            problems.append(
                f"host {host}: {key}.{kind}.version={version} does not match the file name {file}; "
                "the vendor's file names carry the version: fix the version or the file"
            )
        if not _SHA256.match(sha):
            problems.append(
                f"host {host}: {key}.{kind}.sha256={sha} is not a sha256 (64 lower-case hex); "
                f"put the output of `sha256sum {file}` there"
            )
    cann = {
        k: str(packages[k].get("version", "")) for k in CANN if isinstance(packages.get(k), dict)
    }
    toolkit = cann.get("toolkit", "")
    for kind in ("ops", "nnal"):
        if toolkit and cann.get(kind) and cann[kind] != toolkit:
            problems.append(
                f"host {host}: {key}.{kind}.version={cann[kind]} but toolkit is {toolkit}: CANN "
                f"{kind} must be the toolkit's version; use the {kind} package of CANN {toolkit}"
            )
    for need, kind in (("cann", "toolkit"), ("nnal", "nnal")):
        want = str((requires or {}).get(need, ""))
        if want and cann.get(kind) and cann[kind] != want:
            problems.append(
                f"host {host}: {key}.{kind}.version={cann[kind]} but the engine stack requires "
                f"{need} {want} (catalog/stacks.yml); install CANN {want} or pick a stack built for "
                f"{cann[kind]}"
            )
    return problems


def ascend_install_plan(
    packages: dict[str, dict[str, str]],
    installed: dict[str, str],
    has_npu_smi: bool,
    flags: dict[str, dict[str, list[str]]],
) -> list[dict[str, object]]:
    """The packages to install, in the vendor's order, each with its unattended flags.

    First install (no driver version.info and no npu-smi): driver, then firmware; an upgrade or
    overwrite: firmware, then driver (Huawei's deployer decides the same way). Then toolkit, ops,
    nnal. A package whose installed version equals the desired one is skipped.
    """
    first = not installed.get("driver") and not has_npu_smi
    hdk = ["driver", "firmware"] if first else ["firmware", "driver"]
    plan: list[dict[str, object]] = []
    for kind in [*hdk, *CANN]:
        pkg = packages[kind]
        have = installed.get(kind, "")
        if have == str(pkg["version"]):
            continue
        mode = "upgrade" if have else "first"
        plan.append(
            {
                "kind": kind,
                "file": pkg["file"],
                "version": str(pkg["version"]),
                "sha256": pkg["sha256"],
                "installed": have,
                "mode": mode,
                "flags": list(flags[kind][mode]),
            }
        )
    return plan


def _drop_link_time_dirs(value: str) -> str:
    """Path lists without the toolkit's stub/devlib directories (link time only, never runtime)."""
    keep = [p for p in value.split(":") if not re.search(r"/(stub|devlib)(/|$)", p)]
    return ":".join(keep)


def ascend_env_capture(before: str, after: str) -> dict[str, str]:
    """Variables set_env.sh added or changed: JSON dumps of the environment before and after.

    Path lists lose stub/devlib entries, so a service never loads the link-time stub."""
    old: dict[str, str] = json.loads(before)
    new: dict[str, str] = json.loads(after)
    env: dict[str, str] = {}
    for key, value in sorted(new.items()):
        if key in ("PWD", "OLDPWD", "SHLVL", "_") or old.get(key) == value:
            continue
        env[key] = _drop_link_time_dirs(value).strip(":") if "/" in value else value
    return env


def ascend_resolution_problems(result: dict[str, object], root: str, host: str) -> list[str]:
    """Which file each library resolved to (ascend_resolve.py), checked against where it must be."""
    hal = f"{root}/driver/lib64/driver/libascend_hal.so"
    problems: list[str] = []
    wanted = {
        ("plain", "libascend_hal.so"): hal,
        ("service", "libascend_hal.so"): hal,
        ("service", "libascendcl.so"): f"{root}/ascend-toolkit/",
        ("service", "libatb.so"): f"{root}/nnal/",
    }
    fixes = {
        "plain": "no other /etc/ld.so.conf.d file may list a CANN stub or devlib directory ahead of "
        "00-vllm-fleet-ascend.conf; remove it and run ldconfig",
        "service": "the captured /etc/vllm-fleet/ascend.env must not put a stub/devlib directory on "
        "LD_LIBRARY_PATH",
    }
    for (where, lib), want in wanted.items():
        got = str((result.get(where) or {}).get(lib, "not loaded"))
        ok = got == want if want.endswith(".so") else got.startswith(want)
        if not ok or re.search(r"/(stub|devlib)/", got):
            problems.append(
                f"host {host}: {lib} resolves to {got} for a {where} process, expected "
                f"{want}{'...' if not want.endswith('.so') else ''}; {fixes[where]}"
            )
    return problems


FILTERS = {
    "ascend_stack_npu_smi": ascend_npu_smi,
    "ascend_stack_version_info": ascend_version_info,
    "ascend_stack_versions": ascend_versions,
    "ascend_stack_validate": ascend_validate,
    "ascend_stack_install_plan": ascend_install_plan,
    "ascend_stack_env_capture": ascend_env_capture,
    "ascend_stack_resolution_problems": ascend_resolution_problems,
}
