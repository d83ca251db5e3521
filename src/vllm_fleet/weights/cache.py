"""Fetch a revision the fleet's cache host already fetched from upstream and verified."""

from __future__ import annotations

import hashlib
import hmac
import json
import ssl
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

    The manifest itself is pinned: ``manifest_sha256`` is what the cache host's own copy
    hashes to, read over the controller's connection to the cache host (model_weights
    stats it there), so a manifest altered on the way, or served by another host that
    took the cache's address, is refused before any file is trusted. The cache serves
    only clients that present its read ``token`` (gated models stay with the fleet), over
    HTTPS with a certificate from the fleet CA, ``ca_cert``, the only one trusted.
    """

    base_url: str
    upstream: dict[str, object]
    manifest_sha256: str
    token: str = ""
    ca_cert: str = ""

    def _verify(self) -> ssl.SSLContext | bool:
        if not self.base_url.startswith("https://"):
            return True
        if not self.ca_cert:
            raise WeightsError(
                f"model {self.name}: the cache {self.base_url} speaks HTTPS and no CA was "
                "given to check it with: model_weights passes the fleet CA's (host_tls)"
            )
        try:
            # The fleet CA and nothing else: not the system's, not certifi's.
            return ssl.create_default_context(cafile=self.ca_cert)
        except (OSError, ssl.SSLError) as err:
            raise WeightsError(
                f"model {self.name}: cannot read the fleet CA {self.ca_cert}: {err}"
            ) from err

    def wanted(self) -> dict[str, object]:
        return self.upstream

    def _fetch_into_place(self) -> Manifest:
        url = f"{self.base_url.rstrip('/')}/{self.name}/{self.revision}"
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        # Redirects stay off: the token goes to the cache host and nowhere else.
        client = httpx.Client(timeout=60.0, headers=headers, verify=self._verify())
        try:
            try:
                response = client.get(f"{url}/{MANIFEST_NAME}")
                response.raise_for_status()
            except httpx.HTTPError as err:
                hint = (
                    "the cache refused this host's token (fleet_model_cache_token)"
                    if isinstance(err, httpx.HTTPStatusError)
                    and err.response.status_code in (401, 403)
                    else "is the cache play done and its server up?"
                )
                raise WeightsError(
                    f"model {self.name}: cannot read the cache host's manifest "
                    f"{url}/{MANIFEST_NAME}: {err}; {hint}"
                ) from err
            got = hashlib.sha256(response.content).hexdigest()
            if not hmac.compare_digest(got, self.manifest_sha256.lower()):
                raise WeightsError(
                    f"model {self.name}: the manifest served at {url}/{MANIFEST_NAME} has "
                    f"sha256 {got}, and the cache host's own copy {self.manifest_sha256}: it "
                    "changed on the way, or another host answers at the cache's address; "
                    "nothing was installed. Check the network path to the cache host, re-run."
                )
            try:
                stored = json.loads(response.content)
                manifest = Manifest.model_validate(stored)
            except ValueError as err:
                raise WeightsError(
                    f"model {self.name}: the cache host's manifest {url}/{MANIFEST_NAME} "
                    f"is unreadable: {err}"
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
