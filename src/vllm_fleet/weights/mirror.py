"""Fetch a published revision from an HTTP mirror: resumable, hashed while written."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from vllm_fleet.weights.base import (
    DiskFullError,
    Progress,
    RevisionFetch,
    WeightsError,
    raise_if_disk_full,
    write_hashed,
)
from vllm_fleet.weights.hashing import BLOCK_SIZE
from vllm_fleet.weights.manifest import Manifest, ManifestFile


def _hash_prefix(dest: Path) -> tuple[Any, int]:
    digest = hashlib.sha256()
    done = 0
    with dest.open("rb") as handle:
        while block := handle.read(BLOCK_SIZE):
            digest.update(block)
            done += len(block)
    return digest, done


def download_resumable(client: httpx.Client, url: str, dest: Path, progress: Progress) -> str:
    """Stream url into dest, hashing as it writes; returns the sha256 of the whole file.

    A partial dest left by an interrupted run is continued with a Range request (its
    bytes are hashed first); a server that ignores the range gets a fresh download.
    A full disk is reported as such: the caller removes what was staged.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    digest, offset = (hashlib.sha256(), 0)
    if dest.is_file() and dest.stat().st_size > 0:
        digest, offset = _hash_prefix(dest)
    headers = {"Range": f"bytes={offset}-"} if offset else {}
    try:
        with client.stream("GET", url, headers=headers) as response:
            if offset and response.status_code == 416:
                # Already complete (or longer than the server's copy): start over, no range.
                response.close()
                dest.unlink()
                return download_resumable(client, url, dest, progress)
            response.raise_for_status()
            resumed = offset and response.status_code == 206
            if not resumed:
                digest, offset = (hashlib.sha256(), 0)
            else:
                progress.add(offset)
            with dest.open("ab" if resumed else "wb") as out:
                # As received, not re-chunked (iter_bytes without a size).
                write_hashed(response.iter_bytes(), out, digest, progress)
    except httpx.HTTPError as err:
        raise WeightsError(f"download of {url} failed: {err}") from err
    except OSError as err:
        raise_if_disk_full(err, dest.name, dest)
        raise WeightsError(f"{dest.name}: cannot write {dest}: {err.strerror}") from err
    return digest.hexdigest()


class MirrorClient:
    """Reads ``<base_url>/<revision>/...`` from an HTTP(S) mirror."""

    def __init__(self, base_url: str, timeout: float = 60.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.client = httpx.Client(timeout=timeout, follow_redirects=True)

    def url(self, revision: str, path: str) -> str:
        return f"{self.base_url}/{revision}/{path}"

    def manifest(self, revision: str) -> Manifest:
        url = self.url(revision, "manifest.json")
        try:
            response = self.client.get(url)
            response.raise_for_status()
        except httpx.HTTPError as err:
            raise WeightsError(f"cannot read manifest {url}: {err}") from err
        return Manifest.model_validate_json(response.content)

    def download(self, revision: str, path: str, dest: Path, progress: Progress) -> str:
        return download_resumable(self.client, self.url(revision, path), dest, progress)

    def close(self) -> None:
        self.client.close()


@dataclass(kw_only=True)
class MirrorFetch(RevisionFetch):
    base_url: str

    def _fetch_into_place(self) -> Manifest:
        client = MirrorClient(self.base_url)
        try:
            manifest = client.manifest(self.revision)
            actual_id = manifest.revision_id()
            if actual_id != self.revision:
                raise WeightsError(
                    f"model {self.name}: manifest at {client.url(self.revision, 'manifest.json')} "
                    f"has id {actual_id}, expected the pinned revision {self.revision}; "
                    "the mirror content changed: re-pin the revision or restore the mirror"
                )
            if manifest.model != self.name:
                raise WeightsError(
                    f"model {self.name}: the mirror's manifest is for model {manifest.model!r}"
                )
            self._check_free_space(manifest.total_bytes)

            def fill(staging: Path) -> Manifest:
                self._download_all(client, manifest, staging)
                return manifest

            provenance = {"source": "mirror", "url": self.base_url, "revision": self.revision}
            return self._install(fill, provenance)
        finally:
            client.close()

    def _download_all(self, client: MirrorClient, manifest: Manifest, staging: Path) -> None:
        download_checked(
            manifest,
            staging,
            lambda path, dest, progress: client.download(self.revision, path, dest, progress),
            progress=Progress(
                manifest.total_bytes, f"fetch {self.name}@{self.revision[:12]}", self.report
            ),
            workers=self.workers,
            where=f"model {self.name} revision {self.revision} from {self.base_url}",
            fix="Fix the mirror copy (or the pinned revision) and re-run.",
        )


Downloader = Callable[[str, Path, Progress], str]


def download_checked(
    manifest: Manifest,
    staging: Path,
    download: Downloader,
    *,
    progress: Progress,
    workers: int,
    where: str,
    fix: str,
) -> None:
    """Download every manifest file into staging, in parallel, each checked as it lands.

    A file that fails its size or sha256 check is deleted (a resume must not continue
    bad bytes); one whose download broke off stays, to be resumed. Every file's problem
    is reported, not only the first. A full disk stops everything at once.
    """
    problems: list[str] = []

    def one(entry: ManifestFile) -> None:
        dest = staging / entry.path
        if dest.is_file() and dest.stat().st_size > entry.size:
            dest.unlink()  # longer than the manifest says: not a prefix of the right file
        try:
            got = download(entry.path, dest, progress)
        except DiskFullError:
            raise
        except WeightsError as err:
            problems.append(f"{entry.path}: {err}")
            return
        size = dest.stat().st_size
        if size != entry.size:
            problems.append(f"{entry.path}: size {size}, expected {entry.size}")
            dest.unlink()
        elif got != entry.sha256:
            problems.append(f"{entry.path}: sha256 mismatch: expected {entry.sha256}, got {got}")
            dest.unlink()

    # Largest first, so one big file does not start last and run alone.
    ordered = sorted(manifest.files, key=lambda e: e.size, reverse=True)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        list(pool.map(one, ordered))
    if problems:
        raise WeightsError(
            f"{where}: "
            + "; ".join(sorted(problems))
            + f". Nothing was installed; the previous revision stays in place. {fix}"
        )
