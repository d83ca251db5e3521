"""Install a pre-staged model directory into ``<root>/<name>/<revision>/``, verified.

For hosts without a network path to a mirror: an operator copies a mirror's revision
directory (``<mirror>/<model>/<revision>/``, files plus ``manifest.json``, as ``vllm-fleet
publish`` writes it) from removable media to the host. The pin is the same as for the mirror
source: the revision is the sha256 of the manifest's canonical bytes, so the manifest must hash
to it, and every file must match the manifest's size and sha256.

The staged directory must hold exactly the manifest's files (and the manifest itself, when it
lies inside): an unlisted file is refused by name, so staging the wrong directory, or a
directory with leftovers, is noticed rather than half-installed. Files are copied into the
shared staging directory of ``weights.RevisionFetch`` and hashed while they are copied (one
read of each source file); only a fully verified copy is renamed into place. The staged
directory is only read, never changed.
"""

from __future__ import annotations

import hashlib
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from vllm_fleet.weights.base import (
    Progress,
    RevisionFetch,
    WeightsError,
    raise_if_disk_full,
    tree_entries,
)
from vllm_fleet.weights.hashing import BLOCK_SIZE
from vllm_fleet.weights.manifest import Manifest, ManifestFile
from vllm_fleet.weights.pins import revision_problem

STAGED_MANIFEST = "manifest.json"


def copy_hashed(source: Path, dest: Path, progress: Progress) -> tuple[int, str]:
    """Copy source to dest in large blocks, hashing what is copied; (bytes, sha256)."""
    digest = hashlib.sha256()
    buffer = bytearray(BLOCK_SIZE)
    view = memoryview(buffer)
    size = 0
    dest.parent.mkdir(parents=True, exist_ok=True)
    with source.open("rb", buffering=0) as src, dest.open("wb", buffering=0) as out:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(src.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        while count := src.readinto(buffer):
            chunk = view[:count]
            digest.update(chunk)
            out.write(chunk)
            size += count
            progress.add(count)
        os.fsync(out.fileno())
    return size, digest.hexdigest()


@dataclass(kw_only=True)
class LocalFetch(RevisionFetch):
    """The pre-staged directory ``path``, checked against ``manifest`` (default
    ``<path>/manifest.json``), installed as revision ``revision`` (the manifest's id)."""

    path: Path
    manifest: Path | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.path = Path(self.path)
        problem = revision_problem(self.name, "local", self.revision)
        if problem:
            raise WeightsError(problem)

    @property
    def manifest_path(self) -> Path:
        return Path(self.manifest) if self.manifest is not None else self.path / STAGED_MANIFEST

    @property
    def where(self) -> str:
        return f"model {self.name} revision {self.revision} from {self.path}"

    def _fetch_into_place(self) -> Manifest:
        manifest = self._read_manifest()
        self._check_staged(manifest)
        self._check_free_space(manifest.total_bytes)
        provenance = {"source": "local", "path": str(self.path), "revision": self.revision}
        return self._install(lambda staging: self._copy_all(manifest, staging), provenance)

    def _read_manifest(self) -> Manifest:
        if not self.path.is_dir():
            raise WeightsError(
                f"{self.where}: {self.path} is not a directory; copy the model's revision "
                "directory there (or fix the path) and re-run. Nothing was installed."
            )
        try:
            data = self.manifest_path.read_bytes()
        except OSError as err:
            raise WeightsError(
                f"{self.where}: cannot read the manifest {self.manifest_path}: "
                f"{err.strerror or err}; copy manifest.json along with the files"
            ) from None
        try:
            manifest = Manifest.model_validate_json(data)
        except ValidationError as err:
            raise WeightsError(
                f"{self.where}: {self.manifest_path} is not a vllm-fleet manifest: "
                f"{err.error_count()} problem(s), first: {err.errors()[0]['msg']}"
            ) from None
        actual = manifest.revision_id()
        if actual != self.revision:
            raise WeightsError(
                f"{self.where}: the manifest {self.manifest_path} has id {actual}, expected the "
                f"pinned revision {self.revision}; this is another revision (or an edited "
                "manifest): stage the pinned revision's directory or re-pin. Nothing was "
                "installed; the previous revision stays in place."
            )
        if manifest.model != self.name:
            raise WeightsError(
                f"{self.where}: the manifest is for model {manifest.model!r}; "
                "stage this model's directory. Nothing was installed."
            )
        return manifest

    def _check_staged(self, manifest: Manifest) -> None:
        """Sizes, missing and unlisted files: everything that needs no reading of content."""
        found = tree_entries(self.path)
        own = self.manifest_path.resolve()
        problems: list[str] = []
        listed = {entry.path for entry in manifest.files}
        for entry in manifest.files:
            st = found.get(entry.path)
            if st is None:
                problems.append(f"{entry.path}: missing")
            elif not stat.S_ISREG(st.st_mode):
                problems.append(f"{entry.path}: not a regular file (a link or device)")
            elif st.st_size != entry.size:
                problems.append(f"{entry.path}: size {st.st_size}, expected {entry.size}")
        for rel in sorted(set(found) - listed):
            if (self.path / rel).resolve() == own and not (self.path / rel).is_symlink():
                continue
            problems.append(f"{rel}: not in the manifest (unexpected file)")
        if problems:
            self._refuse(problems)

    def _copy_all(self, manifest: Manifest, staging: Path) -> Manifest:
        progress = Progress(
            manifest.total_bytes, f"copy {self.name}@{self.revision[:12]}", self.report
        )
        problems: list[str] = []

        def one(entry: ManifestFile) -> None:
            try:
                size, got = copy_hashed(self.path / entry.path, staging / entry.path, progress)
            except OSError as err:
                raise_if_disk_full(err, entry.path, staging)
                problems.append(f"{entry.path}: cannot copy: {err.strerror or err}")
                return
            if size != entry.size:
                problems.append(f"{entry.path}: size {size}, expected {entry.size}")
                (staging / entry.path).unlink()
            elif got != entry.sha256:
                problems.append(
                    f"{entry.path}: sha256 mismatch: expected {entry.sha256}, got {got}"
                )
                (staging / entry.path).unlink()

        ordered = sorted(manifest.files, key=lambda e: e.size, reverse=True)
        with ThreadPoolExecutor(max_workers=max(1, self.workers)) as pool:
            list(pool.map(one, ordered))
        if problems:
            self._refuse(problems)
        return manifest

    def _refuse(self, problems: list[str]) -> None:
        raise WeightsError(
            f"{self.where}: "
            + "; ".join(sorted(problems))
            + ". Nothing was installed; the previous revision stays in place. "
            "Re-copy the pinned revision's directory (exactly its files) and re-run."
        )
