"""The modelscope weights source against a local fixture speaking ModelScope's HTTP API."""

import hashlib
import json
import logging
import os
import random
import stat

import pytest

from tests.fixtures.modelscope_server import FakeModelScope
from vllm_fleet.weights.base import (
    MANIFEST_NAME,
    STAMP_NAME,
    WeightsError,
    load_local_manifest,
    verify_dir,
)
from vllm_fleet.weights.modelscope import ModelScopeFetch

REPO = "org/tiny-qwen"
TOKEN = "ms-fixtureSecret0123456789abcdefXYZ"
WEIGHTS_SIZE = 3_000_000


def model_files(seed: int) -> dict[str, bytes]:
    return {
        "config.json": b'{"model_type": "qwen2", "seed": %d}\n' % seed,
        "tokenizer.json": b'{"version": "1.0", "model": {"type": "BPE"}}\n',
        "model.safetensors": random.Random(seed).randbytes(WEIGHTS_SIZE),
        "sub/extra.txt": b"nested file\n",
    }


@pytest.fixture(autouse=True)
def ms_env(monkeypatch):
    # Only what a test sets may reach the client: no token or domain of the host.
    for name in ("MODELSCOPE_API_TOKEN", "MODELSCOPE_DOMAIN"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def ms():
    with FakeModelScope(REPO) as server:
        yield server


def commit(ms, seed=1):
    return ms.commit(model_files(seed))


def fetch(ms, tmp_path, revision, **kwargs):
    kwargs.setdefault("endpoint", ms.endpoint)
    return ModelScopeFetch(
        name="tiny", repo=REPO, revision=revision, root=tmp_path / "srv", workers=3, **kwargs
    )


def model_dir(tmp_path):
    return tmp_path / "srv" / "tiny"


def listing(tmp_path):
    """What is served: staging directories (kept for a resume) are not."""
    return sorted(
        p.name for p in model_dir(tmp_path).iterdir() if not p.name.startswith(".staging-")
    )


def assert_previous_serves(tmp_path, old):
    assert listing(tmp_path) == sorted(["current", old])
    assert os.readlink(model_dir(tmp_path) / "current") == old
    target = model_dir(tmp_path) / old
    assert verify_dir(target, load_local_manifest(target), full=True, workers=2) == []


@pytest.fixture
def installed(ms, tmp_path):
    """A first revision installed and current; the test then fails to fetch a second one."""
    old = commit(ms, seed=1)
    fetch(ms, tmp_path, old).run()
    new = commit(ms, seed=2)
    return old, new


def test_good_fetch_installs_verified_files_manifest_stamp_and_current(ms, tmp_path):
    sha = commit(ms)
    progress = []
    result = fetch(ms, tmp_path, sha, report=progress.append).run()
    target = model_dir(tmp_path) / sha
    files = model_files(1)
    assert result.changed
    assert result.files == 4
    assert result.bytes == sum(len(b) for b in files.values())
    for path, data in files.items():
        assert (target / path).read_bytes() == data
        assert stat.S_IMODE((target / path).stat().st_mode) == 0o444
    manifest = load_local_manifest(target)
    assert {(f.path, f.size, f.sha256) for f in manifest.files} == {
        (p, len(b), hashlib.sha256(b).hexdigest()) for p, b in files.items()
    }
    record = json.loads((target / MANIFEST_NAME).read_text())
    assert record["source"] == "modelscope"
    assert record["repo"] == REPO
    assert record["revision"] == sha
    assert record["endpoint"] == ms.endpoint
    assert record["allow_patterns"] is None
    assert (target / STAMP_NAME).is_file()
    assert verify_dir(target, manifest, full=True, workers=2) == []
    # .gitattributes is git's bookkeeping, as the SDK treats it; tree entries are not files.
    assert sorted(p.name for p in target.iterdir()) == sorted(
        ["config.json", "tokenizer.json", "model.safetensors", "sub", MANIFEST_NAME, STAMP_NAME]
    )
    assert os.readlink(model_dir(tmp_path) / "current") == sha
    assert listing(tmp_path) == sorted(["current", sha])
    # One listing at the pinned commit, one download per file, each at the pinned commit.
    assert ms.count("GET", f"/api/v1/models/{REPO}/repo/files?Revision={sha}&Recursive=True") == 1
    downloads = [r.path for r in ms.requests if "FilePath=" in r.path]
    assert len(downloads) == 4
    assert all(f"Revision={sha}&" in p for p in downloads)
    assert progress[-1].startswith(f"fetch tiny@{sha[:12]}: 3/3 MB")


def test_second_fetch_changes_nothing_and_makes_no_request(ms, tmp_path):
    sha = commit(ms)
    fetch(ms, tmp_path, sha).run()
    stamp = model_dir(tmp_path) / sha / STAMP_NAME
    before = stamp.stat().st_mtime_ns
    ms.reset_requests()
    again = fetch(ms, tmp_path, sha).run()
    assert not again.changed
    assert again.actions == []
    assert not fetch(ms, tmp_path, sha).needs_change()
    assert ms.requests == []
    assert stamp.stat().st_mtime_ns == before


def test_second_commit_keeps_files_last_changed_earlier(ms, tmp_path):
    # A file unchanged since an earlier commit is listed with that commit as its Revision:
    # that is ModelScope's meaning of the field, and no reason to refuse.
    first = commit(ms, seed=1)
    files = {**model_files(1), "config.json": b'{"model_type": "qwen2", "v": 2}\n'}
    second = ms.commit(files)
    assert ms.commits[second]["model.safetensors"].commit == first
    fetch(ms, tmp_path, second).run()
    assert (model_dir(tmp_path) / second / "config.json").read_bytes() == files["config.json"]


def test_endpoint_from_modelscope_domain(ms, tmp_path, monkeypatch):
    sha = commit(ms)
    monkeypatch.setenv("MODELSCOPE_DOMAIN", "modelscope.example.internal")
    assert fetch(ms, tmp_path, sha, endpoint=None).endpoint_url == (
        "https://modelscope.example.internal"
    )
    monkeypatch.setenv("MODELSCOPE_DOMAIN", ms.endpoint + "/")
    fetch(ms, tmp_path, sha, endpoint=None).run()
    assert os.readlink(model_dir(tmp_path) / "current") == sha
    monkeypatch.delenv("MODELSCOPE_DOMAIN")
    assert fetch(ms, tmp_path, sha, endpoint=None).endpoint_url == "https://www.modelscope.cn"


def test_corrupt_file_names_file_and_both_hashes_and_keeps_previous(ms, tmp_path, installed):
    old, new = installed
    ms.corrupt("model.safetensors")
    weights = ms.commits[new]["model.safetensors"]
    with pytest.raises(WeightsError) as err:
        fetch(ms, tmp_path, new).run()
    message = str(err.value)
    expected, got = weights.sha256, hashlib.sha256(ms.served_bytes(weights)).hexdigest()
    assert message.startswith(f"model tiny: {REPO}@{new} from {ms.endpoint}: ")
    assert f"model.safetensors: sha256 mismatch: expected {expected}, got {got}" in message
    assert "Nothing was installed; the previous revision stays in place" in message
    assert_previous_serves(tmp_path, old)


def test_truncated_files_fail_with_sizes(ms, tmp_path, installed):
    old, new = installed
    ms.truncate("model.safetensors", 1000)
    ms.truncate("tokenizer.json", 5)
    with pytest.raises(WeightsError) as err:
        fetch(ms, tmp_path, new).run()
    message = str(err.value)
    assert f"model.safetensors: size mismatch: expected {WEIGHTS_SIZE}, got 1000" in message
    tokenizer = len(model_files(2)["tokenizer.json"])
    assert f"tokenizer.json: size mismatch: expected {tokenizer}, got 5" in message
    assert "previous revision stays in place" in message
    assert_previous_serves(tmp_path, old)


def test_file_listed_but_missing_is_named(ms, tmp_path, installed):
    old, new = installed
    ms.drop("sub/extra.txt")
    with pytest.raises(WeightsError) as err:
        fetch(ms, tmp_path, new).run()
    assert "sub/extra.txt: listed at this commit but missing (404)" in str(err.value)
    assert "previous revision stays in place" in str(err.value)
    assert_previous_serves(tmp_path, old)


def test_endpoint_serving_another_commit_is_caught_by_the_hashes(ms, tmp_path, installed):
    # A mirror that ignores Revision on downloads hands out the branch head for an old pin.
    old, new = installed
    commit(ms, seed=3)  # the branch moves on past the pinned commit
    ms.serve_head()
    with pytest.raises(WeightsError) as err:
        fetch(ms, tmp_path, new).run()
    message = str(err.value)
    assert "model.safetensors: sha256 mismatch" in message
    assert "config.json: " in message
    assert_previous_serves(tmp_path, old)


@pytest.mark.parametrize("revision", ["master", "v1.0", "abc1234", "A" * 40, "a" * 41])
def test_revision_that_is_not_a_full_commit_is_refused_before_any_request(ms, tmp_path, revision):
    commit(ms)
    with pytest.raises(WeightsError) as err:
        fetch(ms, tmp_path, revision).run()
    assert str(err.value).startswith(
        f"fleet_models.tiny.revision={revision!r} is not pinned for source=modelscope: "
        "pin a 40-hex commit id (the full id in the ModelScope repo's history"
    )
    assert ms.requests == []
    assert not (tmp_path / "srv").exists()


def test_unknown_commit_is_a_worded_404_and_keeps_previous(ms, tmp_path, installed):
    old, _ = installed
    with pytest.raises(WeightsError) as err:
        fetch(ms, tmp_path, "f" * 40).run()
    message = str(err.value)
    assert f"not found (404): revision {'f' * 40} not found" in message
    assert f"that the repo has commit {'f' * 40}" in message
    assert_previous_serves(tmp_path, old)


def test_listing_that_names_no_commit_for_a_file_is_refused(ms, tmp_path, installed):
    old, new = installed
    ms.reset_requests()
    ms.file_revision("config.json", "master")
    with pytest.raises(WeightsError) as err:
        fetch(ms, tmp_path, new).run()
    assert "names revision 'master' for config.json, not a commit id" in str(err.value)
    assert ms.count(path="FilePath=") == 0
    assert_previous_serves(tmp_path, old)


def test_bad_repo_id_and_unknown_repo(ms, tmp_path):
    sha = commit(ms)
    with pytest.raises(WeightsError, match=r"repo=tiny is not a ModelScope model id"):
        ModelScopeFetch(name="tiny", repo="tiny", revision=sha, root=tmp_path)
    with pytest.raises(WeightsError, match=r"not found \(404\)"):
        ModelScopeFetch(
            name="tiny", repo="org/nope", revision=sha, root=tmp_path, endpoint=ms.endpoint
        ).run()


def test_unreachable_endpoint_is_a_clear_error(tmp_path):
    bad = ModelScopeFetch(
        name="tiny", repo=REPO, revision="a" * 40, root=tmp_path, endpoint="http://127.0.0.1:9"
    )
    with pytest.raises(WeightsError, match="cannot read the file list: ConnectError"):
        bad.run()


def test_token_is_required_sent_as_the_sdk_does_and_never_shown(
    ms, tmp_path, monkeypatch, caplog, capfd, installed
):
    caplog.set_level(logging.DEBUG)
    old, new = installed
    ms.require_token(TOKEN)
    errors = []
    with pytest.raises(WeightsError) as err:
        fetch(ms, tmp_path, new).run()
    errors.append(err.value)
    assert "unauthorized (401)" in str(err.value)
    assert "MODELSCOPE_API_TOKEN is not set" in str(err.value)
    assert_previous_serves(tmp_path, old)

    wrong = TOKEN[::-1]
    monkeypatch.setenv("MODELSCOPE_API_TOKEN", wrong)
    with pytest.raises(WeightsError) as err:
        fetch(ms, tmp_path, new).run()
    errors.append(err.value)
    assert "unauthorized (401): ModelScope rejected MODELSCOPE_API_TOKEN" in str(err.value)
    assert_previous_serves(tmp_path, old)

    monkeypatch.setenv("MODELSCOPE_API_TOKEN", TOKEN)
    ms.reset_requests()
    progress = []
    fetch(ms, tmp_path, new, report=progress.append).run()
    assert os.readlink(model_dir(tmp_path) / "current") == new
    # Every request carried it, as the m_session_id cookie, and nothing else did.
    assert ms.requests
    assert {r.auth for r in ms.requests} == {"valid"}
    assert all("cookie" in r.headers and "authorization" not in r.headers for r in ms.requests)

    out, errout = capfd.readouterr()
    shown = [caplog.text, out, errout, *progress, *ms.raw_requests]
    shown += [r.path for r in ms.requests]
    for error in errors:
        shown += [str(error), repr(error), str(error.__cause__), str(error.__context__)]
    for secret in (TOKEN, wrong):
        assert all(secret not in text for text in shown)
        for path in (tmp_path / "srv").rglob("*"):
            if path.is_file() and not path.is_symlink():
                assert secret.encode() not in path.read_bytes(), path


def test_allow_and_ignore_patterns_select_files(ms, tmp_path):
    sha = commit(ms)
    fetch(ms, tmp_path, sha, allow_patterns=["*.json", "sub/"]).run()
    target = model_dir(tmp_path) / sha
    names = [f.path for f in load_local_manifest(target).files]
    assert names == ["config.json", "sub/extra.txt", "tokenizer.json"]
    assert not (target / "model.safetensors").exists()
    assert ms.count(path="FilePath=model.safetensors") == 0
    record = json.loads((target / MANIFEST_NAME).read_text())
    assert record["allow_patterns"] == ["*.json", "sub/"]

    # Same commit, other patterns: the installed copy is not what is asked, so it is redone.
    again = fetch(ms, tmp_path, sha, ignore_patterns="tokenizer.*").run()
    assert again.changed
    assert again.actions[0].startswith("re-fetched other local copy: installed with ")
    names = [f.path for f in load_local_manifest(target).files]
    assert names == ["config.json", "model.safetensors", "sub/extra.txt"]
    assert not fetch(ms, tmp_path, sha, ignore_patterns=["tokenizer.*"]).needs_change()


def test_patterns_matching_nothing_are_refused(ms, tmp_path):
    sha = commit(ms)
    with pytest.raises(WeightsError, match="no file matches allow_patterns"):
        fetch(ms, tmp_path, sha, allow_patterns=["*.gguf"]).run()
    assert ms.count(path="FilePath=") == 0
