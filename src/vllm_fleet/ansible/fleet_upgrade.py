"""Filters of the fleet_upgrade role."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from vllm_fleet.deploy.rollout import drain_plan


def config_groups(files: list[dict[str, Any]]) -> list[str]:
    """Group names of the settings files a ``find`` of the engines' config dir returned."""
    names = (PurePosixPath(str(f["path"])) for f in files)
    return sorted(n.stem for n in names if n.suffix == ".json")


def upgrade_records(hosts: list[str], hostvars: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each host's upgrade record, in play order (hosts that got none are left out)."""
    return [
        dict(hostvars[h]["fleet_upgrade_record"])
        for h in hosts
        if "fleet_upgrade_record" in hostvars[h]
    ]


def failure_text(result: Mapping[str, Any], limit: int = 4000) -> str:
    """What a failed task said: its msg, or each failed loop item's (a journal, say); at
    most ``limit`` characters, keeping the first line and the end."""
    parts: list[str] = []

    def add(msg: object) -> None:
        if isinstance(msg, list | tuple):
            for item in msg:
                add(item)
        elif msg:
            parts.append(str(msg))

    for item in result.get("results") or []:
        if isinstance(item, Mapping) and item.get("failed"):
            add(item.get("msg"))
    if not parts:
        add(result.get("msg"))
    text = "\n".join(parts)
    if len(text) <= limit:
        return text
    # A journal's last lines say why a start failed: keep the first line and the end.
    head = text.split("\n", 1)[0][: limit // 4]
    return f"{head}\n[...]\n{text[len(text) - (limit - len(head) - 7) :]}"


def snapshot_files(
    results: list[Mapping[str, Any]], groups: list[str] | None = None, unit_file: str = ""
) -> list[dict[str, Any]]:
    """The slurped settings files (and unit) to write back: path, content (base64) and the
    owner, group and mode they had. ``groups`` limits it to those groups' files and the unit
    (``unit_file``); without it, every file."""
    out = []
    for result in results:
        stat = result["item"]
        path = str(stat["path"])
        if groups is not None and PurePosixPath(path).stem not in groups and path != unit_file:
            continue
        out.append(
            {
                "path": path,
                "content": result["content"],
                "owner": stat.get("pw_name", "root"),
                "group": stat.get("gr_name", "root"),
                "mode": stat.get("mode", "0600"),
            }
        )
    return out


FILTERS = {
    "fleet_upgrade_drain_plan": drain_plan,
    "fleet_upgrade_config_groups": config_groups,
    "fleet_upgrade_records": upgrade_records,
    "fleet_upgrade_failure_text": failure_text,
    "fleet_upgrade_snapshot_files": snapshot_files,
}
