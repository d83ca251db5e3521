"""sha256 of files, read in large blocks, several files at once."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# Large reads keep hashing close to disk bandwidth; hashlib releases the GIL
# on updates this size, so threads hash in parallel.
BLOCK_SIZE = 8 * 1024 * 1024

ProgressFn = Callable[[int], None]


def sha256_file(path: Path, progress: ProgressFn | None = None) -> str:
    digest = hashlib.sha256()
    with path.open("rb", buffering=0) as handle:
        while block := handle.read(BLOCK_SIZE):
            digest.update(block)
            if progress is not None:
                progress(len(block))
    return digest.hexdigest()


def sha256_files(
    paths: Iterable[Path], workers: int, progress: ProgressFn | None = None
) -> dict[Path, str]:
    """Hash every path; returns {path: hexdigest}."""
    items = list(paths)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        digests = pool.map(lambda p: sha256_file(p, progress), items)
        return dict(zip(items, digests, strict=True))
