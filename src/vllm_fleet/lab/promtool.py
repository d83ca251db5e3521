"""Prometheus's own tools on the controller, from Debian's package (no service started).

`promtool check rules` / `test rules` / `check config` run the fleet's alert rules and
scrape configs through the same code Prometheus uses. The package is downloaded with
apt (hash-checked against the signed index) and unpacked into the cache, never
installed, so no Prometheus starts on the controller.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from vllm_fleet.lab.paths import LabPaths
from vllm_fleet.lab.steps import log, run

PACKAGE = "prometheus"


def _candidate_version() -> str | None:
    out = subprocess.run(
        ["apt-cache", "policy", PACKAGE], capture_output=True, text=True, check=False
    ).stdout
    for line in out.splitlines():
        key, _, value = line.strip().partition(":")
        if key == "Candidate" and value.strip() not in ("", "(none)"):
            return value.strip()
    return None


def promtool(paths: LabPaths) -> Path:
    """Path of promtool from the cache, unpacking Debian's package there once."""
    tools = paths.cache / "tools"
    found = sorted(tools.glob(f"{PACKAGE}-*/usr/bin/promtool"))
    if found:
        return found[-1]
    version = _candidate_version()
    if version is None:
        run(["apt-get", "update", "-qq"])
        version = _candidate_version()
    if version is None:
        raise RuntimeError(f"apt knows no candidate for {PACKAGE}: check the Debian sources")
    dest = tools / f"{PACKAGE}-{version}"
    tools.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tools) as tmp:
        # apt-get download writes into the working directory; _apt cannot, which is fine.
        run(
            ["apt-get", "download", "-q", f"{PACKAGE}={version}"],
            cwd=tmp,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
            stderr=subprocess.DEVNULL,
        )
        (deb,) = Path(tmp).glob("*.deb")
        unpacked = Path(tmp) / "root"
        run(["dpkg-deb", "-x", str(deb), str(unpacked)])
        shutil.rmtree(dest, ignore_errors=True)
        unpacked.rename(dest)
    tool = dest / "usr/bin/promtool"
    log(f"promtool {version} -> {tool}")
    return tool


def prepare(paths: LabPaths) -> None:
    promtool(paths)
