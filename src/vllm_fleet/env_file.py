"""Read systemd EnvironmentFiles (KEY=VALUE lines), so secrets never pass through argv."""

from __future__ import annotations

import shlex
from pathlib import Path


def read_env_file(path: Path) -> dict[str, str]:
    return parse_env(path.read_text())


def parse_env(text: str) -> dict[str, str]:
    values = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            continue
        parts = shlex.split(value) if value else [""]
        values[key.strip()] = parts[0] if parts else ""
    return values
