"""The two upstream weights sources, hf and modelscope, each described once: its fetch class, its
fixture server (the real client talks to it over HTTP), repo, token, model files, the words of
its messages and what its requests must look like. ``tests/unit/test_weights_remote.py`` runs
the tests that hold for both against each; ``test_weights_hf.py`` and
``test_weights_modelscope.py`` hold what only one source does, with the helpers here."""

from __future__ import annotations

import os
import random
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import pytest

from tests.fixtures.fake_repo_server import FakeRepoServer
from tests.fixtures.hub_server import FakeHub
from tests.fixtures.modelscope_server import FakeModelScope
from vllm_fleet.weights.base import load_local_manifest, verify_dir
from vllm_fleet.weights.hf import HfFetch
from vllm_fleet.weights.modelscope import ModelScopeFetch
from vllm_fleet.weights.remote import RemoteFetch

WEIGHTS = "model.safetensors"
WEIGHTS_SIZE = 3_000_000

Server = TypeVar("Server", bound=FakeRepoServer[Any, Any])


def model_dir(tmp_path: Path) -> Path:
    return tmp_path / "srv" / "tiny"


def listing(tmp_path: Path) -> list[str]:
    """What is served: staging directories (kept for a resume) are not."""
    return sorted(
        p.name for p in model_dir(tmp_path).iterdir() if not p.name.startswith(".staging-")
    )


def assert_previous_serves(tmp_path: Path, old: str | None) -> None:
    """After a failed fetch: the revision current before it (old) is still current, served
    alone and whole; on a host that had none (old None), nothing is served."""
    if old is None:
        assert listing(tmp_path) == []
        return
    assert listing(tmp_path) == sorted(["current", old])
    assert os.readlink(model_dir(tmp_path) / "current") == old
    target = model_dir(tmp_path) / old
    assert verify_dir(target, load_local_manifest(target), full=True, workers=2) == []


def assert_untouched(tmp_path: Path, old: str | None) -> None:
    """After a fetch refused before any download: as assert_previous_serves, and on a host
    that had no revision, not even the model's directory."""
    if old is None:
        assert not model_dir(tmp_path).exists()
    else:
        assert_previous_serves(tmp_path, old)


@dataclass(frozen=True)
class Pins:
    """The revision a test fetches (new), and the one installed and current before (old;
    None on a host that had none)."""

    old: str | None
    new: str


class RemoteSource(ABC, Generic[Server]):
    """One upstream source, as its tests drive it."""

    name: ClassVar[str]  # the model's source= setting
    fetch_class: ClassVar[type[RemoteFetch]]
    repo: ClassVar[str]
    token: ClassVar[str]
    token_env: ClassVar[str]
    # Every variable of the host that the client reads: a test sets what it needs.
    client_env: ClassVar[tuple[str, ...]]
    # Loggers the client pins above DEBUG; a test opens them to see they never show a token.
    client_loggers: ClassVar[tuple[str, ...]] = ()
    # Modules whose import sets those loggers' levels (imported before a test opens them).
    client_modules: ClassVar[tuple[str, ...]] = ()
    branch: ClassVar[str]  # the repo's default branch
    model_type: ClassVar[str]
    extra_files: ClassVar[dict[str, bytes]] = {}
    not_pinned: ClassVar[str]  # how a refused revision's message goes on
    rejected: ClassVar[str]  # how the message for a wrong token goes on after "(401): "
    missing: ClassVar[str]  # how a listed file that is not there is named, after its path
    dropped: ClassVar[str]  # the file a test takes away from storage
    # allow_patterns that select every file but the weights.
    all_but_weights: ClassVar[tuple[str, ...]]

    def __repr__(self) -> str:
        return self.name

    def model_files(self, seed: int = 1) -> dict[str, bytes]:
        return {
            "config.json": b'{"model_type": "%s", "seed": %d}\n' % (self.model_type.encode(), seed),
            "tokenizer.json": b'{"version": "1.0", "model": {"type": "BPE"}}\n',
            WEIGHTS: random.Random(seed).randbytes(WEIGHTS_SIZE),
            **self.extra_files,
        }

    def clear_env(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Only what a test sets may reach the client: no token, endpoint or offline mode of
        the host."""
        for name in self.client_env:
            monkeypatch.delenv(name, raising=False)

    @abstractmethod
    def server(self) -> Server:
        """The source's fixture server for the repo, to start with ``with``."""

    @abstractmethod
    def commit(self, server: Server, seed: int = 1) -> str:
        """Commit model_files(seed) as the head of the repo's branch; its sha."""

    def fetch(self, server: Server, tmp_path: Path, revision: str, **kwargs: Any) -> RemoteFetch:
        kwargs.setdefault("endpoint", server.endpoint)
        return self.fetch_class(
            name="tiny",
            repo=self.repo,
            revision=revision,
            root=tmp_path / "srv",
            workers=3,
            **kwargs,
        )

    def install_previous(self, server: Server, tmp_path: Path) -> Pins:
        """A first revision installed and current; the test then fetches a second one."""
        old = self.commit(server, seed=1)
        self.fetch(server, tmp_path, old).run()
        return Pins(old, self.commit(server, seed=2))

    # The fixtures of a test module for this source alone (named by the name they get there).

    def env_fixture(self) -> Any:
        """An autouse fixture: clear_env for every test."""

        @pytest.fixture(autouse=True)
        def client_env(monkeypatch: pytest.MonkeyPatch) -> None:
            """The client reads none of the host's settings for it (RemoteSource.clear_env)."""
            self.clear_env(monkeypatch)

        return client_env

    def server_fixture(self) -> Any:
        """A fixture: the source's server, started for the test."""

        @pytest.fixture
        def started() -> Iterator[Server]:
            """The source's fixture server, started for the test and stopped after it."""
            with self.server() as server:
                yield server

        return started

    @abstractmethod
    def unknown_commit(self, sha: str) -> list[str]:
        """What the message for a commit the repo lacks must say."""

    @abstractmethod
    def check_one_fetch_requests(self, server: Server, sha: str) -> None:
        """The requests of one whole fetch of commit sha were the fewest, and at that commit."""

    @abstractmethod
    def weights_requests(self, server: Server) -> int:
        """How many requests read the weights (their metadata or their bytes)."""

    @abstractmethod
    def file_requests(self, server: Server) -> int:
        """How many requests read any file (its metadata or its bytes)."""

    @abstractmethod
    def check_authenticated(self, server: Server, log: str) -> None:
        """Every request that needed the token carried it, as the real client sends it, and
        none other did; log: what the loggers caught meanwhile."""


class HfSource(RemoteSource[FakeHub]):
    """The Hugging Face Hub, through huggingface_hub, against FakeHub and its CDN."""

    name = "hf"
    fetch_class = HfFetch
    repo = "org/tiny-llama"
    token = "hf_fixtureSecret0123456789abcdefXYZ"
    token_env = "HF_TOKEN"
    client_env = ("HF_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE")
    # huggingface_hub pins its own logger at WARNING.
    client_loggers = ("huggingface_hub",)
    # Its lazy imports configure that logger when the first module that logs is imported.
    client_modules = ("huggingface_hub.utils._http",)
    branch = "main"
    model_type = "llama"
    not_pinned = "pin a 40-hex commit sha (the full id in the Hub repo's history"
    rejected = "the Hub rejected HF_TOKEN"
    missing = "listed by the Hub at this commit but missing (404)"
    dropped = "tokenizer.json"
    all_but_weights = ("*.json",)

    def server(self) -> FakeHub:
        return FakeHub(self.repo)

    def commit(self, server: FakeHub, seed: int = 1) -> str:
        # The weights are an LFS file, as on the Hub: the Hub redirects their download to the CDN.
        return server.commit(self.model_files(seed), lfs=[WEIGHTS])

    def unknown_commit(self, sha: str) -> list[str]:
        return [f"unknown revision: the repo has no commit {sha}"]

    def check_one_fetch_requests(self, server: FakeHub, sha: str) -> None:
        # Metadata once; the LFS file came from the CDN after the Hub's redirect.
        assert server.count("hub", "GET", f"/api/models/{self.repo}/revision/{sha}") == 1
        assert server.count("cdn", "GET", "/lfs/") == 1
        assert server.count("hub", "GET", WEIGHTS) == 0

    def weights_requests(self, server: FakeHub) -> int:
        # The CDN serves nothing but the LFS file, the weights.
        return server.count(path=WEIGHTS) + server.count("cdn")

    def file_requests(self, server: FakeHub) -> int:
        return server.count(path="/resolve/") + server.count("cdn")

    def check_authenticated(self, server: FakeHub, log: str) -> None:
        # Sent to the Hub, never to the CDN the Hub redirects to.
        assert server.count("cdn") == 1
        assert {r.auth for r in server.requests if r.server == "cdn"} == {"none"}
        assert {r.auth for r in server.requests if r.server == "hub"} == {"valid"}
        assert "(authenticated: True)" in log  # the client's debug log did run


class ModelScopeSource(RemoteSource[FakeModelScope]):
    """ModelScope, through its HTTP API as the modelscope SDK speaks it, against FakeModelScope."""

    name = "modelscope"
    fetch_class = ModelScopeFetch
    repo = "org/tiny-qwen"
    token = "ms-fixtureSecret0123456789abcdefXYZ"
    token_env = "MODELSCOPE_API_TOKEN"
    client_env = ("MODELSCOPE_API_TOKEN", "MODELSCOPE_DOMAIN")
    branch = "master"
    model_type = "qwen2"
    extra_files: ClassVar[dict[str, bytes]] = {"sub/extra.txt": b"nested file\n"}
    not_pinned = "pin a 40-hex commit id (the full id in the ModelScope repo's history"
    rejected = "ModelScope rejected MODELSCOPE_API_TOKEN"
    missing = "listed at this commit but missing (404)"
    dropped = "sub/extra.txt"
    all_but_weights = ("*.json", "sub/")

    def server(self) -> FakeModelScope:
        return FakeModelScope(self.repo)

    def commit(self, server: FakeModelScope, seed: int = 1) -> str:
        return server.commit(self.model_files(seed))

    def unknown_commit(self, sha: str) -> list[str]:
        return [f"not found (404): revision {sha} not found", f"that the repo has commit {sha}"]

    def check_one_fetch_requests(self, server: FakeModelScope, sha: str) -> None:
        # One listing at the pinned commit, one download per file, each at the pinned commit.
        files = f"/api/v1/models/{self.repo}/repo/files?Revision={sha}&Recursive=True"
        assert server.count("GET", files) == 1
        downloads = [r.path for r in server.requests if "FilePath=" in r.path]
        assert len(downloads) == len(self.model_files())
        assert all(f"Revision={sha}&" in p for p in downloads)

    def weights_requests(self, server: FakeModelScope) -> int:
        return server.count(path=WEIGHTS)

    def file_requests(self, server: FakeModelScope) -> int:
        return server.count(path="FilePath=")

    def check_authenticated(self, server: FakeModelScope, log: str) -> None:
        # Every request carried it, as the m_session_id cookie, and nothing else did.
        assert server.requests
        assert {r.auth for r in server.requests} == {"valid"}
        assert all(
            "cookie" in r.headers and "authorization" not in r.headers for r in server.requests
        )


HF = HfSource()
MODELSCOPE = ModelScopeSource()
SOURCES: tuple[RemoteSource[Any], ...] = (HF, MODELSCOPE)
