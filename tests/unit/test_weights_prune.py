"""Pruning old revisions never removes one in use: ``current``, one an engine group's settings
name, one the last upgrade's snapshot names (the rollback target). Real fetches from a real
HTTP mirror, real settings files in temporary directories."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.unit.conftest import make_model
from vllm_fleet.engine.config import EngineConfig
from vllm_fleet.weights.base import MODEL_PATH_FIELD, FetchResult
from vllm_fleet.weights.mirror import MirrorFetch
from vllm_fleet.weights.publish import publish


class Host:
    """One engine host's models root, engine settings and upgrade snapshot, all under tmp_path."""

    def __init__(self, tmp_path: Path, base_url: str) -> None:
        self.tmp = tmp_path
        self.url = base_url
        self.root = tmp_path / "srv"
        self.engines = tmp_path / "etc" / "engines"
        self.snapshot = tmp_path / "upgrade" / "previous"
        self.installs = 0
        self.reports: list[str] = []

    @property
    def model_dir(self) -> Path:
        return self.root / "m"

    def fetch(self, revision: str, keep: int = 2) -> FetchResult:
        result = MirrorFetch(
            name="m",
            revision=revision,
            base_url=self.url,
            root=self.root,
            keep=keep,
            engine_config_dir=self.engines,
            upgrade_snapshot_dir=self.snapshot,
            report=self.reports.append,
        ).run()
        if "fetched" in " ".join(result.actions):
            # Install times one second apart, in fetch order (a fast test writes them all
            # within one mtime tick otherwise).
            self.installs += 1
            os.utime(self.model_dir / revision, (1000 + self.installs, 1000 + self.installs))
        return result

    def settings(self, directory: Path, group: str, revision: str) -> None:
        """The part of a group's EngineConfig JSON that matters here: its model path."""
        directory.mkdir(parents=True, exist_ok=True)
        data = {
            "group": group,
            "served_name": "m",
            MODEL_PATH_FIELD: str(self.model_dir / revision),
        }
        (directory / f"{group}.json").write_text(json.dumps(data))

    def installed(self) -> set[str]:
        return {p.name for p in self.model_dir.iterdir() if p.name != "current"}


@pytest.fixture
def revisions(http_dir, tmp_path) -> list[str]:
    """Three revisions of model m on the mirror: A, B, C."""
    _, mirror_root = http_dir
    return [
        publish("m", make_model(tmp_path / f"src{i}", weights=bytes([i + 1]) * 2000), mirror_root)
        for i in range(3)
    ]


@pytest.fixture
def host(http_dir, tmp_path) -> Host:
    return Host(tmp_path, http_dir[0])


def test_rollback_target_named_by_engine_settings_survives_the_next_fetch(host, revisions):
    a, b, c = revisions
    host.fetch(a)
    host.settings(host.engines, "g0", a)
    # Upgrade to B: the snapshot keeps the settings it started from (A), engines move to B.
    host.fetch(b)
    host.settings(host.snapshot, "g0", a)
    host.settings(host.engines, "g0", b)
    # Rollback: the inventory pins A again; it is still installed, so only current moves.
    assert host.fetch(a).actions == [f"current -> {a}"]
    host.settings(host.snapshot, "g0", b)
    host.settings(host.engines, "g0", a)
    # C is fetched while the engines still run A (their settings are re-rendered later).
    result = host.fetch(c)
    assert host.installed() == {a, b, c}
    assert result.prune.removed == []
    assert result.prune.kept == {
        c: ["current", "newest 2"],
        b: ["upgrade snapshot g0", "newest 2"],
        a: ["engine g0"],
    }
    assert os.readlink(host.model_dir / "current") == c
    assert not any("pruned nothing" in r for r in host.reports)


def test_a_revision_only_the_upgrade_snapshot_names_is_kept(host, revisions):
    a, b, c = revisions
    host.settings(host.snapshot, "g0", a)
    for revision in revisions:
        result = host.fetch(revision, keep=1)
    assert host.installed() == {a, c}
    assert result.prune.kept == {c: ["current", "newest 1"], a: ["upgrade snapshot g0"]}
    assert result.prune.removed == [b]
    assert result.actions == ["fetched 4 files", f"current -> {c}", f"pruned {b}"]


def test_keep_n_still_removes_revisions_nothing_names(host, revisions):
    a, b, c = revisions
    host.settings(host.engines, "g0", c)
    # Another model's revision of the same name is not this model's.
    other = {"group": "g1", MODEL_PATH_FIELD: str(host.root / "other" / a)}
    (host.engines / "g1.json").write_text(json.dumps(other))
    for revision in revisions:
        result = host.fetch(revision)
    assert host.installed() == {b, c}
    assert result.prune.removed == [a]
    assert result.prune.kept == {c: ["current", "engine g0", "newest 2"], b: ["newest 2"]}
    assert result.prune.refused is None


def test_settings_naming_the_current_link_keep_its_target(host, revisions):
    a, b, _ = revisions
    host.fetch(a, keep=1)
    host.engines.mkdir(parents=True)
    linked = {"group": "g0", MODEL_PATH_FIELD: str(host.model_dir / "current")}
    (host.engines / "g0.json").write_text(json.dumps(linked))
    result = host.fetch(b, keep=1)
    # At prune time current already points at B: the path names B, not A.
    assert result.prune.kept == {b: ["current", "engine g0", "newest 1"]}
    assert result.prune.removed == [a]


@pytest.mark.parametrize(
    ("content", "wanted"),
    [
        ('{"group": "g1", "model_path": "/srv/m', "cannot read "),
        ('{"group": "g1"}', f"has no {MODEL_PATH_FIELD} string"),
        ("[1, 2]", f"has no {MODEL_PATH_FIELD} string"),
        (b"\xff\xfe", "cannot read "),
    ],
)
def test_an_unparsable_settings_file_prunes_nothing_and_says_so(host, revisions, content, wanted):
    a, b, c = revisions
    host.settings(host.engines, "g0", c)
    bad = host.engines / "g1.json"
    if isinstance(content, bytes):
        bad.write_bytes(content)
    else:
        bad.write_text(content)
    for revision in revisions:
        result = host.fetch(revision, keep=1)
    assert host.installed() == {a, b, c}
    assert result.prune.removed == []
    # What the files name is unknown now: none of it is reported.
    assert result.prune.kept == {
        c: ["current", "newest 1"],
        b: ["prune refused"],
        a: ["prune refused"],
    }
    refused = result.prune.refused
    assert refused is not None
    assert wanted in refused and str(bad) in refused and "pruned nothing" in refused
    assert refused in host.reports
    # Once the file is fixed, the next run prunes what nothing names.
    host.settings(host.engines, "g1", c)
    again = host.fetch(c, keep=1)
    assert again.prune.removed == [b, a]
    assert again.actions == [f"pruned {b}", f"pruned {a}"]


def test_a_settings_directory_that_cannot_be_listed_prunes_nothing(host, revisions):
    a, b, c = revisions
    # A file where the directory should be: listing it fails (as an unreadable one would).
    host.snapshot.parent.mkdir(parents=True)
    host.snapshot.write_text("")
    for revision in revisions:
        result = host.fetch(revision, keep=1)
    assert host.installed() == {a, b, c}
    assert result.prune.refused is not None
    assert f"cannot list {host.snapshot}" in result.prune.refused


def test_hidden_and_other_files_in_the_settings_directories_are_ignored(host, revisions):
    a, b, _ = revisions
    host.settings(host.engines, "g0", b)
    # An editor's or Ansible's temporary file, and the group's secrets file.
    (host.engines / ".ansible_tmp1234g0.json").write_text('{"half": ')
    (host.engines / "g0.env").write_text("VLLM_API_KEY=x\n")
    host.fetch(a, keep=1)
    result = host.fetch(b, keep=1)
    assert result.prune.refused is None
    assert result.prune.removed == [a]


def test_the_model_path_field_is_engine_configs():
    # Settings are read for this one field; it must stay the one engines load.
    assert MODEL_PATH_FIELD in EngineConfig.model_fields
    assert EngineConfig.model_fields[MODEL_PATH_FIELD].annotation is Path
