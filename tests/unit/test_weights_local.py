"""The local (pre-staged directory) weights source, and the unexpected-file check of verify_dir."""

import json
import os
import re
import shutil
import stat

import pytest

from tests.unit.conftest import make_model
from vllm_fleet.weights.base import (
    MANIFEST_NAME,
    STAMP_NAME,
    WeightsError,
    load_local_manifest,
    verify_dir,
)
from vllm_fleet.weights.local import LocalFetch
from vllm_fleet.weights.manifest import Manifest
from vllm_fleet.weights.mirror import MirrorFetch
from vllm_fleet.weights.publish import publish

FILES = ["config.json", "model.safetensors", "sub/extra.txt", "tokenizer.json"]


@pytest.fixture
def media(tmp_path):
    """A mirror tree as an operator would carry it: <media>/m/<revision>/ with manifest.json."""
    root = tmp_path / "media" / "m"
    old = publish("m", make_model(tmp_path / "src1"), root)
    new = publish("m", make_model(tmp_path / "src2", weights=b"\x02" * 300_000), root)
    return root, old, new


def fetch(tmp_path, path, revision, **kwargs):
    return LocalFetch(name="m", revision=revision, path=path, root=tmp_path / "srv", **kwargs)


def model_dir(tmp_path):
    return tmp_path / "srv" / "m"


def listing(tmp_path):
    """What is served: staging directories (kept for a resume) are not."""
    return sorted(
        p.name for p in model_dir(tmp_path).iterdir() if not p.name.startswith(".staging-")
    )


@pytest.fixture
def installed(tmp_path, media):
    """The old revision installed and current; each test then fails to install the new one."""
    root, old, new = media
    fetch(tmp_path, root / old, old).run()
    return root / new, old, new


def assert_previous_serves(tmp_path, old):
    assert listing(tmp_path) == sorted(["current", old])
    assert os.readlink(model_dir(tmp_path) / "current") == old
    target = model_dir(tmp_path) / old
    assert verify_dir(target, load_local_manifest(target), full=True, workers=2) == []


def flip_byte(path, offset=1000):
    data = bytearray(path.read_bytes())
    data[offset] ^= 1
    path.write_bytes(bytes(data))


def test_install_copies_verified_files_with_manifest_stamp_and_current(tmp_path, media):
    root, old, _ = media
    staged = root / old
    before = {p: (p.stat().st_mode, p.stat().st_mtime_ns) for p in staged.rglob("*")}
    progress = []
    result = fetch(tmp_path, staged, old, report=progress.append).run()
    target = model_dir(tmp_path) / old
    assert result.changed
    assert result.files == 4
    assert result.actions[:2] == ["fetched 4 files", f"current -> {old}"]
    for name in FILES:
        assert (target / name).read_bytes() == (staged / name).read_bytes()
        assert stat.S_IMODE((target / name).stat().st_mode) == 0o444
    manifest = load_local_manifest(target)
    assert manifest.revision_id() == old
    record = json.loads((target / MANIFEST_NAME).read_text())
    assert record["source"] == "local"
    assert record["path"] == str(staged)
    assert record["revision"] == old
    assert (target / STAMP_NAME).is_file()
    assert sorted(p.name for p in target.iterdir()) == sorted(
        ["config.json", "model.safetensors", "sub", "tokenizer.json", MANIFEST_NAME, STAMP_NAME]
    )
    assert listing(tmp_path) == sorted(["current", old])
    assert progress[-1].startswith(f"copy m@{old[:12]}: ")
    # The staged directory is only read.
    assert {p: (p.stat().st_mode, p.stat().st_mtime_ns) for p in staged.rglob("*")} == before

    stamp = target / STAMP_NAME
    mtime = stamp.stat().st_mtime_ns
    again = fetch(tmp_path, staged, old).run()
    assert not again.changed
    assert again.actions == []
    assert not fetch(tmp_path, staged, old).needs_change()
    assert stamp.stat().st_mtime_ns == mtime


def test_same_revision_from_the_mirror_counts_as_installed(tmp_path, media, http_dir):
    # The revision pins every byte, so it does not matter which source put it there.
    root, old, _ = media
    base_url, served = http_dir
    shutil.copytree(root, served / "m")
    MirrorFetch(name="m", revision=old, base_url=base_url + "/m", root=tmp_path / "srv").run()
    again = fetch(tmp_path, root / old, old).run()
    assert not again.changed


def test_explicit_manifest_outside_the_directory(tmp_path, media):
    root, old, _ = media
    staged = tmp_path / "usb" / "files"
    shutil.copytree(root / old, staged)
    manifest = tmp_path / "usb" / "m.manifest.json"
    (staged / "manifest.json").rename(manifest)
    fetch(tmp_path, staged, old, manifest=manifest).run()
    assert os.readlink(model_dir(tmp_path) / "current") == old
    # Without it, the default <path>/manifest.json is missing: a clear error.
    with pytest.raises(WeightsError, match=r"cannot read the manifest .*manifest\.json"):
        fetch(tmp_path / "other", staged, old).run()


def test_path_that_is_not_a_directory(tmp_path, installed):
    _, old, new = installed
    with pytest.raises(WeightsError) as err:
        fetch(tmp_path, tmp_path / "nowhere", new).run()
    assert f"model m revision {new} from {tmp_path / 'nowhere'}: " in str(err.value)
    assert "is not a directory" in str(err.value)
    assert_previous_serves(tmp_path, old)


def test_manifest_of_another_revision_is_refused(tmp_path, installed):
    staged, old, new = installed
    # The operator staged the new revision, but the inventory still pins (say) the old one.
    with pytest.raises(WeightsError) as err:
        fetch(tmp_path, staged, "0" * 64).run()
    message = str(err.value)
    assert f"has id {new}, expected the pinned revision {'0' * 64}" in message
    assert "previous revision stays in place" in message
    assert_previous_serves(tmp_path, old)


def test_edited_manifest_is_refused_by_the_pin(tmp_path, installed):
    staged, old, new = installed
    manifest = Manifest.model_validate_json((staged / "manifest.json").read_text())
    config = staged / "config.json"
    config.write_text('{"model_type": "evil"}\n')
    # Someone swaps a file and fixes up the manifest to match: only the pin catches it.
    edited = manifest.model_copy(
        update={
            "files": [
                f.model_copy(update={"size": config.stat().st_size})
                if f.path == "config.json"
                else f
                for f in manifest.files
            ]
        }
    )
    (staged / "manifest.json").write_bytes(edited.canonical_bytes())
    with pytest.raises(WeightsError, match="expected the pinned revision"):
        fetch(tmp_path, staged, new).run()
    assert_previous_serves(tmp_path, old)


def test_corrupt_file_names_file_and_both_hashes(tmp_path, installed):
    staged, old, new = installed
    expected = next(
        f.sha256
        for f in Manifest.model_validate_json((staged / "manifest.json").read_text()).files
        if f.path == "model.safetensors"
    )
    flip_byte(staged / "model.safetensors")
    with pytest.raises(WeightsError) as err:
        fetch(tmp_path, staged, new).run()
    message = str(err.value)
    assert f"model.safetensors: sha256 mismatch: expected {expected}, got " in message
    assert "Nothing was installed; the previous revision stays in place" in message
    assert_previous_serves(tmp_path, old)


def test_truncated_and_missing_files_are_named(tmp_path, installed):
    staged, old, new = installed
    weights = staged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    (staged / "sub" / "extra.txt").unlink()
    with pytest.raises(WeightsError) as err:
        fetch(tmp_path, staged, new).run()
    message = str(err.value)
    assert "model.safetensors: size 1000, expected 300000" in message
    assert "sub/extra.txt: missing" in message
    assert_previous_serves(tmp_path, old)


def test_unlisted_files_are_refused_by_name(tmp_path, installed):
    staged, old, new = installed
    (staged / "notes.txt").write_text("left over\n")
    (staged / "sub" / ".DS_Store").write_bytes(b"\0")
    with pytest.raises(WeightsError) as err:
        fetch(tmp_path, staged, new).run()
    message = str(err.value)
    assert "notes.txt: not in the manifest (unexpected file)" in message
    assert "sub/.DS_Store: not in the manifest (unexpected file)" in message
    assert "previous revision stays in place" in message
    assert_previous_serves(tmp_path, old)


def test_listed_file_that_is_a_link_is_refused(tmp_path, installed):
    staged, old, new = installed
    real = tmp_path / "elsewhere.json"
    shutil.move(staged / "config.json", real)
    (staged / "config.json").symlink_to(real)
    with pytest.raises(WeightsError, match=r"config\.json: not a regular file"):
        fetch(tmp_path, staged, new).run()
    assert_previous_serves(tmp_path, old)


@pytest.mark.parametrize("revision", ["main", "a" * 40, "A" * 64, "a" * 65])
def test_revision_that_is_not_a_manifest_id_is_refused(tmp_path, media, revision):
    root, old, _ = media
    with pytest.raises(
        WeightsError,
        match=re.escape(f"revision={revision!r} is not pinned for source=local: pin the 64-hex"),
    ):
        fetch(tmp_path, root / old, revision)
    assert not (tmp_path / "srv").exists()


def test_not_enough_disk_space_is_refused_before_copying(tmp_path, installed):
    staged, old, new = installed
    with pytest.raises(WeightsError, match="GB free; free space"):
        fetch(tmp_path, staged, new, margin_bytes=1 << 60).run()
    assert_previous_serves(tmp_path, old)


# --- verify_dir: an unexpected file inside an installed revision ---------------------------


def test_unexpected_file_in_an_installed_revision_is_a_problem_and_refetched(tmp_path, media):
    root, old, _ = media
    fetch(tmp_path, root / old, old).run()
    target = model_dir(tmp_path) / old
    manifest = load_local_manifest(target)
    # vllm-fleet's own files are not unexpected.
    assert verify_dir(target, manifest, full=False, workers=2) == []
    (target / "sub").chmod(0o755)
    (target / "sub" / "planted.py").write_text("import os\n")
    (target / "sub" / "link").symlink_to("/etc")
    assert verify_dir(target, manifest, full=False, workers=2) == [
        "sub/link: not in the manifest (unexpected file)",
        "sub/planted.py: not in the manifest (unexpected file)",
    ]
    result = fetch(tmp_path, root / old, old).run()
    assert result.changed
    assert result.actions[0].startswith("re-fetched damaged local copy: sub/link: not in the")
    assert not (target / "sub" / "planted.py").exists()
    assert_previous_serves(tmp_path, old)
