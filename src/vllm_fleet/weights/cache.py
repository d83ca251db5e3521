"""Fetch a revision the fleet's cache host already fetched from upstream and verified."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import httpx

from vllm_fleet.weights.base import (
    MANIFEST_NAME,
    Progress,
    RevisionFetch,
    WeightsError,
    provenance_problems,
)
from vllm_fleet.weights.manifest import Manifest
from vllm_fleet.weights.mirror import download_checked, download_resumable


@dataclass(kw_only=True)
class CacheFetch(RevisionFetch):
    """A revision the fleet's cache host fetched from upstream (hf, modelscope) once.

    The cache host serves its models root over HTTP: ``<base_url>/<name>/<revision>/``
    holds the files and the manifest it wrote after verifying them against the
    upstream's hashes. This host downloads from there and checks every byte against
    that manifest, and the manifest's provenance against what the inventory pins.
    """

    base_url: str
    upstream: dict[str, object]

    def wanted(self) -> dict[str, object]:
        return self.upstream

    def _fetch_into_place(self) -> Manifest:
        url = f"{self.base_url.rstrip('/')}/{self.name}/{self.revision}"
        client = httpx.Client(timeout=60.0, follow_redirects=True)
        try:
            try:
                response = client.get(f"{url}/{MANIFEST_NAME}")
                response.raise_for_status()
                stored = json.loads(response.content)
                manifest = Manifest.model_validate(stored)
            except (httpx.HTTPError, ValueError) as err:
                raise WeightsError(
                    f"model {self.name}: cannot read the cache host's manifest "
                    f"{url}/{MANIFEST_NAME}: {err}; is the cache play done and its server up?"
                ) from err
            problems = provenance_problems(stored, self.upstream)
            if problems:
                raise WeightsError(
                    f"model {self.name}: the cache host holds a different copy at {url}: "
                    + "; ".join(problems)
                    + ". Re-run the cache play (site.yml --tags weights) and then this host."
                )
            self._check_free_space(manifest.total_bytes)

            def fill(staging: Path) -> Manifest:
                download_checked(
                    manifest,
                    staging,
                    lambda path, dest, progress: download_resumable(
                        client, f"{url}/{path}", dest, progress
                    ),
                    progress=Progress(
                        manifest.total_bytes,
                        f"fetch {self.name}@{self.revision[:12]} from cache",
                        self.report,
                    ),
                    workers=self.workers,
                    where=f"model {self.name} revision {self.revision} from the cache {url}",
                    fix="Check the cache host's copy (vllm-fleet weights verify --full), re-run.",
                )
                return manifest

            return self._install(fill, {**self.upstream, "revision": self.revision, "via": url})
        finally:
            client.close()
