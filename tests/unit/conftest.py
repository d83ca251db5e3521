"""Shared fixtures: a real HTTP mirror on loopback serving a directory."""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def http_dir(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """(base URL, directory) of a real HTTP server on 127.0.0.1 serving that directory."""
    root = tmp_path / "mirror"
    root.mkdir()
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()


def make_model(path: Path, weights: bytes = b"\x01" * 300_000) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text('{"model_type": "llama"}\n')
    (path / "tokenizer.json").write_text('{"version": "1.0"}\n')
    (path / "model.safetensors").write_bytes(weights)
    (path / "sub").mkdir(exist_ok=True)
    (path / "sub" / "extra.txt").write_text("nested file\n")
    return path


@pytest.fixture(scope="session")
def promtool() -> Path:
    """Prometheus's promtool, unpacked from Debian's package into the lab cache."""
    from vllm_fleet.lab import promtool as tools
    from vllm_fleet.lab.paths import LabPaths

    return tools.promtool(LabPaths.default())
