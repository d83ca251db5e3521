"""What the two upstream sources (the Hugging Face Hub and ModelScope) share: a repo at a
pinned commit from an http(s) endpoint, with allow/ignore patterns, and a token that must
never show in a message."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import ClassVar, TypeVar
from urllib.parse import urlsplit, urlunsplit

from vllm_fleet.weights.base import RevisionFetch, WeightsError
from vllm_fleet.weights.manifest import Manifest, ManifestFile
from vllm_fleet.weights.pins import revision_problem

Item = TypeVar("Item")


def public_url(url: str) -> str:
    """url without any user:password part, fit to record."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))


def scrub_token(text: str, token: str | None, variable: str) -> str:
    """text with the token replaced by the name of the variable it came from."""
    return text.replace(token, f"<{variable}>") if token else text


def sorted_patterns(value: str | Sequence[str] | None) -> list[str] | None:
    """Patterns as one sorted list (a lone string is one pattern), so equal settings compare
    equal in the installed record; None stays None (no filter)."""
    if value is None:
        return None
    return sorted([value] if isinstance(value, str) else value)


@dataclass(kw_only=True)
class RemoteFetch(RevisionFetch):
    """``repo`` at commit ``revision`` from an upstream ``endpoint``."""

    SOURCE: ClassVar[str]
    TOKEN_ENV: ClassVar[str]
    ENDPOINT_EXAMPLE: ClassVar[str]  # named in the message for an endpoint that is no URL

    repo: str
    endpoint: str | None = None
    allow_patterns: str | Sequence[str] | None = None
    ignore_patterns: str | Sequence[str] | None = None
    endpoint_url: str = field(init=False, default="")

    def __post_init__(self) -> None:
        problem = revision_problem(self.name, self.SOURCE, self.revision)
        if problem:
            raise WeightsError(problem)
        super().__post_init__()
        self.check_repo()
        self.endpoint_url = (self.endpoint or self.default_endpoint()).rstrip("/")
        if urlsplit(self.endpoint_url).scheme not in ("http", "https"):
            raise WeightsError(
                f"model {self.name}: endpoint {public_url(self.endpoint_url)!r} is not an "
                f"http(s) URL; set it to {self.ENDPOINT_EXAMPLE}"
            )
        self.allow_patterns = sorted_patterns(self.allow_patterns)
        self.ignore_patterns = sorted_patterns(self.ignore_patterns)

    def default_endpoint(self) -> str:
        raise NotImplementedError

    def check_repo(self) -> None:
        """Refuse a repo id the source cannot have (nothing by default)."""

    @property
    def where(self) -> str:
        return f"{self.repo}@{self.revision} from {public_url(self.endpoint_url)}"

    def wanted(self) -> dict[str, object]:
        # What decides which bytes land here; the endpoint does not (a mirror has the same).
        return {
            "source": self.SOURCE,
            "repo": self.repo,
            "allow_patterns": self.allow_patterns,
            "ignore_patterns": self.ignore_patterns,
        }

    def provenance(self) -> dict[str, object]:
        """What the installed manifest records of where the bytes came from."""
        return {
            **self.wanted(),
            "revision": self.revision,
            "endpoint": public_url(self.endpoint_url),
        }

    def token(self) -> str | None:
        return os.environ.get(self.TOKEN_ENV, "").strip() or None

    def _fetch_each(
        self,
        items: Sequence[Item],
        size: Callable[[Item], int],
        one: Callable[[Item], ManifestFile | str],
    ) -> Manifest:
        """Every file through ``one`` (its manifest entry, or the reason it failed), largest
        first so one big file does not start last and run alone, ``workers`` at a time; every
        failure named at once, and nothing installed when there is one."""
        problems: list[str] = []
        entries: list[ManifestFile] = []

        def run(item: Item) -> None:
            result = one(item)
            (problems if isinstance(result, str) else entries).append(result)  # type: ignore[arg-type]

        with ThreadPoolExecutor(max_workers=max(1, self.workers)) as pool:
            list(pool.map(run, sorted(items, key=size, reverse=True)))
        if problems:
            raise WeightsError(
                f"model {self.name}: {self.where}: "
                + "; ".join(sorted(problems))
                + ". Nothing was installed; the previous revision stays in place. "
                "Fix the repo, the endpoint or the pinned revision and re-run."
            )
        return Manifest(model=self.name, files=entries)
