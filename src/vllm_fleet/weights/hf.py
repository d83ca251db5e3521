"""Fetch a Hugging Face Hub repo at a pinned commit into ``<root>/<name>/<commit>/``, verified.

What to expect comes from the Hub's own file metadata at that commit
(``model_info(..., files_metadata=True)``): the LFS sha256 and size for large files, the git
blob sha1 and size for the rest. huggingface_hub downloads each file into the staging
directory; it checks sizes only, never content, so every file is hashed here (sha256 for our
manifest, plus the git blob sha1 for non-LFS files) and compared before the shared staging
install of ``weights.RevisionFetch`` renames the revision into place.

The token comes from ``HF_TOKEN`` in the environment, is handed to huggingface_hub and to
nothing else: it is never logged, never recorded, and scrubbed from every error message.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, cast

from vllm_fleet.weights.base import (
    MANIFEST_NAME,
    STAMP_NAME,
    Progress,
    WeightsError,
    raise_if_disk_full,
    remove_tree,
)
from vllm_fleet.weights.hashing import BLOCK_SIZE
from vllm_fleet.weights.manifest import Manifest, ManifestFile
from vllm_fleet.weights.remote import RemoteFetch, scrub_token

DEFAULT_ENDPOINT = "https://huggingface.co"
TOKEN_ENV = "HF_TOKEN"
# huggingface_hub keeps per-file download metadata and locks under <local_dir>/.cache/huggingface;
# it is the client's bookkeeping, not part of the model, and is removed before install.
CLIENT_CACHE = ".cache"
METADATA_TIMEOUT = 60.0
CONSISTENCY_RE = re.compile(r"should be of size (\d+) but has size (\d+)")


@dataclass(frozen=True)
class Expected:
    """One file as the Hub describes it at the pinned commit."""

    path: str
    size: int
    sha256: str | None  # LFS files: the content's sha256
    blob_sha1: str | None  # regular files: git's blob id


@dataclass(frozen=True)
class Digests:
    size: int
    sha256: str
    blob_sha1: str


def hash_file(path: Path, progress: Callable[[int], None] | None = None) -> Digests:
    """sha256 and git blob sha1 of a file, in one read."""
    sha256 = hashlib.sha256()
    blob = hashlib.sha1()
    with path.open("rb", buffering=0) as handle:
        size = os.fstat(handle.fileno()).st_size
        blob.update(b"blob %d\0" % size)
        while chunk := handle.read(BLOCK_SIZE):
            sha256.update(chunk)
            blob.update(chunk)
            if progress is not None:
                progress(len(chunk))
    return Digests(size=size, sha256=sha256.hexdigest(), blob_sha1=blob.hexdigest())


def mismatch(expected: Expected, got: Digests) -> str | None:
    """The problem with a downloaded file, or None when it is what the Hub says."""
    if got.size != expected.size:
        return f"{expected.path}: size mismatch: expected {expected.size}, got {got.size}"
    if expected.sha256 is not None and got.sha256 != expected.sha256:
        return f"{expected.path}: sha256 mismatch: expected {expected.sha256}, got {got.sha256}"
    if expected.blob_sha1 is not None and got.blob_sha1 != expected.blob_sha1:
        return (
            f"{expected.path}: git blob sha1 mismatch: "
            f"expected {expected.blob_sha1}, got {got.blob_sha1}"
        )
    return None


def _scrub(text: str, token: str | None) -> str:
    return scrub_token(text, token, TOKEN_ENV)


def _first_line(err: BaseException, token: str | None) -> str:
    lines = [line for line in str(err).splitlines() if line.strip()]
    return _scrub(f"{type(err).__name__}: {lines[0] if lines else ''}", token)


def _http_status(err: BaseException) -> int | None:
    """The HTTP status behind err, looking through the causes huggingface_hub chains."""
    from huggingface_hub.errors import HfHubHTTPError

    seen: BaseException | None = err
    for _ in range(5):
        if seen is None:
            return None
        if isinstance(seen, HfHubHTTPError) and seen.response is not None:
            return seen.response.status_code
        seen = seen.__cause__ or seen.__context__
    return None


def _progress_bar(progress: Progress) -> type:
    """A stand-in for tqdm that huggingface_hub's http_get feeds: bytes go to our Progress."""

    class _Bar:
        def __init__(self, *_args: object, **_kwargs: object) -> None:
            pass

        def __enter__(self) -> _Bar:
            return self

        def __exit__(self, *_exc: object) -> None:
            return None

        def update(self, n: float | None = 1) -> None:
            progress.add(int(n or 0))

    return _Bar


def _require_client(name: str) -> None:
    # The agent venv installs its lock with --no-deps: a lock without the client must
    # fail here, worded, not as an ImportError halfway through.
    try:
        import huggingface_hub  # noqa: F401
    except ImportError as err:
        raise WeightsError(
            f"model {name}: the hf source needs huggingface_hub==2.4.0 in this venv ({err}); "
            "add it and its dependencies to the agent's lock (catalog/locks/agent-deps.lock)"
        ) from None


def forget_download(staging: Path, path: str) -> None:
    """Delete a staged file that failed its check, and huggingface_hub's record of it (which
    would otherwise make the next run trust the bad file instead of resuming cleanly)."""
    (staging / path).unlink(missing_ok=True)
    metadata = staging / CLIENT_CACHE / "huggingface" / "download" / f"{path}.metadata"
    metadata.unlink(missing_ok=True)


@dataclass(kw_only=True)
class HfFetch(RemoteFetch):
    """``repo`` at commit ``revision`` from a Hub ``endpoint`` (default: HF_ENDPOINT, then the Hub)."""

    SOURCE = "hf"
    TOKEN_ENV = TOKEN_ENV
    ENDPOINT_EXAMPLE = "the Hub or a Hub mirror, like https://huggingface.co"

    def default_endpoint(self) -> str:
        return os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT

    def _fetch_into_place(self) -> Manifest:
        _require_client(self.name)
        token = self.token()
        expected = self._expected_files(token)
        self._check_free_space(sum(e.size for e in expected))
        return self._install(
            lambda staging: self._download_all(expected, staging, token), self.provenance()
        )

    # --- the Hub's file metadata ---------------------------------------------------------

    def _expected_files(self, token: str | None) -> list[Expected]:
        from huggingface_hub import HfApi
        from huggingface_hub.utils import filter_repo_objects

        api = HfApi(endpoint=self.endpoint_url)
        try:
            info = api.model_info(
                self.repo,
                revision=self.revision,
                files_metadata=True,
                token=token or False,
                timeout=METADATA_TIMEOUT,
            )
        except Exception as err:  # every failure becomes one operator message, token-free
            raise WeightsError(self._metadata_error(err, token)) from None
        if info.sha != self.revision:
            raise WeightsError(
                f"model {self.name}: {self.where}: the endpoint answered for commit {info.sha}; "
                "it does not serve the pinned commit faithfully: fix the endpoint (mirror)"
            )
        siblings = list(
            filter_repo_objects(
                info.siblings or [],
                allow_patterns=cast(Any, self.allow_patterns),
                ignore_patterns=cast(Any, self.ignore_patterns),
                key=lambda s: s.rfilename,
            )
        )
        if not siblings:
            raise WeightsError(
                f"model {self.name}: {self.where}: no file matches allow_patterns="
                f"{self.allow_patterns} ignore_patterns={self.ignore_patterns}; fix the patterns"
            )
        return [self._expected(s) for s in siblings]

    def _expected(self, sibling: Any) -> Expected:
        path = sibling.rfilename
        pure = PurePosixPath(path)
        if pure.is_absolute() or ".." in pure.parts or path in (MANIFEST_NAME, STAMP_NAME):
            raise WeightsError(
                f"model {self.name}: {self.where}: refusing repo path {path!r} "
                "(outside the model directory or clashing with vllm-fleet's own files)"
            )
        if sibling.lfs is not None:
            return Expected(path, sibling.lfs.size, sibling.lfs.sha256, None)
        if sibling.size is None or sibling.blob_id is None:
            raise WeightsError(
                f"model {self.name}: {self.where}: the endpoint gave no size or blob id for "
                f"{path}, so it cannot be verified; use an endpoint that serves files metadata"
            )
        return Expected(path, sibling.size, None, sibling.blob_id)

    def _metadata_error(self, err: BaseException, token: str | None) -> str:
        from huggingface_hub.errors import (
            GatedRepoError,
            HFValidationError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        status = _http_status(err)
        # First match wins: the most specific reason the operator can act on.
        reasons = (
            (
                isinstance(err, HFValidationError),
                f"fleet_models.{self.name}.repo={self.repo} is not a Hub repo id; "
                "use org/name as on the Hub",
            ),
            (
                isinstance(err, RevisionNotFoundError),
                f"unknown revision: the repo has no commit {self.revision}; "
                "pin a commit from the repo's history",
            ),
            (status == 401, self._unauthorized(token)),
            (
                isinstance(err, GatedRepoError),
                f"gated repo, access denied ({status}): accept the repo's conditions on the Hub "
                "with the account of HF_TOKEN",
            ),
            (
                isinstance(err, RepositoryNotFoundError),
                f"repo not found ({status}); check fleet_models.{self.name}.repo, "
                "or set HF_TOKEN if it is private",
            ),
            (status is not None, f"the Hub answered {status}: {_first_line(err, token)}"),
            (True, f"cannot read the file list: {_first_line(err, token)}"),
        )
        reason = next(text for hit, text in reasons if hit)
        return f"model {self.name}: {self.where}: {reason}"

    def _unauthorized(self, token: str | None) -> str:
        if token:
            return (
                "unauthorized (401): the Hub rejected HF_TOKEN; "
                "give the fetch a valid token with read access to the repo"
            )
        return (
            "unauthorized (401): the repo is private or gated and HF_TOKEN is not set; "
            "set HF_TOKEN in the fetch's environment"
        )

    # --- downloads -----------------------------------------------------------------------

    def _download_all(self, expected: list[Expected], staging: Path, token: str | None) -> Manifest:
        from huggingface_hub import hf_hub_download

        progress = Progress(
            sum(e.size for e in expected), f"fetch {self.name}@{self.revision[:12]}", self.report
        )
        bar = _progress_bar(progress)

        def one(item: Expected) -> ManifestFile | str:
            try:
                hf_hub_download(
                    self.repo,
                    item.path,
                    revision=self.revision,
                    local_dir=staging,
                    # An empty cache inside staging: never reuse (or trust) a host-wide cache.
                    cache_dir=staging / CLIENT_CACHE / "huggingface" / "hub",
                    endpoint=self.endpoint_url,
                    token=token or False,
                    tqdm_class=cast(Any, bar),
                )
            except Exception as err:  # each file's failure is reported, not just the first
                if isinstance(err, OSError):
                    raise_if_disk_full(err, item.path, staging)
                return self._download_problem(item, err, token)
            # huggingface_hub checked the size at most; the content is checked here.
            got = hash_file(staging / item.path)
            problem = mismatch(item, got)
            if problem is not None:
                forget_download(staging, item.path)
                return problem
            return ManifestFile(path=item.path, size=got.size, sha256=got.sha256)

        manifest = self._fetch_each(expected, lambda e: e.size, one)
        remove_tree(staging / CLIENT_CACHE)
        return manifest

    def _download_problem(self, item: Expected, err: BaseException, token: str | None) -> str:
        from huggingface_hub.errors import RemoteEntryNotFoundError

        status = _http_status(err)
        if isinstance(err, RemoteEntryNotFoundError) or status == 404:
            return f"{item.path}: listed by the Hub at this commit but missing (404)"
        if status == 401:
            return f"{item.path}: {self._unauthorized(token)}"
        short = CONSISTENCY_RE.search(str(err))
        if short is not None:
            return (
                f"{item.path}: size mismatch: expected {short.group(1)}, got {short.group(2)} "
                "(the download ended early)"
            )
        detail = f"HTTP {status}: " if status is not None else ""
        return f"{item.path}: download failed: {detail}{_first_line(err, token)}"
