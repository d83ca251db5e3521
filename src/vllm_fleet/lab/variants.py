"""Variants of the lab's deployment, as an operator would edit them (upgrade tests, benches).

An edited copy of the lab inventory lives inside ``inventories/`` because the lab's
inventory finds its secrets relative to itself.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from vllm_fleet.weights.publish import publish

LAB_MODEL = "smollm2-135m"


def publish_revision(cache: Path, note: str) -> str:
    """A new, valid revision of the lab's model in the mirror (a NOTICE file differs)."""
    source = cache / "variant-model"
    shutil.rmtree(source, ignore_errors=True)
    shutil.copytree(cache / "converted" / LAB_MODEL, source)
    (source / "NOTICE").write_text(note + "\n")
    try:
        return publish(LAB_MODEL, source, cache / "mirror" / "models" / LAB_MODEL)
    finally:
        shutil.rmtree(source, ignore_errors=True)


def remove_revision(cache: Path, revision: str) -> None:
    shutil.rmtree(cache / "mirror" / "models" / LAB_MODEL / revision, ignore_errors=True)


def inventory_variant(
    root: Path,
    name: str,
    revision: str,
    max_num_seqs: int,
    extra_args: dict[str, list[str]] | None = None,
) -> Path:
    """inventories/<name>: the lab inventory with the model's revision, every group's
    max_num_seqs and, per host, extra engine arguments changed."""
    target = root / "inventories" / name
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(root / "inventories" / "lab", target)
    models_file = target / "group_vars/all/models.yml"
    models = yaml.safe_load(models_file.read_text())
    models["fleet_models"][LAB_MODEL]["revision"] = revision
    models_file.write_text(yaml.safe_dump(models))
    for host_file in sorted((target / "host_vars").glob("*.yml")):
        settings = yaml.safe_load(host_file.read_text()) or {}
        for group in settings.get("fleet_engine_groups", []):
            group["max_num_seqs"] = max_num_seqs
            if extra_args and host_file.stem in extra_args:
                group["extra_args"] = extra_args[host_file.stem]
        host_file.write_text(yaml.safe_dump(settings))
    return target
