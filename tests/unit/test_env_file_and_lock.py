import zipfile

import pytest

from vllm_fleet.env_file import read_env_file
from vllm_fleet.weights.hashing import sha256_file
from vllm_fleet.wheels.lock import lock_lines, parse_lock


def test_env_file_reads_quoted_values_and_skips_comments(tmp_path):
    path = tmp_path / "g0.env"
    path.write_text("# comment\nVLLM_API_KEY='a b$c'\n\nPLAIN=x\n;other\nEMPTY=\n")
    assert read_env_file(path) == {"VLLM_API_KEY": "a b$c", "PLAIN": "x", "EMPTY": ""}


def make_wheel(directory, name):
    path = directory / name
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x.py", name)
    return path


def test_lock_pins_name_version_and_hash_and_excludes(tmp_path):
    keep = make_wheel(tmp_path, "Foo_Bar-1.2.3-py3-none-any.whl")
    make_wheel(tmp_path, "torchvision-0.28.0-cp311-cp311-manylinux_2_28_x86_64.whl")
    make_wheel(tmp_path, "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
    lines = lock_lines(tmp_path, {"torchvision"})
    assert lines[0] == f"foo-bar==1.2.3 --hash=sha256:{sha256_file(keep)}"
    assert lines[1].startswith("torch==2.13.0+cpu --hash=sha256:")
    assert len(lines) == 2
    parsed = parse_lock("# header\n" + "\n".join(lines))
    assert parsed["foo-bar"] == ("1.2.3", sha256_file(keep))


def test_two_versions_of_one_package_are_refused(tmp_path):
    make_wheel(tmp_path, "foo-1.0-py3-none-any.whl")
    make_wheel(tmp_path, "foo-2.0-py3-none-any.whl")
    with pytest.raises(ValueError, match="two wheels for foo"):
        lock_lines(tmp_path, set())
