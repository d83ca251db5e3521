import hashlib

import pytest
from pydantic import ValidationError

from tests.unit.conftest import make_model
from vllm_fleet.weights.manifest import Manifest, ManifestFile, build_manifest


def test_manifest_lists_every_file_with_size_and_sha256(tmp_path):
    model = make_model(tmp_path / "m")
    (model / ".hidden").write_text("bookkeeping")
    manifest = build_manifest("m", model)
    assert [f.path for f in manifest.files] == [
        "config.json",
        "model.safetensors",
        "sub/extra.txt",
        "tokenizer.json",
    ]
    weights = next(f for f in manifest.files if f.path == "model.safetensors")
    assert weights.size == 300_000
    assert weights.sha256 == hashlib.sha256(b"\x01" * 300_000).hexdigest()


def test_revision_id_is_stable_and_content_addressed(tmp_path):
    a = build_manifest("m", make_model(tmp_path / "a"))
    b = build_manifest("m", make_model(tmp_path / "b"))
    assert a.revision_id() == b.revision_id()
    assert a.revision_id() == hashlib.sha256(a.canonical_bytes()).hexdigest()
    c = build_manifest("m", make_model(tmp_path / "c", weights=b"\x02" * 300_000))
    assert c.revision_id() != a.revision_id()


@pytest.mark.parametrize("bad", ["/etc/passwd", "../escape", "a/../../b", ""])
def test_paths_must_stay_inside_the_model(bad):
    with pytest.raises(ValidationError, match="relative and stay inside"):
        ManifestFile(path=bad, size=1, sha256="0" * 64)


def test_a_path_listed_twice_is_refused():
    entry = {"path": "a", "size": 1, "sha256": "0" * 64}
    with pytest.raises(ValidationError, match="twice"):
        Manifest(model="m", files=[entry, entry])


def test_hash_must_be_64_hex():
    with pytest.raises(ValidationError):
        ManifestFile(path="a", size=1, sha256="abc")
