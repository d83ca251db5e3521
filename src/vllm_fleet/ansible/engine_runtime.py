"""Filters of the engine_runtime role: where pip takes a stack's locked wheels from."""

from __future__ import annotations

from urllib.parse import urlsplit

SOURCES = ("wheelhouse", "index")


def pip_source_args(
    source: str,
    stack: str,
    wheelhouse_url: str,
    index_url: str = "",
    extra_index_urls: list[str] | None = None,
) -> list[str]:
    """pip's arguments for the wheels' origin. Either way pip runs --no-deps
    --require-hashes against the lock, so the origin never decides which bytes install."""
    if source == "wheelhouse":
        host = urlsplit(wheelhouse_url).hostname or "localhost"
        # Plain http is fine: every wheel's sha256 is pinned by the lock.
        return [
            "--no-index",
            f"--trusted-host={host}",
            "--find-links",
            f"{wheelhouse_url.rstrip('/')}/{stack}/",
        ]
    if source == "index":
        if not index_url:
            raise ValueError("engine_runtime_source=index needs engine_runtime_index_url")
        args = ["--index-url", index_url]
        for url in extra_index_urls or []:
            if url and url != index_url:
                args += ["--extra-index-url", url]
        return args
    raise ValueError(f"engine_runtime_source={source!r}: use one of {', '.join(SOURCES)}")


FILTERS = {
    "engine_runtime_pip_source_args": pip_source_args,
}
