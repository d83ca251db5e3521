import os
import stat

import pytest

from tests.unit.conftest import make_model
from vllm_fleet.weights import base as weights
from vllm_fleet.weights.base import MANIFEST_NAME, WeightsError, load_local_manifest, verify_dir
from vllm_fleet.weights.hashing import sha256_file
from vllm_fleet.weights.mirror import MirrorFetch
from vllm_fleet.weights.publish import publish


@pytest.fixture
def mirror(http_dir, tmp_path):
    base_url, root = http_dir
    revision = publish("m", make_model(tmp_path / "src"), root / "models" / "m")
    return base_url + "/models/m", root / "models" / "m", revision


def fetch(mirror, tmp_path, revision=None, **kwargs):
    url, _, rev = mirror
    # Not the host's own settings directories (what they name is never pruned).
    kwargs.setdefault("engine_config_dir", tmp_path / "engines")
    kwargs.setdefault("upgrade_snapshot_dir", tmp_path / "previous")
    return MirrorFetch(
        name="m", revision=revision or rev, base_url=url, root=tmp_path / "srv", **kwargs
    )


def flip_byte(path, offset=1000):
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[offset] ^= 1
    path.write_bytes(bytes(data))


def test_fetch_installs_verified_read_only_and_points_current(mirror, tmp_path):
    result = fetch(mirror, tmp_path).run()
    target = tmp_path / "srv" / "m" / mirror[2]
    assert result.changed
    assert result.files == 4
    assert (target / "model.safetensors").read_bytes() == b"\x01" * 300_000
    assert stat.S_IMODE((target / "config.json").stat().st_mode) == 0o444
    assert stat.S_IMODE(target.stat().st_mode) == 0o555
    assert os.readlink(tmp_path / "srv" / "m" / "current") == mirror[2]
    assert load_local_manifest(target).revision_id() == mirror[2]
    assert sorted(p.name for p in (tmp_path / "srv" / "m").iterdir()) == sorted(
        ["current", mirror[2]]
    )


def test_second_fetch_changes_nothing(mirror, tmp_path):
    fetch(mirror, tmp_path).run()
    again = fetch(mirror, tmp_path).run()
    assert not again.changed
    assert again.actions == []
    assert not fetch(mirror, tmp_path).needs_change()


def test_corrupt_mirror_file_names_file_and_both_hashes_and_installs_nothing(mirror, tmp_path):
    _, mirror_dir, revision = mirror
    expected = next(
        f.sha256
        for f in load_local_manifest_from_mirror(mirror_dir / revision).files
        if f.path == "model.safetensors"
    )
    flip_byte(mirror_dir / revision / "model.safetensors")
    with pytest.raises(WeightsError) as err:
        fetch(mirror, tmp_path).run()
    message = str(err.value)
    assert f"model.safetensors: sha256 mismatch: expected {expected}, got " in message
    assert "previous revision stays in place" in message
    served = [p.name for p in (tmp_path / "srv" / "m").iterdir()]
    assert [name for name in served if not name.startswith(".staging-")] == []
    # The bad file is not kept for a resume; good files may be.
    assert not list((tmp_path / "srv" / "m").glob(".staging-*/model.safetensors"))


def load_local_manifest_from_mirror(rev_dir):
    from vllm_fleet.weights.manifest import Manifest

    return Manifest.model_validate_json((rev_dir / "manifest.json").read_text())


def test_failed_new_revision_leaves_previous_revision_and_current(mirror, http_dir, tmp_path):
    fetch(mirror, tmp_path).run()
    _, mirror_dir, old = mirror
    new = publish("m", make_model(tmp_path / "src2", weights=b"\x03" * 300_000), mirror_dir)
    flip_byte(mirror_dir / new / "model.safetensors")
    with pytest.raises(WeightsError, match="sha256 mismatch"):
        fetch(mirror, tmp_path, revision=new).run()
    model_dir = tmp_path / "srv" / "m"
    served = sorted(p.name for p in model_dir.iterdir() if not p.name.startswith(".staging-"))
    assert served == sorted(["current", old])
    assert os.readlink(model_dir / "current") == old
    assert verify_dir(model_dir / old, load_local_manifest(model_dir / old), True, 2) == []


def test_truncated_and_missing_files_fail(mirror, tmp_path):
    _, mirror_dir, revision = mirror
    weights = mirror_dir / revision / "model.safetensors"
    weights.chmod(0o644)
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(WeightsError, match=r"model\.safetensors: size 1000, expected 300000"):
        fetch(mirror, tmp_path).run()
    (mirror_dir / revision / "tokenizer.json").unlink()
    with pytest.raises(WeightsError, match=r"tokenizer\.json"):
        fetch(mirror, tmp_path).run()


def test_manifest_that_does_not_hash_to_the_pinned_revision_is_refused(mirror, tmp_path):
    _, mirror_dir, revision = mirror
    # Someone swaps a file and updates the manifest to match: only the pin catches it.
    rev_dir = mirror_dir / revision
    config = rev_dir / "config.json"
    config.chmod(0o644)
    old = sha256_file(config)
    config.write_text('{"model_type": "evil"}\n')
    manifest = rev_dir / "manifest.json"
    manifest.chmod(0o644)
    manifest.write_text(manifest.read_text().replace(old, sha256_file(config)))
    with pytest.raises(WeightsError, match="expected the pinned revision"):
        fetch(mirror, tmp_path).run()


def test_unreachable_mirror_is_a_clear_error(tmp_path):
    bad = MirrorFetch(name="m", revision="0" * 64, base_url="http://127.0.0.1:9", root=tmp_path)
    with pytest.raises(WeightsError, match="cannot read manifest"):
        bad.run()


def test_not_enough_disk_space_is_refused_before_downloading(mirror, tmp_path):
    with pytest.raises(WeightsError, match="GB free; free space"):
        fetch(mirror, tmp_path, margin_bytes=1 << 60).run()
    assert not any((tmp_path / "srv" / "m").iterdir())


def test_damaged_local_copy_is_detected_and_refetched(mirror, tmp_path):
    fetch(mirror, tmp_path).run()
    target = tmp_path / "srv" / "m" / mirror[2]
    target.chmod(0o755)
    flip_byte(target / "model.safetensors")
    result = fetch(mirror, tmp_path).run()
    assert result.changed
    assert "re-fetched damaged local copy" in result.actions[0]
    assert (target / "model.safetensors").read_bytes() == b"\x01" * 300_000


def test_stamp_skips_rehash_until_a_file_changes(mirror, tmp_path, monkeypatch):
    fetch(mirror, tmp_path).run()
    target = tmp_path / "srv" / "m" / mirror[2]
    manifest = load_local_manifest(target)
    hashed = []
    real = weights.sha256_files
    monkeypatch.setattr(
        weights, "sha256_files", lambda paths, *a, **k: hashed.extend(paths) or real(paths, *a, **k)
    )
    assert verify_dir(target, manifest, full=False, workers=2) == []
    assert hashed == []
    assert verify_dir(target, manifest, full=True, workers=2) == []
    assert len(hashed) == 4


def test_old_revisions_are_pruned_beyond_keep(mirror, tmp_path):
    _, mirror_dir, first = mirror
    revisions = [first]
    for i in range(2):
        revisions.append(
            publish("m", make_model(tmp_path / f"s{i}", weights=bytes([i + 5]) * 1000), mirror_dir)
        )
    for index, revision in enumerate(revisions):
        fetch(mirror, tmp_path, revision=revision, keep=2).run()
        os.utime(tmp_path / "srv" / "m" / revision, (1000 + index, 1000 + index))
    remaining = sorted(p.name for p in (tmp_path / "srv" / "m").iterdir() if p.name != "current")
    assert remaining == sorted(revisions[1:])
    assert not (tmp_path / "srv" / "m" / MANIFEST_NAME).exists()


def test_an_unchanged_model_is_not_rewritten(mirror, tmp_path):
    fetch(mirror, tmp_path).run()
    stamp = tmp_path / "srv" / "m" / mirror[2] / ".vllm-fleet-verified.json"
    before = stamp.stat().st_mtime_ns
    fetch(mirror, tmp_path).run()
    assert stamp.stat().st_mtime_ns == before


@pytest.mark.parametrize(
    ("name", "revision"),
    [("..", None), (".", None), ("../x", None), ("a/b", None), ("-rf", None), ("m", "../../etc")],
)
def test_a_name_or_revision_that_leaves_the_models_root_is_refused_before_any_change(
    mirror, tmp_path, name, revision
):
    """A fleet_models key of '..' once made a fetch prune the models root's siblings."""
    sibling = tmp_path / "sibling"
    sibling.mkdir()
    (sibling / "keep.txt").write_text("not the fleet's\n")
    url, _, rev = mirror
    with pytest.raises(WeightsError, match="is not one directory name under"):
        MirrorFetch(name=name, revision=revision or rev, base_url=url, root=tmp_path / "srv").run()
    assert (sibling / "keep.txt").read_text() == "not the fleet's\n"
    assert not (tmp_path / "srv").exists()
