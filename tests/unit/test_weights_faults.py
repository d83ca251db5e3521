"""Weights under faults: a download cut off and resumed, a full disk, a concurrent fetch, and
the fleet's cache host (fetched once upstream, every engine host verifying what it got)."""

from __future__ import annotations

import fcntl
import hashlib
import http.server
import json
import os
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.tls import host_certificate
from tests.unit.conftest import make_model
from vllm_fleet.tls.ca import CA_CERT, FleetCa, init_ca, load_ca
from vllm_fleet.weights.base import CURRENT_LINK, MANIFEST_NAME, DiskFullError, WeightsError
from vllm_fleet.weights.cache import CacheFetch
from vllm_fleet.weights.mirror import MirrorFetch
from vllm_fleet.weights.publish import publish

WEIGHTS = bytes(range(256)) * 1200  # 307,200 bytes, not one repeated byte: offsets matter


@dataclass
class RangeServer:
    """A static file server that honours ``Range`` (as nginx does) and can cut a file off."""

    root: Path
    cut: dict[str, int] = field(default_factory=dict)  # URL path -> bytes sent before dropping
    ranges: list[tuple[str, str | None]] = field(default_factory=list)
    url: str = ""
    # As the cache's nginx: with a token set, 401 for any request without "Bearer <token>".
    token: str = ""
    authorizations: list[str | None] = field(default_factory=list)


def _handler(state: RangeServer) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *_args: object) -> None:
            pass

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            state.ranges.append((path, self.headers.get("Range")))
            state.authorizations.append(self.headers.get("Authorization"))
            if state.token and self.headers.get("Authorization") != f"Bearer {state.token}":
                self.send_error(401)
                return
            file = state.root / path.lstrip("/")
            if not file.is_file():
                self.send_error(404)
                return
            data = file.read_bytes()
            start = 0
            header = self.headers.get("Range")
            if header:
                start = int(header.removeprefix("bytes=").split("-")[0])
                if start >= len(data):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            body = data[start:]
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            limit = state.cut.get(path)
            if limit is not None:
                # Announce the whole body, send part of it, drop the connection.
                self.wfile.write(body[: max(0, limit - start)])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(body)

    return Handler


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RangeServer]:
    state = RangeServer(root=tmp_path / "served")
    state.root.mkdir()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def mirror(server: RangeServer, tmp_path: Path) -> tuple[str, str]:
    """(base URL, revision) of a published model served with Range support."""
    revision = publish("m", make_model(tmp_path / "src", WEIGHTS), server.root / "models" / "m")
    return f"{server.url}/models/m", revision


def mirror_fetch(mirror: tuple[str, str], root: Path, **kwargs: object) -> MirrorFetch:
    url, revision = mirror
    return MirrorFetch(name="m", revision=revision, base_url=url, root=root, **kwargs)  # type: ignore[arg-type]


def old_revision(root: Path) -> str:
    """Install an older revision by hand (as a previous run did) and point current at it."""
    old = root / "m" / ("a" * 64)
    old.mkdir(parents=True)
    (old / "config.json").write_text("{}")
    (root / "m" / CURRENT_LINK).symlink_to(old.name)
    return old.name


def test_an_interrupted_download_fails_clearly_then_resumes_where_it_stopped(
    server: RangeServer, mirror: tuple[str, str], tmp_path: Path
) -> None:
    root = tmp_path / "srv"
    previous = old_revision(root)
    path = f"/models/m/{mirror[1]}/model.safetensors"
    server.cut[path] = 100_000

    with pytest.raises(WeightsError) as err:
        mirror_fetch(mirror, root).run()
    message = str(err.value)
    assert "model.safetensors" in message
    assert "previous revision stays in place" in message
    # Still serving the previous revision; the part already fetched is kept for the resume.
    assert os.readlink(root / "m" / CURRENT_LINK) == previous
    assert not (root / "m" / mirror[1]).exists()
    staged = root / "m" / f".staging-{mirror[1]}" / "model.safetensors"
    assert staged.stat().st_size == 100_000

    del server.cut[path]
    server.ranges.clear()
    result = mirror_fetch(mirror, root).run()
    assert result.changed
    assert (server_path := (path, "bytes=100000-")) in server.ranges, server.ranges
    assert [r for r in server.ranges if r[0] == server_path[0]] == [server_path]
    installed = root / "m" / mirror[1] / "model.safetensors"
    assert installed.read_bytes() == WEIGHTS
    assert os.readlink(root / "m" / CURRENT_LINK) == mirror[1]
    assert not list((root / "m").glob(".staging-*"))


def test_a_resume_never_continues_a_corrupt_partial_file(
    server: RangeServer, mirror: tuple[str, str], tmp_path: Path
) -> None:
    root = tmp_path / "srv"
    path = f"/models/m/{mirror[1]}/model.safetensors"
    server.cut[path] = 100_000
    with pytest.raises(WeightsError):
        mirror_fetch(mirror, root).run()
    staged = root / "m" / f".staging-{mirror[1]}" / "model.safetensors"
    with staged.open("r+b") as handle:  # damage the kept part
        handle.seek(10)
        handle.write(b"\xff\xff")
    del server.cut[path]
    with pytest.raises(WeightsError, match=r"model\.safetensors: sha256 mismatch"):
        mirror_fetch(mirror, root).run()
    assert not staged.exists()  # the bad bytes are gone: the next run starts that file over
    assert mirror_fetch(mirror, root).run().changed
    assert (root / "m" / mirror[1] / "model.safetensors").read_bytes() == WEIGHTS


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 256 KiB tmpfs: smaller than the model's weights file."""
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_too_little_free_space_is_refused_before_any_download(
    server: RangeServer, mirror: tuple[str, str], small_disk: Path
) -> None:
    with pytest.raises(WeightsError) as err:
        mirror_fetch(mirror, small_disk).run()
    assert "GB free; free space or move model_weights_root" in str(err.value)
    assert not [r for r in server.ranges if r[0].endswith(".safetensors")]


def test_a_disk_that_fills_during_the_fetch_fails_naming_the_file_and_frees_the_staging(
    server: RangeServer, mirror: tuple[str, str], small_disk: Path
) -> None:
    previous = old_revision(small_disk)
    # Another writer took the space after the free-space check: model it by a margin that
    # lets the check pass on a disk that cannot hold the model.
    fetch = mirror_fetch(mirror, small_disk, margin_bytes=-(1024**3))
    with pytest.raises(DiskFullError) as err:
        fetch.run()
    assert "model.safetensors: no space left on device" in str(err.value)
    assert os.readlink(small_disk / "m" / CURRENT_LINK) == previous
    assert not list((small_disk / "m").glob(".staging-*"))


def test_a_second_fetch_on_the_same_host_is_refused_while_one_runs(
    mirror: tuple[str, str], tmp_path: Path
) -> None:
    root = tmp_path / "srv"
    root.mkdir()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(WeightsError, match="another model fetch is running on this host"):
            mirror_fetch(mirror, root).run()
    finally:
        os.close(fd)
    assert mirror_fetch(mirror, root).run().changed


# --- the cache host ----------------------------------------------------------------------


@pytest.fixture
def cache(server: RangeServer, mirror: tuple[str, str]) -> dict[str, object]:
    """The cache host's models root (served over HTTP) holding a verified install."""
    result = mirror_fetch(mirror, server.root / "cache").run()
    assert result.changed
    return {"source": "mirror", "url": mirror[0]}


def held_manifest_sha256(server: RangeServer, mirror: tuple[str, str]) -> str:
    """What model_weights reads on the cache host over the controller's connection."""
    held = server.root / "cache" / "m" / mirror[1] / MANIFEST_NAME
    return hashlib.sha256(held.read_bytes()).hexdigest() if held.is_file() else "0" * 64


def cache_fetch(
    server: RangeServer,
    mirror: tuple[str, str],
    root: Path,
    wanted: dict[str, object],
    *,
    pin: str | None = None,
    token: str = "",
) -> CacheFetch:
    return CacheFetch(
        name="m",
        revision=mirror[1],
        base_url=f"{server.url}/cache",
        upstream=wanted,
        root=root,
        manifest_sha256=pin or held_manifest_sha256(server, mirror),
        token=token,
    )


def test_engine_hosts_fetch_from_the_cache_host_and_verify_every_file(
    server: RangeServer, mirror: tuple[str, str], cache: dict[str, object], tmp_path: Path
) -> None:
    server.ranges.clear()
    for host in ("engine01", "engine02"):
        root = tmp_path / host
        result = cache_fetch(server, mirror, root, cache).run()
        assert result.changed
        assert (root / "m" / mirror[1] / "model.safetensors").read_bytes() == WEIGHTS
        assert not cache_fetch(server, mirror, root, cache).run().changed
    # Nothing went upstream: both hosts read the cache host only.
    assert {p for p, _ in server.ranges if p.endswith(".safetensors")} == {
        f"/cache/m/{mirror[1]}/model.safetensors"
    }


def test_a_damaged_cache_copy_is_refused_by_the_engine_host(
    server: RangeServer, mirror: tuple[str, str], cache: dict[str, object], tmp_path: Path
) -> None:
    cached = server.root / "cache" / "m" / mirror[1] / "model.safetensors"
    cached.chmod(0o644)
    with cached.open("r+b") as handle:
        handle.seek(5000)
        handle.write(b"\x00")
    root = tmp_path / "engine01"
    previous = old_revision(root)
    with pytest.raises(WeightsError) as err:
        cache_fetch(server, mirror, root, cache).run()
    assert "model.safetensors: sha256 mismatch" in str(err.value)
    assert os.readlink(root / "m" / CURRENT_LINK) == previous


def test_a_cache_copy_of_another_origin_is_refused(
    server: RangeServer, mirror: tuple[str, str], cache: dict[str, object], tmp_path: Path
) -> None:
    wanted = {**cache, "url": "https://elsewhere.example/models/m"}
    with pytest.raises(WeightsError) as err:
        cache_fetch(server, mirror, tmp_path / "engine01", wanted).run()
    assert "the cache host holds a different copy" in str(err.value)
    assert "wanted 'https://elsewhere.example/models/m'" in str(err.value)


def test_a_manifest_altered_on_the_way_is_refused_before_any_file(
    server: RangeServer, mirror: tuple[str, str], cache: dict[str, object], tmp_path: Path
) -> None:
    """Another host at the cache's address (or a proxy on the way) serves a manifest that
    lists its own weights with their own hashes: every file would verify against it, so the
    pin read on the cache host itself is what refuses it."""
    pin = held_manifest_sha256(server, mirror)
    served = server.root / "cache" / "m" / mirror[1]
    served.chmod(0o755)
    forged_weights = bytes(reversed(WEIGHTS))
    (served / "model.safetensors").chmod(0o644)
    (served / "model.safetensors").write_bytes(forged_weights)
    manifest = json.loads((served / MANIFEST_NAME).read_text())
    for entry in manifest["files"]:
        if entry["path"] == "model.safetensors":
            entry["sha256"] = hashlib.sha256(forged_weights).hexdigest()
    (served / MANIFEST_NAME).chmod(0o644)
    (served / MANIFEST_NAME).write_text(json.dumps(manifest))
    root = tmp_path / "engine01"
    previous = old_revision(root)
    server.ranges.clear()
    with pytest.raises(WeightsError) as err:
        cache_fetch(server, mirror, root, cache, pin=pin).run()
    assert f"the cache host's own copy {pin}" in str(err.value)
    assert "nothing was installed" in str(err.value)
    assert os.readlink(root / "m" / CURRENT_LINK) == previous
    assert not (root / "m" / mirror[1]).exists()
    # Refused on the manifest: not one weights byte was asked for.
    assert [p for p, _ in server.ranges if p.endswith(".safetensors")] == []


def test_the_cache_token_goes_to_the_cache_and_a_missing_one_is_named(
    server: RangeServer, mirror: tuple[str, str], cache: dict[str, object], tmp_path: Path
) -> None:
    server.token = "t" * 40
    with pytest.raises(WeightsError, match="refused this host's token"):
        cache_fetch(server, mirror, tmp_path / "e1", cache).run()
    server.authorizations.clear()
    assert cache_fetch(server, mirror, tmp_path / "e2", cache, token="t" * 40).run().changed
    assert set(server.authorizations) == {f"Bearer {'t' * 40}"}


def serve_tls(state: RangeServer, ca: FleetCa, tmp_path: Path) -> http.server.HTTPServer:
    """The same files over HTTPS, with a certificate ``ca`` issued for 127.0.0.1 (as nginx
    serves the cache with the host's certificate from host_tls)."""
    cert, key = host_certificate(ca, tmp_path, ["cache01"], ["127.0.0.1"])
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def test_over_https_only_the_fleet_ca_is_trusted(
    server: RangeServer, mirror: tuple[str, str], cache: dict[str, object], tmp_path: Path
) -> None:
    init_ca(tmp_path / "fleet-ca")
    fleet = load_ca(tmp_path / "fleet-ca")
    init_ca(tmp_path / "rogue-ca")
    rogue = load_ca(tmp_path / "rogue-ca")
    for issuer, name in ((fleet, "fleet"), (rogue, "rogue")):
        (tmp_path / name).mkdir()
        httpd = serve_tls(server, issuer, tmp_path / name)
        base = f"https://127.0.0.1:{httpd.server_address[1]}/cache"
        try:
            fetch = cache_fetch(server, mirror, tmp_path / f"e-{name}", cache)
            fetch.base_url = base
            fetch.ca_cert = str(tmp_path / "fleet-ca" / CA_CERT)
            if issuer is fleet:
                assert fetch.run().changed
            else:
                # The same address and name, another CA: refused at the handshake.
                with pytest.raises(WeightsError, match="CERTIFICATE_VERIFY_FAILED"):
                    fetch.run()
                assert not (tmp_path / f"e-{name}" / "m" / mirror[1]).exists()
            # No CA given for an https cache: refused, not trusted to the system's CAs.
            bare = cache_fetch(server, mirror, tmp_path / f"bare-{name}", cache)
            bare.base_url = base
            with pytest.raises(WeightsError, match="no CA was given to check it with"):
                bare.run()
        finally:
            httpd.shutdown()
            httpd.server_close()


def test_a_missing_cache_copy_says_to_run_the_cache_play(
    server: RangeServer, mirror: tuple[str, str], tmp_path: Path
) -> None:
    with pytest.raises(WeightsError, match="is the cache play done and its server up"):
        cache_fetch(server, mirror, tmp_path / "e", {"source": "mirror"}).run()


def test_an_unfinished_fetch_of_a_revision_no_longer_pinned_is_removed(
    server: RangeServer, mirror: tuple[str, str], tmp_path: Path
) -> None:
    root = tmp_path / "srv"
    stale = root / "m" / f".staging-{'f' * 64}"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"partial")
    result = mirror_fetch(mirror, root).run()
    assert f"removed the unfinished .staging-{'f' * 64}" in result.actions
    assert not stale.exists()
