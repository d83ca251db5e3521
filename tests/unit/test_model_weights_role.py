"""The model_weights role, run for real on the controller against the Hub fixture (paths in a
temporary directory): an hf model with a Vault token is installed, the token never shows in
the -vvv output or on any process's command line during the run, a second run changes
nothing, check mode changes nothing, and a bad model setting is refused before anything is
created."""

from __future__ import annotations

import os
import random
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from tests.fixtures.hub_server import FakeHub
from tests.support.playbook import changed_count, role_play, run_play

TOKEN = "hf_roleSecret0123456789abcdefXYZ"
REPO = "org/role-model"


@pytest.fixture
def hub():
    with FakeHub(REPO) as server:
        server.require_token(TOKEN)
        yield server


@contextmanager
def command_lines_watched(secret: str) -> Iterator[list[str]]:
    """Every process's command line, read over and over while the block runs: those that
    held ``secret`` (a token passed on argv is readable by every user of the host)."""
    seen: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    argv = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                if secret in argv:
                    seen.append(argv)
            stop.wait(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield seen
    finally:
        stop.set()
        watcher.join()


def commit(hub: FakeHub, seed: int) -> str:
    files = {
        "config.json": b'{"model_type": "llama", "seed": %d}\n' % seed,
        "tokenizer.json": b'{"version": "1.0"}\n',
        "model.safetensors": random.Random(seed).randbytes(400_000),
    }
    return hub.commit(files, lfs=["model.safetensors"])


def run_role(
    tmp_path: Path, model: dict[str, object], *args: str, **overrides: object
) -> tuple[int, int, str]:
    variables = {
        "fleet_engine_groups": [{"name": "g0", "model": "m"}],
        "fleet_models": {"m": {"served_name": "m", **model}},
        "fleet_hf_token": TOKEN,
        "model_weights_root": str(tmp_path / "models"),
        "model_weights_agent_python": sys.executable,
        "model_weights_workers": 2,
        "model_weights_engine_config_dir": str(tmp_path / "engines"),
        "model_weights_upgrade_snapshot_dir": str(tmp_path / "upgrade" / "previous"),
        **overrides,
    }
    (tmp_path / "vars.yml").write_text(yaml.safe_dump(variables))
    env = dict(os.environ)
    env.pop("HF_TOKEN", None)
    play = role_play("Weights", "model_weights", "engine01", tmp_path / "vars.yml")
    proc = run_play(tmp_path, play, *args, env=env)
    return proc.returncode, changed_count(proc.stdout), proc.stdout + proc.stderr


def test_hf_model_with_a_vault_token_installs_and_the_token_never_shows(hub, tmp_path):
    sha = commit(hub, 1)
    model = {"source": "hf", "repo": REPO, "revision": sha, "endpoint": hub.endpoint}
    with command_lines_watched(TOKEN) as on_argv:
        rc, changed, out = run_role(tmp_path, model, "-vvv")
    assert rc == 0, out[-3000:]
    assert changed == 2  # models root, the fetch
    assert not on_argv, on_argv
    installed = tmp_path / "models" / "m" / sha
    assert (installed / "model.safetensors").stat().st_size == 400_000
    assert os.readlink(tmp_path / "models" / "m" / "current") == sha
    # The Hub saw the token on its API calls; the output with -vvv never did.
    assert hub.count("hub") > 0
    assert all(r.auth == "valid" for r in hub.requests if r.server == "hub")
    assert TOKEN not in out
    assert "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER" in out  # masked where it was passed
    for path in installed.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path

    rc, changed, out = run_role(tmp_path, model)
    assert (rc, changed) == (0, 0), out[-3000:]

    # A new pin in check mode: reported as a change, nothing fetched or moved.
    newer = commit(hub, 2)
    hub.reset_requests()
    rc, changed, out = run_role(tmp_path, {**model, "revision": newer}, "--check", "--diff")
    assert (rc, changed) == (0, 1), out[-3000:]
    assert not (tmp_path / "models" / "m" / newer).exists()
    assert os.readlink(tmp_path / "models" / "m" / "current") == sha
    assert hub.count("cdn") == 0


@pytest.mark.parametrize(
    ("model", "wanted"),
    [
        (
            {"source": "hf", "repo": REPO, "revision": "main"},
            "fleet_models.m.revision='main' is not pinned for source=hf: pin a 40-hex commit sha",
        ),
        (
            {"source": "hf", "revision": "a" * 40},
            "fleet_models.m.repo is required for source=hf",
        ),
        (
            {"source": "s3", "revision": "a" * 40},
            "fleet_models.m.source='s3' is not a source this role fetches; use one of mirror,",
        ),
        (
            {"source": "local", "path": "/staged", "revision": "a" * 64, "allow_patterns": "*"},
            "fleet_models.m.allow_patterns='*' must be a list of glob patterns",
        ),
    ],
)
def test_a_bad_model_setting_is_refused_before_any_change(tmp_path, model, wanted):
    rc, changed, out = run_role(tmp_path, model)
    assert rc != 0
    assert "host engine01: " + wanted in " ".join(out.split()), out[-3000:]
    assert changed == 0
    assert not (tmp_path / "models").exists()


def test_revisions_the_engines_or_the_upgrade_snapshot_name_are_not_pruned(hub, tmp_path):
    """The role hands its settings directories to the fetch; what they name stays."""
    first, second, third = (commit(hub, seed) for seed in (1, 2, 3))
    model = {"source": "hf", "repo": REPO, "endpoint": hub.endpoint}
    models = tmp_path / "models" / "m"
    rc, _, out = run_role(tmp_path, {**model, "revision": first}, model_weights_keep=1)
    assert rc == 0, out[-3000:]
    (tmp_path / "engines").mkdir()
    (tmp_path / "engines" / "g0.json").write_text(
        '{"group": "g0", "model_path": "%s"}' % (models / first)
    )
    rc, _, out = run_role(tmp_path, {**model, "revision": second}, "-v", model_weights_keep=1)
    assert rc == 0, out[-3000:]
    assert {p.name for p in models.iterdir()} == {"current", first, second}
    assert "engine g0" in out

    # An upgrade snapshot that cannot be parsed: nothing is pruned, and the run says so.
    (tmp_path / "upgrade" / "previous").mkdir(parents=True)
    (tmp_path / "upgrade" / "previous" / "g0.json").write_text("{")
    (tmp_path / "engines" / "g0.json").unlink()
    rc, _, out = run_role(tmp_path, {**model, "revision": third}, model_weights_keep=1)
    assert rc == 0, out[-3000:]
    assert {p.name for p in models.iterdir()} == {"current", first, second, third}
    assert "[WARNING]: model m: pruned nothing: cannot read " in out
