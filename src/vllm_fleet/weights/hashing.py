"""sha256 of files, read in large blocks, several files at once."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# Large reads keep hashing close to disk bandwidth; hashlib releases the GIL
# on updates this size, so threads hash in parallel.
BLOCK_SIZE = 8 * 1024 * 1024

ProgressFn = Callable[[int], None]


def sha256_file(path: Path, progress: ProgressFn | None = None) -> str:
    digest = hashlib.sha256()
    # One buffer refilled with readinto, not a fresh 8 MiB bytes object per read: no
    # allocation per block, and none of the mmap/munmap and page faults (which take the
    # process-wide memory map lock, shared by every hashing thread) that malloc may use
    # for blocks this size.
    buffer = bytearray(BLOCK_SIZE)
    view = memoryview(buffer)
    with path.open("rb", buffering=0) as handle:
        if hasattr(os, "posix_fadvise"):
            # Read once, front to back: a larger readahead window when the file is cold.
            os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        while count := handle.readinto(buffer):
            digest.update(view[:count])
            if progress is not None:
                progress(count)
    return digest.hexdigest()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0  # hashing it raises the real error


def sha256_files(
    paths: Iterable[Path], workers: int, progress: ProgressFn | None = None
) -> dict[Path, str]:
    """Hash every path, one file per thread at a time; returns {path: hexdigest}.

    A file is hashed by one thread (sha256 is sequential), so the parallelism is across
    files: largest first, so the pool's tail is small files rather than one big shard
    hashed alone while the other cores idle.
    """
    items = list(paths)
    order = sorted(set(items), key=_size, reverse=True)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        found = dict(zip(order, pool.map(lambda p: sha256_file(p, progress), order), strict=True))
    return {path: found[path] for path in items}
