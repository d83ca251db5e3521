"""Hash locks resolved by pip from wheel metadata (no wheel downloads)."""

import socket

import pytest

from vllm_fleet.wheels.lock import lock_from_report, resolve_command, resolve_lock, unhashed_entries

SHA = "ab" * 32


def item(name, version, url, sha=SHA):
    hashes = {"sha256": sha} if sha else {}
    return {
        "metadata": {"name": name, "version": version},
        "download_info": {"url": url, "archive_info": {"hashes": hashes}},
    }


def test_report_becomes_sorted_canonical_lines_minus_excluded():
    report = {
        "install": [
            item(
                "Typing_Extensions", "4.15.0", "https://x/typing_extensions-4.15.0-py3-none-any.whl"
            ),
            item("torch", "2.14.0", "https://x/torch-2.14.0-cp311-cp311-manylinux_2_28_x86_64.whl"),
            item("triton", "3.8.0", "https://x/triton-3.8.0-cp311-cp311-manylinux_2_28_x86_64.whl"),
        ]
    }
    assert lock_from_report(report, {"Triton"}) == [
        f"torch==2.14.0 --hash=sha256:{SHA}",
        f"typing-extensions==4.15.0 --hash=sha256:{SHA}",
    ]


@pytest.mark.parametrize(
    "bad",
    [
        item("foo", "1.0", "https://x/foo-1.0.tar.gz"),
        item("foo", "1.0", "https://x/foo-1.0-py3-none-any.whl", sha=""),
    ],
)
def test_an_sdist_or_a_file_without_hash_is_refused(bad):
    with pytest.raises(ValueError, match="foo: resolved to"):
        lock_from_report({"install": [bad]})


def test_resolve_command_targets_the_platform_without_installing(tmp_path):
    argv = resolve_command(
        ["vllm==0.33.0"], tmp_path / "r.json", extra_index_urls=["https://i/simple"]
    )
    assert argv[:3] == ["install", "--dry-run", "--ignore-installed"]
    assert "--only-binary=:all:" in argv
    assert argv[argv.index("--python-version") + 1] == "3.11"
    assert "manylinux_2_28_x86_64" in argv
    assert "manylinux2014_x86_64" in argv
    assert argv[argv.index("--extra-index-url") + 1] == "https://i/simple"
    assert argv[-1] == "vllm==0.33.0"


def test_unhashed_entries_are_named():
    text = (
        "# header\n"
        f"torch-npu==2.10.0.post4 --hash=sha256:{SHA}\n"
        "triton-ascend==3.2.2  # hash: fill in when the Ascend index is reachable\n"
    )
    assert unhashed_entries(text) == ["triton-ascend==3.2.2"]


def pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
    except OSError:
        return False
    return True


@pytest.mark.skipif(not pypi_reachable(), reason="PyPI is not reachable from here")
def test_a_real_resolution_follows_dependencies(tmp_path):
    constraints = tmp_path / "c.txt"
    constraints.write_text("typing-extensions==4.15.0\n")
    # typing-inspection depends on typing-extensions: the lock holds both, hashed.
    lines = resolve_lock(["typing-inspection==0.4.2"], tmp_path, constraints=constraints)
    assert lines == [
        "typing-extensions==4.15.0 --hash=sha256:"
        "f0fa19c6845758ab08074a0cfa8b7aecb71c999ca73d62883bc25cc018c4e548",
        "typing-inspection==0.4.2 --hash=sha256:"
        "4ed1cacbdc298c220f1bd249ed5287caa16f34d44ef4e9c3d0cbad5b521545e7",
    ]
