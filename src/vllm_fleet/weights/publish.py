"""Publish a model directory into a mirror tree: ``<mirror>/<revision>/`` + manifest.json."""

from __future__ import annotations

import shutil
from pathlib import Path

from vllm_fleet.weights.manifest import build_manifest


def publish(model: str, source: Path, model_mirror_dir: Path, workers: int = 4) -> str:
    """Copy source into the mirror under its manifest id; returns the revision."""
    manifest = build_manifest(model, source, workers)
    revision = manifest.revision_id()
    target = model_mirror_dir / revision
    if (target / "manifest.json").is_file():
        return revision
    staging = model_mirror_dir / f".staging-{revision}"
    shutil.rmtree(staging, ignore_errors=True)
    for entry in manifest.files:
        dest = staging / entry.path
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / entry.path, dest)
    (staging / "manifest.json").write_bytes(manifest.canonical_bytes())
    for path in staging.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    staging.chmod(0o755)
    staging.rename(target)
    return revision
