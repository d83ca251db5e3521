"""The modelscope weights source against a local fixture speaking ModelScope's HTTP API: what
only this source does (a file's Revision is the commit that last changed it, MODELSCOPE_DOMAIN,
a mirror that ignores the pin, a listing that names no commit, owner/name repo ids, an
unreachable endpoint). What it shares with the hf source is proved for both in
test_weights_remote.py."""

import os

import pytest

from tests.support.remote_weights import MODELSCOPE, assert_previous_serves, model_dir
from vllm_fleet.weights.base import WeightsError
from vllm_fleet.weights.modelscope import ModelScopeFetch

ms_env = MODELSCOPE.env_fixture()
ms = MODELSCOPE.server_fixture()


@pytest.fixture
def installed(ms, tmp_path):
    """A first revision installed and current; the test then fails to fetch a second one."""
    pins = MODELSCOPE.install_previous(ms, tmp_path)
    return pins.old, pins.new


def test_second_commit_keeps_files_last_changed_earlier(ms, tmp_path):
    # A file unchanged since an earlier commit is listed with that commit as its Revision:
    # that is ModelScope's meaning of the field, and no reason to refuse.
    first = MODELSCOPE.commit(ms, seed=1)
    files = {**MODELSCOPE.model_files(1), "config.json": b'{"model_type": "qwen2", "v": 2}\n'}
    second = ms.commit(files)
    assert ms.commits[second]["model.safetensors"].commit == first
    MODELSCOPE.fetch(ms, tmp_path, second).run()
    assert (model_dir(tmp_path) / second / "config.json").read_bytes() == files["config.json"]


def test_endpoint_from_modelscope_domain(ms, tmp_path, monkeypatch):
    sha = MODELSCOPE.commit(ms)
    monkeypatch.setenv("MODELSCOPE_DOMAIN", "modelscope.example.internal")
    assert MODELSCOPE.fetch(ms, tmp_path, sha, endpoint=None).endpoint_url == (
        "https://modelscope.example.internal"
    )
    monkeypatch.setenv("MODELSCOPE_DOMAIN", ms.endpoint + "/")
    MODELSCOPE.fetch(ms, tmp_path, sha, endpoint=None).run()
    assert os.readlink(model_dir(tmp_path) / "current") == sha
    monkeypatch.delenv("MODELSCOPE_DOMAIN")
    endpoint = MODELSCOPE.fetch(ms, tmp_path, sha, endpoint=None).endpoint_url
    assert endpoint == "https://www.modelscope.cn"


def test_endpoint_serving_another_commit_is_caught_by_the_hashes(ms, tmp_path, installed):
    # A mirror that ignores Revision on downloads hands out the branch head for an old pin.
    old, new = installed
    MODELSCOPE.commit(ms, seed=3)  # the branch moves on past the pinned commit
    ms.serve_head()
    with pytest.raises(WeightsError) as err:
        MODELSCOPE.fetch(ms, tmp_path, new).run()
    message = str(err.value)
    assert "model.safetensors: sha256 mismatch" in message
    assert "config.json: " in message
    assert_previous_serves(tmp_path, old)


def test_listing_that_names_no_commit_for_a_file_is_refused(ms, tmp_path, installed):
    old, new = installed
    ms.reset_requests()
    ms.file_revision("config.json", "master")
    with pytest.raises(WeightsError) as err:
        MODELSCOPE.fetch(ms, tmp_path, new).run()
    assert "names revision 'master' for config.json, not a commit id" in str(err.value)
    assert ms.count(path="FilePath=") == 0
    assert_previous_serves(tmp_path, old)


def test_bad_repo_id_and_unknown_repo(ms, tmp_path):
    sha = MODELSCOPE.commit(ms)
    with pytest.raises(WeightsError, match=r"repo=tiny is not a ModelScope model id"):
        ModelScopeFetch(name="tiny", repo="tiny", revision=sha, root=tmp_path)
    with pytest.raises(WeightsError, match=r"not found \(404\)"):
        ModelScopeFetch(
            name="tiny", repo="org/nope", revision=sha, root=tmp_path, endpoint=ms.endpoint
        ).run()


def test_unreachable_endpoint_is_a_clear_error(tmp_path):
    bad = ModelScopeFetch(
        name="tiny",
        repo=MODELSCOPE.repo,
        revision="a" * 40,
        root=tmp_path,
        endpoint="http://127.0.0.1:9",
    )
    with pytest.raises(WeightsError, match="cannot read the file list: ConnectError"):
        bad.run()
