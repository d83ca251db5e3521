"""Fetch a ModelScope model repo at a pinned commit into ``<root>/<name>/<commit>/``, verified.

Spoken with httpx against the HTTP API as the modelscope SDK calls it (``modelscope/hub/api.py``
``HubApi.get_model_files`` and ``file_download.get_file_download_url``); the SDK itself is not
used:

- the file list: ``GET {endpoint}/api/v1/models/{repo}/repo/files?Revision={rev}&Recursive=True``
  answers ``{"Code": 200, "Data": {"Files": [...]}, ...}``; each file is ``{"Path", "Type":
  "blob", "Size", "Sha256", "Revision", ...}`` (``"tree"`` for a directory);
- a file: ``GET {endpoint}/api/v1/models/{repo}/repo?Revision={rev}&FilePath={path}``.

The pin. A ModelScope ``Revision`` may be a branch, a tag or a commit id; branches move and tags
can be deleted and re-created, so only a full 40-hex commit id is accepted as
``fleet_models.<name>.revision``, and the listing and every download ask for that commit. The
per-file ``Revision`` of the listing is the commit that last *changed* the file (the SDK's cache
keys files on it), not the commit listed, so it cannot be required to equal the pin; it is
required to be a full commit id (a listing that names a branch or nothing there is not a
commit's tree and is refused). What pins the bytes is that listing at the commit: every file's
``Size`` and ``Sha256`` are checked while it downloads (hashed as it is written), so a server
that serves other bytes for the pinned commit is caught file by file.

The endpoint is the ``endpoint`` argument, else ``MODELSCOPE_DOMAIN`` from the environment (the
SDK's variable: a host name, to which ``https://`` is prefixed as the SDK does; a value with a
scheme is taken as the URL), else https://www.modelscope.cn.

The token comes from ``MODELSCOPE_API_TOKEN`` in the environment (the SDK's variable) and is
sent as the SDK sends it, the ``m_session_id`` cookie, on requests to the endpoint only (httpx
drops it on a redirect to another host). It is never logged, never recorded, and scrubbed from
every error message.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath
from typing import Any

import httpx

from vllm_fleet.weights.base import (
    MANIFEST_NAME,
    STAMP_NAME,
    Progress,
    WeightsError,
    raise_if_disk_full,
    write_hashed,
)
from vllm_fleet.weights.hashing import BLOCK_SIZE
from vllm_fleet.weights.manifest import Manifest, ManifestFile
from vllm_fleet.weights.pins import is_commit
from vllm_fleet.weights.remote import RemoteFetch, scrub_token

SHA256_RE = re.compile(r"[0-9a-f]{64}")
DEFAULT_ENDPOINT = "https://www.modelscope.cn"
DOMAIN_ENV = "MODELSCOPE_DOMAIN"
TOKEN_ENV = "MODELSCOPE_API_TOKEN"
SESSION_COOKIE = "m_session_id"
# The SDK drops these from every listing: git's own bookkeeping, not the model.
GIT_META = frozenset({".gitignore", ".gitattributes"})
METADATA_TIMEOUT = 60.0
DOWNLOAD_TIMEOUT = httpx.Timeout(60.0, read=300.0)


@dataclass(frozen=True)
class Listed:
    """One file as the listing describes it at the pinned commit."""

    path: str
    size: int
    sha256: str
    commit: str  # the commit that last changed it


def selected(path: str, allow: Sequence[str] | None, ignore: Sequence[str] | None) -> bool:
    """huggingface_hub's filter_repo_objects rule: fnmatch; a pattern ending in / is a folder."""

    def wild(pattern: str) -> str:
        return pattern + "*" if pattern.endswith("/") else pattern

    if allow is not None and not any(fnmatch(path, wild(p)) for p in allow):
        return False
    return not (ignore is not None and any(fnmatch(path, wild(p)) for p in ignore))


def _scrub(text: str, token: str | None) -> str:
    return scrub_token(text, token, TOKEN_ENV)


@dataclass(kw_only=True)
class ModelScopeFetch(RemoteFetch):
    """``repo`` at commit ``revision`` from a ModelScope ``endpoint``."""

    SOURCE = "modelscope"
    TOKEN_ENV = TOKEN_ENV
    ENDPOINT_EXAMPLE = "ModelScope or a mirror, like https://www.modelscope.cn"

    def default_endpoint(self) -> str:
        domain = os.environ.get(DOMAIN_ENV, "").strip()
        if not domain:
            return DEFAULT_ENDPOINT
        return domain if "://" in domain else f"https://{domain}"

    def check_repo(self) -> None:
        if self.repo.count("/") != 1 or not all(self.repo.split("/")):
            raise WeightsError(
                f"fleet_models.{self.name}.repo={self.repo} is not a ModelScope model id; "
                "use owner/name as on ModelScope"
            )

    def _fetch_into_place(self) -> Manifest:
        token = self.token()
        headers = {"Cookie": f"{SESSION_COOKIE}={token}"} if token else {}
        client = httpx.Client(timeout=DOWNLOAD_TIMEOUT, follow_redirects=True, headers=headers)
        try:
            listed = self._listing(client, token)
            self._check_free_space(sum(f.size for f in listed))
            return self._install(
                lambda staging: self._download_all(client, listed, staging, token),
                self.provenance(),
            )
        finally:
            client.close()

    # --- the file listing ----------------------------------------------------------------

    def _listing(self, client: httpx.Client, token: str | None) -> list[Listed]:
        url = f"{self.endpoint_url}/api/v1/models/{self.repo}/repo/files"
        params = {"Revision": self.revision, "Recursive": "True"}
        try:
            response = client.get(url, params=params, timeout=METADATA_TIMEOUT)
        except httpx.HTTPError as err:
            raise WeightsError(
                f"model {self.name}: {self.where}: cannot read the file list: "
                + _scrub(f"{type(err).__name__}: {err}", token)
            ) from None
        body = self._json(response)
        if response.status_code != 200 or body.get("Code") != 200:
            raise WeightsError(
                f"model {self.name}: {self.where}: {self._refusal(response, body, token)}"
            )
        try:
            entries = body["Data"]["Files"] or []
        except (KeyError, TypeError):
            raise WeightsError(
                f"model {self.name}: {self.where}: the file list has no Data.Files; "
                "the endpoint does not speak the ModelScope API"
            ) from None
        listed = [
            self._listed(entry)
            for entry in entries
            if entry.get("Type") != "tree" and entry.get("Name") not in GIT_META
        ]
        chosen = [
            item
            for item in listed
            if selected(item.path, self.allow_patterns, self.ignore_patterns)
        ]
        if not chosen:
            raise WeightsError(
                f"model {self.name}: {self.where}: no file matches allow_patterns="
                f"{self.allow_patterns} ignore_patterns={self.ignore_patterns}; fix the patterns"
            )
        return chosen

    def _listed(self, entry: dict[str, Any]) -> Listed:
        path = entry.get("Path")
        if not isinstance(path, str):
            raise WeightsError(f"model {self.name}: {self.where}: a listed file has no Path")
        pure = PurePosixPath(path)
        if (
            pure.is_absolute()
            or ".." in pure.parts
            or path in ("", ".")
            or path in (MANIFEST_NAME, STAMP_NAME)
        ):
            raise WeightsError(
                f"model {self.name}: {self.where}: refusing repo path {path!r} "
                "(outside the model directory or clashing with vllm-fleet's own files)"
            )
        size, sha256, commit = entry.get("Size"), entry.get("Sha256"), entry.get("Revision")
        if not isinstance(size, int) or size < 0 or not SHA256_RE.fullmatch(str(sha256 or "")):
            raise WeightsError(
                f"model {self.name}: {self.where}: the file list gives no usable Size and Sha256 "
                f"for {path}, so it cannot be verified; use an endpoint that serves them"
            )
        if not is_commit(commit):
            raise WeightsError(
                f"model {self.name}: {self.where}: the file list names revision {commit!r} for "
                f"{path}, not a commit id; it is not the pinned commit's tree: "
                "fix the endpoint (mirror)"
            )
        return Listed(path=path, size=size, sha256=str(sha256), commit=str(commit))

    @staticmethod
    def _json(response: httpx.Response) -> dict[str, Any]:
        try:
            body = response.json()
        except ValueError:
            return {}
        return body if isinstance(body, dict) else {}

    def _refusal(self, response: httpx.Response, body: dict[str, Any], token: str | None) -> str:
        status = response.status_code
        said = _scrub(str(body.get("Message") or response.reason_phrase), token)
        if status in (401, 403):
            if token:
                return (
                    f"unauthorized ({status}): ModelScope rejected {TOKEN_ENV}; give the fetch "
                    "a valid access token with read access to the repo"
                )
            return (
                f"unauthorized ({status}): the repo is private or needs a login and "
                f"{TOKEN_ENV} is not set; set {TOKEN_ENV} in the fetch's environment"
            )
        if status == 404:
            return (
                f"not found (404): {said}; check fleet_models.{self.name}.repo and that the "
                f"repo has commit {self.revision}, or set {TOKEN_ENV} if it is private"
            )
        return f"the endpoint answered {status}, code {body.get('Code')!r}: {said}"

    # --- downloads -----------------------------------------------------------------------

    def _download_all(
        self, client: httpx.Client, listed: list[Listed], staging: Path, token: str | None
    ) -> Manifest:
        progress = Progress(
            sum(f.size for f in listed), f"fetch {self.name}@{self.revision[:12]}", self.report
        )

        def one(item: Listed) -> ManifestFile | str:
            problem = self._download(client, item, staging / item.path, progress, token)
            if problem is not None:
                return problem
            return ManifestFile(path=item.path, size=item.size, sha256=item.sha256)

        return self._fetch_each(listed, lambda f: f.size, one)

    def _download(
        self,
        client: httpx.Client,
        item: Listed,
        dest: Path,
        progress: Progress,
        token: str | None,
    ) -> str | None:
        """Stream one file into dest, hashing as it is written; the problem, or None."""
        url = f"{self.endpoint_url}/api/v1/models/{self.repo}/repo"
        params = {"Revision": self.revision, "FilePath": item.path}
        digest = hashlib.sha256()
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            with client.stream("GET", url, params=params) as response:
                if response.status_code != 200:
                    response.read()
                    return self._download_refusal(item, response, token)
                with dest.open("wb") as out:
                    size = write_hashed(response.iter_bytes(BLOCK_SIZE), out, digest, progress)
        except httpx.HTTPError as err:
            detail = _scrub(f"{type(err).__name__}: {err}", token)
            return f"{item.path}: download failed: {detail}"
        except OSError as err:
            raise_if_disk_full(err, item.path, dest)
            raise WeightsError(f"{item.path}: cannot write {dest}: {err.strerror}") from err
        got = digest.hexdigest()
        problem = None
        if size != item.size:
            problem = f"{item.path}: size mismatch: expected {item.size}, got {size}"
        elif got != item.sha256:
            problem = f"{item.path}: sha256 mismatch: expected {item.sha256}, got {got}"
        if problem is not None:
            dest.unlink()  # a bad file is not kept in staging
        return problem

    def _download_refusal(self, item: Listed, response: httpx.Response, token: str | None) -> str:
        status = response.status_code
        if status == 404:
            return f"{item.path}: listed at this commit but missing (404)"
        if status in (401, 403):
            return f"{item.path}: {self._refusal(response, self._json(response), token)}"
        said = _scrub(str(self._json(response).get("Message") or response.reason_phrase), token)
        return f"{item.path}: download failed: HTTP {status}: {said}"
