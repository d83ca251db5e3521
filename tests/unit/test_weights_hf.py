"""The hf weights source against a local Hub fixture that the real huggingface_hub talks to."""

import hashlib
import json
import logging
import os
import random
import stat
import sys

import pytest

from tests.fixtures.hub_server import FakeHub, git_blob_sha1
from vllm_fleet.weights.base import (
    MANIFEST_NAME,
    STAMP_NAME,
    WeightsError,
    load_local_manifest,
    verify_dir,
)
from vllm_fleet.weights.hf import HfFetch

REPO = "org/tiny-llama"
TOKEN = "hf_fixtureSecret0123456789abcdefXYZ"
WEIGHTS_SIZE = 3_000_000


def model_files(seed: int) -> dict[str, bytes]:
    return {
        "config.json": b'{"model_type": "llama", "seed": %d}\n' % seed,
        "tokenizer.json": b'{"version": "1.0", "model": {"type": "BPE"}}\n',
        "model.safetensors": random.Random(seed).randbytes(WEIGHTS_SIZE),
    }


@pytest.fixture(autouse=True)
def hub_env(monkeypatch):
    # Only what a test sets may reach the client: no token, endpoint or offline mode of the host.
    for name in ("HF_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def hub():
    with FakeHub(REPO) as server:
        yield server


def commit(hub, seed=1):
    return hub.commit(model_files(seed), lfs=["model.safetensors"])


def fetch(hub, tmp_path, revision, **kwargs):
    kwargs.setdefault("endpoint", hub.endpoint)
    return HfFetch(
        name="tiny", repo=REPO, revision=revision, root=tmp_path / "srv", workers=3, **kwargs
    )


def model_dir(tmp_path):
    return tmp_path / "srv" / "tiny"


def listing(tmp_path):
    """What is served: staging directories (kept for a resume) are not."""
    return sorted(
        p.name for p in model_dir(tmp_path).iterdir() if not p.name.startswith(".staging-")
    )


def test_good_fetch_installs_verified_files_manifest_stamp_and_current(hub, tmp_path):
    sha = commit(hub)
    progress = []
    result = fetch(hub, tmp_path, sha, report=progress.append).run()
    target = model_dir(tmp_path) / sha
    files = model_files(1)
    assert result.changed
    assert result.files == 3
    assert result.bytes == sum(len(b) for b in files.values())
    for path, data in files.items():
        assert (target / path).read_bytes() == data
        assert stat.S_IMODE((target / path).stat().st_mode) == 0o444
    manifest = load_local_manifest(target)
    assert {(f.path, f.size, f.sha256) for f in manifest.files} == {
        (p, len(b), hashlib.sha256(b).hexdigest()) for p, b in files.items()
    }
    record = json.loads((target / MANIFEST_NAME).read_text())
    assert record["source"] == "hf"
    assert record["repo"] == REPO
    assert record["revision"] == sha
    assert record["endpoint"] == hub.endpoint
    assert (target / STAMP_NAME).is_file()
    assert verify_dir(target, manifest, full=True, workers=2) == []
    # huggingface_hub's local_dir bookkeeping is not part of the model.
    assert sorted(p.name for p in target.iterdir()) == sorted([*files, MANIFEST_NAME, STAMP_NAME])
    assert os.readlink(model_dir(tmp_path) / "current") == sha
    assert listing(tmp_path) == sorted(["current", sha])
    # Metadata once; the LFS file came from the CDN after the Hub's redirect.
    assert hub.count("hub", "GET", f"/api/models/{REPO}/revision/{sha}") == 1
    assert hub.count("cdn", "GET", "/lfs/") == 1
    assert hub.count("hub", "GET", "model.safetensors") == 0
    # The client's byte counts reach our progress report (through its tqdm_class hook).
    assert progress[-1].startswith(f"fetch tiny@{sha[:12]}: 3/3 MB")


def test_second_fetch_changes_nothing_and_makes_no_request(hub, tmp_path):
    sha = commit(hub)
    fetch(hub, tmp_path, sha).run()
    stamp = model_dir(tmp_path) / sha / STAMP_NAME
    before = stamp.stat().st_mtime_ns
    hub.reset_requests()
    again = fetch(hub, tmp_path, sha).run()
    assert not again.changed
    assert again.actions == []
    assert not fetch(hub, tmp_path, sha).needs_change()
    assert hub.requests == []
    assert stamp.stat().st_mtime_ns == before


def test_lfs_served_in_place_without_redirect(tmp_path):
    with FakeHub(REPO, lfs_redirect=False) as hub:
        sha = commit(hub)
        fetch(hub, tmp_path, sha).run()
        assert hub.count("cdn") == 0
    weights = model_dir(tmp_path) / sha / "model.safetensors"
    assert weights.read_bytes() == model_files(1)["model.safetensors"]


def test_endpoint_defaults_to_hf_endpoint(hub, tmp_path, monkeypatch):
    sha = commit(hub)
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint + "/")
    fetch(hub, tmp_path, sha, endpoint=None).run()
    assert os.readlink(model_dir(tmp_path) / "current") == sha


def test_corrupt_lfs_file_names_file_and_both_hashes_and_keeps_previous(hub, tmp_path):
    old = commit(hub, seed=1)
    fetch(hub, tmp_path, old).run()
    new = commit(hub, seed=2)
    hub.corrupt("model.safetensors")
    weights = hub.commits[new]["model.safetensors"]
    with pytest.raises(WeightsError) as err:
        fetch(hub, tmp_path, new).run()
    message = str(err.value)
    expected, got = weights.sha256, hashlib.sha256(hub.served_bytes(weights)).hexdigest()
    assert f"model.safetensors: sha256 mismatch: expected {expected}, got {got}" in message
    assert "previous revision stays in place" in message
    assert listing(tmp_path) == sorted(["current", old])
    assert os.readlink(model_dir(tmp_path) / "current") == old
    target = model_dir(tmp_path) / old
    assert verify_dir(target, load_local_manifest(target), full=True, workers=2) == []


def test_corrupt_small_file_fails_its_git_blob_sha1(hub, tmp_path):
    sha = commit(hub)
    hub.corrupt("config.json")
    config = hub.commits[sha]["config.json"]
    with pytest.raises(WeightsError) as err:
        fetch(hub, tmp_path, sha).run()
    assert (
        f"config.json: git blob sha1 mismatch: expected {config.blob_id}, "
        f"got {git_blob_sha1(hub.served_bytes(config))}"
    ) in str(err.value)
    assert listing(tmp_path) == []


def test_truncated_files_fail_with_sizes(hub, tmp_path):
    sha = commit(hub)
    # The LFS file: the client sees the short body against X-Linked-Size. The small file:
    # served consistently short, so only the Hub's metadata (and this check) knows.
    hub.truncate("model.safetensors", 1000)
    hub.truncate("tokenizer.json", 5)
    with pytest.raises(WeightsError) as err:
        fetch(hub, tmp_path, sha).run()
    message = str(err.value)
    assert f"model.safetensors: size mismatch: expected {WEIGHTS_SIZE}, got 1000" in message
    tokenizer = len(model_files(1)["tokenizer.json"])
    assert f"tokenizer.json: size mismatch: expected {tokenizer}, got 5" in message
    assert listing(tmp_path) == []


def test_file_listed_but_missing_is_named(hub, tmp_path):
    sha = commit(hub)
    hub.drop("tokenizer.json")
    with pytest.raises(WeightsError) as err:
        fetch(hub, tmp_path, sha).run()
    assert "tokenizer.json: listed by the Hub at this commit but missing (404)" in str(err.value)
    assert listing(tmp_path) == []


@pytest.mark.parametrize(
    "revision", ["main", "v1.0", "abc1234", "A" * 40, "a" * 41, "a" * 40 + "\n"]
)
def test_revision_that_is_not_a_full_commit_is_refused_before_any_request(hub, tmp_path, revision):
    commit(hub)
    with pytest.raises(WeightsError) as err:
        fetch(hub, tmp_path, revision).run()
    assert str(err.value).startswith(
        f"fleet_models.tiny.revision={revision!r} is not pinned for source=hf: "
        "pin a 40-hex commit sha (the full id in the Hub repo's history"
    )
    assert hub.requests == []
    assert not (tmp_path / "srv").exists()


def test_unknown_revision(hub, tmp_path):
    commit(hub)
    with pytest.raises(WeightsError, match=f"unknown revision: the repo has no commit {'f' * 40}"):
        fetch(hub, tmp_path, "f" * 40).run()
    assert not model_dir(tmp_path).exists()


def test_unknown_repo(hub, tmp_path):
    sha = commit(hub)
    with pytest.raises(WeightsError, match=r"repo not found \(404\)"):
        HfFetch(
            name="tiny", repo="org/nope", revision=sha, root=tmp_path, endpoint=hub.endpoint
        ).run()


def test_token_is_required_used_and_never_shown(hub, tmp_path, monkeypatch, caplog, capfd):
    caplog.set_level(logging.DEBUG)
    # huggingface_hub pins its own logger at WARNING; open it up too.
    caplog.set_level(logging.DEBUG, logger="huggingface_hub")
    sha = commit(hub)
    hub.require_token(TOKEN)
    errors = []
    with pytest.raises(WeightsError) as err:
        fetch(hub, tmp_path, sha).run()
    errors.append(err.value)
    assert "unauthorized (401)" in str(err.value)
    assert "HF_TOKEN is not set" in str(err.value)

    wrong = TOKEN[::-1]
    monkeypatch.setenv("HF_TOKEN", wrong)
    with pytest.raises(WeightsError) as err:
        fetch(hub, tmp_path, sha).run()
    errors.append(err.value)
    assert "unauthorized (401): the Hub rejected HF_TOKEN" in str(err.value)
    assert not model_dir(tmp_path).exists()

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    hub.reset_requests()
    progress = []
    fetch(hub, tmp_path, sha, report=progress.append).run()
    assert os.readlink(model_dir(tmp_path) / "current") == sha
    # Sent to the Hub, never to the CDN the Hub redirects to.
    assert hub.count("cdn") == 1
    assert {r.auth for r in hub.requests if r.server == "cdn"} == {"none"}
    assert {r.auth for r in hub.requests if r.server == "hub"} == {"valid"}
    assert "(authenticated: True)" in caplog.text  # the client's debug log did run

    out, errout = capfd.readouterr()
    shown = [caplog.text, out, errout, *progress]
    for error in errors:
        shown += [str(error), repr(error), str(error.__cause__), str(error.__context__)]
    for secret in (TOKEN, wrong):
        assert all(secret not in text for text in shown)
        for path in (tmp_path / "srv").rglob("*"):
            if path.is_file() and not path.is_symlink():
                assert secret.encode() not in path.read_bytes(), path


def test_allow_and_ignore_patterns_select_files(hub, tmp_path):
    sha = commit(hub)
    fetch(hub, tmp_path, sha, allow_patterns=["*.json"]).run()
    target = model_dir(tmp_path) / sha
    assert [f.path for f in load_local_manifest(target).files] == ["config.json", "tokenizer.json"]
    assert not (target / "model.safetensors").exists()
    assert hub.count(path="model.safetensors") == 0
    assert hub.count("cdn") == 0

    # Same commit, other patterns: the installed copy is not what is asked, so it is redone.
    again = fetch(hub, tmp_path, sha, ignore_patterns="tokenizer.*").run()
    assert again.changed
    assert again.actions[0].startswith("re-fetched other local copy: installed with ")
    names = [f.path for f in load_local_manifest(target).files]
    assert names == ["config.json", "model.safetensors"]
    assert not fetch(hub, tmp_path, sha, ignore_patterns=["tokenizer.*"]).needs_change()


def test_patterns_matching_nothing_are_refused(hub, tmp_path):
    sha = commit(hub)
    with pytest.raises(WeightsError, match="no file matches allow_patterns"):
        fetch(hub, tmp_path, sha, allow_patterns=["*.gguf"]).run()
    assert hub.count("hub", "HEAD") == 0


def test_missing_client_is_a_worded_error(hub, tmp_path, monkeypatch):
    sha = commit(hub)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(WeightsError, match=r"needs huggingface_hub==2\.4\.0 in this venv"):
        fetch(hub, tmp_path, sha).run()
    assert hub.requests == []
