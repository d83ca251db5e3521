"""What both upstream weights sources (hf and modelscope) must do, proved for each against its
local fixture server that the real client talks to: a good fetch installs verified files, a
manifest, a stamp and ``current``, and a second one makes no request; corrupt, short or
missing files, an unknown commit or a missing or wrong token are named and install nothing
(the previous revision stays current and whole); a revision that is no full commit is refused
before any request; the token never shows; allow/ignore patterns select files.

What only one source does is in test_weights_hf.py and test_weights_modelscope.py; the
sources themselves are described in tests/support/remote_weights.py."""

import hashlib
import importlib
import json
import logging
import os
import stat

import pytest

from tests.support.remote_weights import (
    SOURCES,
    WEIGHTS,
    WEIGHTS_SIZE,
    Pins,
    RemoteSource,
    assert_previous_serves,
    assert_untouched,
    listing,
    model_dir,
)
from vllm_fleet.weights.base import (
    MANIFEST_NAME,
    STAMP_NAME,
    WeightsError,
    load_local_manifest,
    verify_dir,
)

NOT_PINNED = ["v1.0", "abc1234", "A" * 40, "a" * 41, "a" * 40 + "\n"]


def source_id(value: object) -> str | None:
    return value.name if isinstance(value, RemoteSource) else None


@pytest.fixture(params=SOURCES, ids=source_id)
def source(request):
    return request.param


@pytest.fixture(autouse=True)
def client_env(source, monkeypatch):
    source.clear_env(monkeypatch)


@pytest.fixture
def server(source):
    with source.server() as started:
        yield started


@pytest.fixture
def installed(source, server, tmp_path) -> Pins:
    return source.install_previous(server, tmp_path)


@pytest.fixture(params=[False, True], ids=["fresh", "over-previous"])
def pins(request, source, server, tmp_path) -> Pins:
    """A failed fetch on a host with no revision yet, and on one with a previous one current."""
    if request.param:
        return source.install_previous(server, tmp_path)
    return Pins(None, source.commit(server))


def test_good_fetch_installs_verified_files_manifest_stamp_and_current(source, server, tmp_path):
    sha = source.commit(server)
    progress = []
    result = source.fetch(server, tmp_path, sha, report=progress.append).run()
    target = model_dir(tmp_path) / sha
    files = source.model_files(1)
    assert result.changed
    assert result.files == len(files)
    assert result.bytes == sum(len(b) for b in files.values())
    for path, data in files.items():
        assert (target / path).read_bytes() == data
        assert stat.S_IMODE((target / path).stat().st_mode) == 0o444
    manifest = load_local_manifest(target)
    assert {(f.path, f.size, f.sha256) for f in manifest.files} == {
        (p, len(b), hashlib.sha256(b).hexdigest()) for p, b in files.items()
    }
    record = json.loads((target / MANIFEST_NAME).read_text())
    assert record["source"] == source.name
    assert record["repo"] == source.repo
    assert record["revision"] == sha
    assert record["endpoint"] == server.endpoint
    assert record["allow_patterns"] is None
    assert (target / STAMP_NAME).is_file()
    assert verify_dir(target, manifest, full=True, workers=2) == []
    # The model's files and no more: not the client's bookkeeping (huggingface_hub's local_dir
    # cache, the .gitattributes ModelScope lists), nor the listing's tree entries.
    top = {path.split("/")[0] for path in files}
    assert sorted(p.name for p in target.iterdir()) == sorted([*top, MANIFEST_NAME, STAMP_NAME])
    assert os.readlink(model_dir(tmp_path) / "current") == sha
    assert listing(tmp_path) == sorted(["current", sha])
    source.check_one_fetch_requests(server, sha)
    # The client's byte counts reach our progress report (through its progress hook).
    assert progress[-1].startswith(f"fetch tiny@{sha[:12]}: 3/3 MB")


def test_second_fetch_changes_nothing_and_makes_no_request(source, server, tmp_path):
    sha = source.commit(server)
    source.fetch(server, tmp_path, sha).run()
    stamp = model_dir(tmp_path) / sha / STAMP_NAME
    before = stamp.stat().st_mtime_ns
    server.reset_requests()
    again = source.fetch(server, tmp_path, sha).run()
    assert not again.changed
    assert again.actions == []
    assert not source.fetch(server, tmp_path, sha).needs_change()
    assert server.requests == []
    assert stamp.stat().st_mtime_ns == before


def test_corrupt_file_names_file_and_both_hashes_and_keeps_previous(
    source, server, tmp_path, installed
):
    server.corrupt(WEIGHTS)
    weights = server.commits[installed.new][WEIGHTS]
    with pytest.raises(WeightsError) as err:
        source.fetch(server, tmp_path, installed.new).run()
    message = str(err.value)
    expected, got = weights.sha256, hashlib.sha256(server.served_bytes(weights)).hexdigest()
    assert message.startswith(f"model tiny: {source.repo}@{installed.new} from {server.endpoint}: ")
    assert f"{WEIGHTS}: sha256 mismatch: expected {expected}, got {got}" in message
    assert "Nothing was installed; the previous revision stays in place" in message
    assert_previous_serves(tmp_path, installed.old)


def test_truncated_files_fail_with_sizes(source, server, tmp_path, pins):
    # The weights: the client sees the short body against the size it was told. The small
    # file: served consistently short, so only the repo's metadata (and this check) knows.
    server.truncate(WEIGHTS, 1000)
    server.truncate("tokenizer.json", 5)
    with pytest.raises(WeightsError) as err:
        source.fetch(server, tmp_path, pins.new).run()
    message = str(err.value)
    assert f"{WEIGHTS}: size mismatch: expected {WEIGHTS_SIZE}, got 1000" in message
    tokenizer = len(source.model_files(2)["tokenizer.json"])
    assert f"tokenizer.json: size mismatch: expected {tokenizer}, got 5" in message
    assert "previous revision stays in place" in message
    assert_previous_serves(tmp_path, pins.old)


def test_file_listed_but_missing_is_named(source, server, tmp_path, pins):
    server.drop(source.dropped)
    with pytest.raises(WeightsError) as err:
        source.fetch(server, tmp_path, pins.new).run()
    assert f"{source.dropped}: {source.missing}" in str(err.value)
    assert "previous revision stays in place" in str(err.value)
    assert_previous_serves(tmp_path, pins.old)


@pytest.mark.parametrize(
    ("source", "revision"),
    [(source, revision) for source in SOURCES for revision in [source.branch, *NOT_PINNED]],
    ids=source_id,
)
def test_revision_that_is_not_a_full_commit_is_refused_before_any_request(
    source, server, tmp_path, revision
):
    source.commit(server)
    with pytest.raises(WeightsError) as err:
        source.fetch(server, tmp_path, revision).run()
    assert str(err.value).startswith(
        f"fleet_models.tiny.revision={revision!r} is not pinned for source={source.name}: "
        + source.not_pinned
    )
    assert server.requests == []
    assert not (tmp_path / "srv").exists()


def test_unknown_commit_is_named_and_keeps_previous(source, server, tmp_path, pins):
    unknown = "f" * 40
    with pytest.raises(WeightsError) as err:
        source.fetch(server, tmp_path, unknown).run()
    for words in source.unknown_commit(unknown):
        assert words in str(err.value)
    assert_untouched(tmp_path, pins.old)


def test_token_is_required_sent_as_the_client_does_and_never_shown(
    source, server, tmp_path, pins, monkeypatch, caplog, capfd
):
    caplog.set_level(logging.DEBUG)
    for module in source.client_modules:
        # Imported first: the client pins its logger's level when these are imported, which in
        # a worker where no earlier test imported them would undo the level set here.
        importlib.import_module(module)
    for logger in source.client_loggers:
        caplog.set_level(logging.DEBUG, logger=logger)
    server.require_token(source.token)
    errors = []
    with pytest.raises(WeightsError) as err:
        source.fetch(server, tmp_path, pins.new).run()
    errors.append(err.value)
    assert "unauthorized (401)" in str(err.value)
    assert f"{source.token_env} is not set" in str(err.value)
    assert_untouched(tmp_path, pins.old)

    wrong = source.token[::-1]
    monkeypatch.setenv(source.token_env, wrong)
    with pytest.raises(WeightsError) as err:
        source.fetch(server, tmp_path, pins.new).run()
    errors.append(err.value)
    assert f"unauthorized (401): {source.rejected}" in str(err.value)
    assert_untouched(tmp_path, pins.old)

    monkeypatch.setenv(source.token_env, source.token)
    server.reset_requests()
    progress = []
    source.fetch(server, tmp_path, pins.new, report=progress.append).run()
    assert os.readlink(model_dir(tmp_path) / "current") == pins.new
    source.check_authenticated(server, caplog.text)

    out, errout = capfd.readouterr()
    shown = [caplog.text, out, errout, *progress, *server.raw_requests]
    shown += [r.path for r in server.requests]
    for error in errors:
        shown += [str(error), repr(error), str(error.__cause__), str(error.__context__)]
    for secret in (source.token, wrong):
        assert all(secret not in text for text in shown)
        for path in (tmp_path / "srv").rglob("*"):
            if path.is_file() and not path.is_symlink():
                assert secret.encode() not in path.read_bytes(), path


def test_allow_and_ignore_patterns_select_files(source, server, tmp_path):
    sha = source.commit(server)
    files = source.model_files(1)
    source.fetch(server, tmp_path, sha, allow_patterns=source.all_but_weights).run()
    target = model_dir(tmp_path) / sha
    names = [f.path for f in load_local_manifest(target).files]
    assert names == sorted(p for p in files if p != WEIGHTS)
    assert not (target / WEIGHTS).exists()
    assert source.weights_requests(server) == 0
    record = json.loads((target / MANIFEST_NAME).read_text())
    assert record["allow_patterns"] == list(source.all_but_weights)

    # Same commit, other patterns: the installed copy is not what is asked, so it is redone.
    again = source.fetch(server, tmp_path, sha, ignore_patterns="tokenizer.*").run()
    assert again.changed
    assert again.actions[0].startswith("re-fetched other local copy: installed with ")
    names = [f.path for f in load_local_manifest(target).files]
    assert names == sorted(p for p in files if not p.startswith("tokenizer."))
    assert not source.fetch(server, tmp_path, sha, ignore_patterns=["tokenizer.*"]).needs_change()


def test_patterns_matching_nothing_are_refused(source, server, tmp_path):
    sha = source.commit(server)
    with pytest.raises(WeightsError, match="no file matches allow_patterns"):
        source.fetch(server, tmp_path, sha, allow_patterns=["*.gguf"]).run()
    assert source.file_requests(server) == 0
