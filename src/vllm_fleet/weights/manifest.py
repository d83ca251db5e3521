"""Model manifests: the list of files (path, size, sha256) a model revision consists of.

A mirror serves ``<base>/<revision>/manifest.json``. For the ``mirror`` source the
revision *is* the sha256 of that manifest's canonical bytes, so pinning a revision
in the inventory pins every byte of every file.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path, PurePosixPath

from pydantic import BaseModel, Field, field_validator

from vllm_fleet.weights.hashing import sha256_files

MANIFEST_FORMAT = "vllm-fleet-manifest/1"


class ManifestFile(BaseModel):
    path: str
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    @field_validator("path")
    @classmethod
    def _relative_and_inside(cls, value: str) -> str:
        pure = PurePosixPath(value)
        if pure.is_absolute() or ".." in pure.parts or value in ("", "."):
            raise ValueError(f"manifest path {value!r} must be relative and stay inside the model")
        return value


class Manifest(BaseModel):
    format: str = MANIFEST_FORMAT
    model: str
    files: list[ManifestFile]

    @field_validator("files")
    @classmethod
    def _unique_sorted(cls, files: list[ManifestFile]) -> list[ManifestFile]:
        paths = [f.path for f in files]
        if len(set(paths)) != len(paths):
            raise ValueError("manifest lists a path twice")
        return sorted(files, key=lambda f: f.path)

    def canonical_bytes(self) -> bytes:
        return canonical_json(self.model_dump())

    def revision_id(self) -> str:
        return hashlib.sha256(self.canonical_bytes()).hexdigest()

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def canonical_json(data: object) -> bytes:
    return (json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n").encode()


def model_files(root: Path) -> list[Path]:
    """Every regular file under root, skipping vllm-fleet's own hidden bookkeeping files."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found.extend(Path(dirpath, f) for f in sorted(filenames) if not f.startswith("."))
    return found


def build_manifest(model: str, root: Path, workers: int = 4) -> Manifest:
    files = model_files(root)
    digests = sha256_files(files, workers)
    entries = [
        ManifestFile(path=f.relative_to(root).as_posix(), size=f.stat().st_size, sha256=digests[f])
        for f in files
    ]
    return Manifest(model=model, files=entries)
