"""The hf weights source against a local Hub fixture that the real huggingface_hub talks to:
what only this source does (LFS files served in place, HF_ENDPOINT, small files checked by
their git blob sha1, an unknown repo, no huggingface_hub in the venv). What it shares with the
modelscope source is proved for both in test_weights_remote.py."""

import os
import sys

import pytest

from tests.fixtures.hub_server import FakeHub, git_blob_sha1
from tests.support.remote_weights import HF, WEIGHTS, listing, model_dir
from vllm_fleet.weights.base import WeightsError
from vllm_fleet.weights.hf import HfFetch

hub_env = HF.env_fixture()
hub = HF.server_fixture()


def test_lfs_served_in_place_without_redirect(tmp_path):
    with FakeHub(HF.repo, lfs_redirect=False) as hub:
        sha = HF.commit(hub)
        HF.fetch(hub, tmp_path, sha).run()
        assert hub.count("cdn") == 0
    weights = model_dir(tmp_path) / sha / WEIGHTS
    assert weights.read_bytes() == HF.model_files(1)[WEIGHTS]


def test_endpoint_defaults_to_hf_endpoint(hub, tmp_path, monkeypatch):
    sha = HF.commit(hub)
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint + "/")
    HF.fetch(hub, tmp_path, sha, endpoint=None).run()
    assert os.readlink(model_dir(tmp_path) / "current") == sha


def test_corrupt_small_file_fails_its_git_blob_sha1(hub, tmp_path):
    sha = HF.commit(hub)
    hub.corrupt("config.json")
    config = hub.commits[sha]["config.json"]
    with pytest.raises(WeightsError) as err:
        HF.fetch(hub, tmp_path, sha).run()
    assert (
        f"config.json: git blob sha1 mismatch: expected {config.blob_id}, "
        f"got {git_blob_sha1(hub.served_bytes(config))}"
    ) in str(err.value)
    assert listing(tmp_path) == []


def test_unknown_repo(hub, tmp_path):
    sha = HF.commit(hub)
    with pytest.raises(WeightsError, match=r"repo not found \(404\)"):
        HfFetch(
            name="tiny", repo="org/nope", revision=sha, root=tmp_path, endpoint=hub.endpoint
        ).run()


def test_missing_client_is_a_worded_error(hub, tmp_path, monkeypatch):
    sha = HF.commit(hub)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(WeightsError, match=r"needs huggingface_hub==2\.4\.0 in this venv"):
        HF.fetch(hub, tmp_path, sha).run()
    assert hub.requests == []
