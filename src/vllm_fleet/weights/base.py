"""A model revision installed under ``<root>/<name>/<revision>/``, verified, whatever its source.

Files land in a staging directory, each hashed while it is written; only a fully
verified staging directory is renamed into place, and the ``current`` link moves
only after that. A failure leaves every existing revision untouched.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from vllm_fleet.names import SAFE_NAME_RULE, is_safe_name
from vllm_fleet.weights.hashing import sha256_files
from vllm_fleet.weights.manifest import Manifest, canonical_json

MANIFEST_NAME = ".vllm-fleet-manifest.json"
STAMP_NAME = ".vllm-fleet-verified.json"
CURRENT_LINK = "current"
STAGING_PREFIX = ".staging-"
DEFAULT_MARGIN_BYTES = 1024**3
# Where the engine groups' settings live (vllm_engine_config_dir), and the settings the last
# upgrade started from, its rollback target (fleet_upgrade_state_dir/previous).
ENGINE_CONFIG_DIR = Path("/etc/vllm-fleet/engines")
UPGRADE_SNAPSHOT_DIR = Path("/var/lib/vllm-fleet/upgrade/previous")
# EngineConfig's field naming the directory an engine loads: <root>/<model>/<revision>.
MODEL_PATH_FIELD = "model_path"


class WeightsError(Exception):
    """A fetch or verification failure, worded for the operator."""


class DiskFullError(WeightsError):
    """The disk filled while staging: what was staged is removed, not kept for a resume."""


class UnreadableSettingsError(WeightsError):
    """A settings file that may name a revision in use cannot be read: nothing may be pruned."""


@dataclass
class Progress:
    """Bytes done of a total, reported at most every ``interval`` seconds."""

    total: int
    label: str
    report: Callable[[str], None]
    interval: float = 10.0
    done: int = 0
    _started: float = field(default_factory=time.monotonic)
    _last: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, count: int) -> None:
        with self._lock:
            self.done += count
            now = time.monotonic()
            if now - self._last < self.interval and self.done < self.total:
                return
            self._last = now
            elapsed = max(now - self._started, 1e-6)
            rate = self.done / elapsed
            eta = (self.total - self.done) / rate if rate > 0 else float("inf")
            self.report(
                f"{self.label}: {self.done / 1e6:.0f}/{self.total / 1e6:.0f} MB "
                f"{rate / 1e6:.1f} MB/s eta {eta:.0f}s"
            )


def write_hashed(blocks: Iterable[bytes], out: BinaryIO, digest: Any, progress: Progress) -> int:
    """Write each block as it comes (a buffered one would be lost when a connection drops and
    fetched again by the resume), hashing and counting it; then flush and fsync. The bytes."""
    size = 0
    for block in blocks:
        digest.update(block)
        out.write(block)
        size += len(block)
        progress.add(len(block))
    out.flush()
    os.fsync(out.fileno())
    return size


def raise_if_disk_full(err: OSError, name: str, where: Path) -> None:
    """A full disk is its own failure (what was staged is removed, not kept for a resume)."""
    if err.errno == errno.ENOSPC:
        raise DiskFullError(f"{name}: no space left on device while writing {where}") from err


@dataclass
class PruneResult:
    """What a prune kept (each revision with why) and removed; ``refused`` says why it
    removed nothing at all."""

    kept: dict[str, list[str]]
    removed: list[str]
    refused: str | None = None


@dataclass
class FetchResult:
    changed: bool
    path: str
    revision: str
    files: int
    bytes: int
    actions: list[str]
    prune: PruneResult


def revision_dir(root: Path, name: str, revision: str) -> Path:
    return root / name / revision


def _stat_key(path: Path) -> dict[str, int]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}


def tree_entries(root: Path) -> dict[str, os.stat_result]:
    """Every non-directory entry under root (links not followed), by relative posix path."""
    found: dict[str, os.stat_result] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        for name in [*filenames, *(d for d in dirnames if (base / d).is_symlink())]:
            entry = base / name
            found[entry.relative_to(root).as_posix()] = entry.lstat()
    return found


# vllm-fleet's own files in a revision directory (and their write-then-rename temporaries).
OWN_FILES = frozenset({MANIFEST_NAME, STAMP_NAME, f"{MANIFEST_NAME}.tmp", f"{STAMP_NAME}.tmp"})


def load_local_manifest(rev_dir: Path) -> Manifest:
    return Manifest.model_validate_json((rev_dir / MANIFEST_NAME).read_text())


def verify_dir(
    rev_dir: Path,
    manifest: Manifest,
    full: bool,
    workers: int,
    report: Callable[[str], None] = lambda _msg: None,
    *,
    rehashed: list[Path] | None = None,
) -> list[str]:
    """Check every file of manifest under rev_dir; returns the problems found.

    Unless ``full``, files whose (size, mtime, inode) match the verified stamp are
    trusted without re-hashing; that makes re-checking an unchanged model cheap. A file the
    manifest does not list is a problem too: nothing but vllm-fleet writes there.
    """
    stamp: dict[str, dict[str, int | str]] = {}
    if not full:
        with contextlib.suppress(OSError, ValueError):
            stamp = json.loads((rev_dir / STAMP_NAME).read_text())["files"]
    problems: list[str] = []
    to_hash: list[tuple[Path, str]] = []
    for entry in manifest.files:
        path = rev_dir / entry.path
        if not path.is_file():
            problems.append(f"{entry.path}: missing")
            continue
        key = _stat_key(path)
        if key["size"] != entry.size:
            problems.append(f"{entry.path}: size {key['size']}, expected {entry.size}")
            continue
        known = stamp.get(entry.path)
        if known and {k: known.get(k) for k in key} == key and known.get("sha256") == entry.sha256:
            continue
        to_hash.append((path, entry.sha256))
    listed = {entry.path for entry in manifest.files} | OWN_FILES
    problems.extend(
        f"{rel}: not in the manifest (unexpected file)"
        for rel in sorted(set(tree_entries(rev_dir)) - listed)
    )
    if rehashed is not None:
        rehashed.extend(p for p, _ in to_hash)
    if to_hash:
        progress = Progress(sum(p.stat().st_size for p, _ in to_hash), f"verify {rev_dir}", report)
        digests = sha256_files([p for p, _ in to_hash], workers, progress.add)
        for path, expected in to_hash:
            if digests[path] != expected:
                problems.append(
                    f"{path.relative_to(rev_dir).as_posix()}: sha256 mismatch: "
                    f"expected {expected}, got {digests[path]}"
                )
    return problems


def write_stamp(rev_dir: Path, manifest: Manifest) -> None:
    files = {e.path: {**_stat_key(rev_dir / e.path), "sha256": e.sha256} for e in manifest.files}
    _write_private(rev_dir / STAMP_NAME, canonical_json({"files": files}))


def _write_private(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.chmod(0o444)
    tmp.replace(path)


def _make_read_only(rev_dir: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(rev_dir):
        for name in filenames:
            Path(dirpath, name).chmod(0o444)
        for name in dirnames:
            Path(dirpath, name).chmod(0o555)
    rev_dir.chmod(0o555)


def _make_writable(tree: Path) -> None:
    for dirpath, _dirnames, _filenames in os.walk(tree):
        Path(dirpath).chmod(0o755)


def remove_tree(tree: Path) -> None:
    if tree.exists():
        _make_writable(tree)
        shutil.rmtree(tree)


def _tree_bytes(tree: Path) -> int:
    total = 0
    for dirpath, _dirnames, filenames in os.walk(tree):
        for name in filenames:
            with contextlib.suppress(OSError):
                total += Path(dirpath, name).stat().st_size
    return total


@contextlib.contextmanager
def _fetch_lock(root: Path, name: str) -> Iterator[None]:
    """One fetch per host at a time (two site.yml runs, a hand-run fetch): they would
    share staging directories and free space."""
    # The lock is on the models root itself: no lock file to leave behind.
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise WeightsError(
                f"model {name}: another model fetch is running on this host "
                f"(it holds a lock on {root}); wait for it to finish and re-run"
            ) from None
        yield
    finally:
        os.close(fd)


def point_current(model_dir: Path, revision: str) -> bool:
    """Atomically point ``<model_dir>/current`` at revision; True when it moved."""
    link = model_dir / CURRENT_LINK
    if link.is_symlink() and os.readlink(link) == revision:
        return False
    tmp = model_dir / f".{CURRENT_LINK}.tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(revision)
    tmp.replace(link)
    return True


@dataclass(frozen=True)
class SettingsDir:
    """A directory of engine settings files (EngineConfig JSON): the revisions they name are
    in use. ``label`` starts the reason a kept revision gets ("engine g0")."""

    path: Path
    label: str


def _settings_files(directory: Path) -> list[Path]:
    """The settings files in directory; none when it does not exist (no engine, no upgrade yet).

    Listed by hand: pathlib's glob skips a directory it may not read, which would hide every
    revision named in it. Hidden files are skipped, as Ansible's find (the upgrade's snapshot)
    skips them.
    """
    try:
        with os.scandir(directory) as entries:
            names = [e.name for e in entries if e.name.endswith(".json")]
    except FileNotFoundError:
        return []
    except OSError as err:
        raise UnreadableSettingsError(f"cannot list {directory}: {err.strerror}") from err
    return sorted(directory / name for name in names if not name.startswith("."))


def _settings_model_path(settings: Path) -> tuple[str, Path]:
    """(group, model path) of one settings file.

    Only the model path is read, not a whole EngineConfig: a snapshot written by an older
    release need not validate against this one's model, and only its path matters here.
    """
    try:
        data = json.loads(settings.read_text())
    except (OSError, ValueError) as err:
        raise UnreadableSettingsError(f"cannot read {settings}: {err}") from err
    if not isinstance(data, dict) or not isinstance(data.get(MODEL_PATH_FIELD), str):
        raise UnreadableSettingsError(f"{settings} has no {MODEL_PATH_FIELD} string")
    group = data.get("group")
    return (group if isinstance(group, str) else settings.stem), Path(data[MODEL_PATH_FIELD])


def in_use_revisions(model_dir: Path, sources: Sequence[SettingsDir]) -> dict[str, list[str]]:
    """The revisions of model_dir that settings files name, each with who names it.

    Read when called, so a prune sees the settings as they are at that moment: during a
    rolling change the engines' files still name the revision they run until re-rendered.
    """
    # Resolved: a path through a link (`current`, a linked models root) names its target.
    real_model_dir = Path(os.path.realpath(model_dir))
    named: dict[str, list[str]] = {}
    for source in sources:
        for settings in _settings_files(source.path):
            group, model_path = _settings_model_path(settings)
            loaded = Path(os.path.realpath(model_path))
            if loaded.parent == real_model_dir:
                named.setdefault(loaded.name, []).append(f"{source.label} {group}")
    return named


def _installed_revisions(model_dir: Path) -> list[Path]:
    """Revision directories, newest install first.

    A directory's mtime is its install time: the install writes its manifest and stamp in
    it last, and the rename into place keeps it. (A stamp refreshed after its files were
    re-hashed intact makes the pinned revision newer: it is the one in use anyway.)
    """
    revisions = [
        p
        for p in model_dir.iterdir()
        if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")
    ]
    return sorted(revisions, key=lambda p: p.stat().st_mtime, reverse=True)


def _current_reasons(model_dir: Path, pinned: str) -> list[tuple[str, str]]:
    link = model_dir / CURRENT_LINK
    current = Path(os.readlink(link)).name if link.is_symlink() else None
    reasons = [(pinned, "current" if pinned == current else "being installed")]
    return reasons + ([(current, "current")] if current and current != pinned else [])


def prune(
    model_dir: Path, keep: int, pinned: str, sources: Sequence[SettingsDir] = ()
) -> PruneResult:
    """Remove every revision nothing needs.

    Kept: ``current`` and the pinned revision; every revision an engine's settings or an
    upgrade snapshot in ``sources`` names (the one an engine runs, the rollback target);
    then the newest ``keep`` by install time. If a settings file cannot be read, what it
    names is unknown: nothing is removed, and ``refused`` says why.
    """
    revisions = _installed_revisions(model_dir)
    reasons: dict[str, list[str]] = {p.name: [] for p in revisions}

    def note(revision: str, reason: str) -> None:
        if revision in reasons and reason not in reasons[revision]:
            reasons[revision].append(reason)

    for revision, reason in _current_reasons(model_dir, pinned):
        note(revision, reason)
    refused = None
    try:
        for revision, named_by in in_use_revisions(model_dir, sources).items():
            for reason in named_by:
                note(revision, reason)
    except UnreadableSettingsError as err:
        refused = (
            f"model {model_dir.name}: pruned nothing: {err}; which revisions the engines or "
            "an upgrade snapshot use is unknown until it can be read: fix or remove it"
        )
    for old in revisions[: max(keep, 0)]:
        note(old.name, f"newest {keep}")
    if refused:
        kept = {name: why or ["prune refused"] for name, why in reasons.items()}
        return PruneResult(kept=kept, removed=[], refused=refused)
    removed = [old for old in revisions if not reasons[old.name]]
    for old in removed:
        remove_tree(old)
    kept = {name: why for name, why in reasons.items() if why}
    return PruneResult(kept=kept, removed=[old.name for old in removed])


@dataclass(kw_only=True)
class RevisionFetch:
    """Install one pinned revision of a model, whatever the source.

    A source supplies ``_fetch_into_place``, which fills a staging directory via
    ``_install``; everything else (the installed check, ``current``, pruning, the
    free-space check and the atomic rename) is shared, so every source gives the
    same guarantees.
    """

    name: str
    revision: str
    root: Path
    keep: int = 2
    full_verify: bool = False
    workers: int = 4
    margin_bytes: int = DEFAULT_MARGIN_BYTES
    report: Callable[[str], None] = lambda _msg: None
    # Read at prune time: a revision their settings files name is never pruned.
    engine_config_dir: Path = ENGINE_CONFIG_DIR
    upgrade_snapshot_dir: Path = UPGRADE_SNAPSHOT_DIR

    def __post_init__(self) -> None:
        # The name and revision become directories under root, which prune and fetch
        # remove and write as root: '..' or 'a/b' would reach outside it.
        for what, value in (("model name", self.name), ("revision", self.revision)):
            if not is_safe_name(value):
                raise WeightsError(
                    f"{what} {value!r} is not one directory name under {self.root}: use "
                    f"{SAFE_NAME_RULE}"
                )

    @property
    def model_dir(self) -> Path:
        return self.root / self.name

    @property
    def in_use_sources(self) -> tuple[SettingsDir, ...]:
        return (
            SettingsDir(self.engine_config_dir, "engine"),
            SettingsDir(self.upgrade_snapshot_dir, "upgrade snapshot"),
        )

    @property
    def target(self) -> Path:
        return revision_dir(self.root, self.name, self.revision)

    def installed_ok(self, rehashed: list[Path] | None = None) -> tuple[bool, list[str]]:
        """Whether the revision is installed and verifies; with the problems if not."""
        if not (self.target / MANIFEST_NAME).is_file():
            return False, ["not installed"]
        problems = self._provenance_problems(self.target)
        if problems:
            return False, problems
        manifest = load_local_manifest(self.target)
        problems = verify_dir(
            self.target, manifest, self.full_verify, self.workers, self.report, rehashed=rehashed
        )
        return not problems, problems

    def wanted(self) -> dict[str, object]:
        """What, beyond the revision, decides which bytes an install holds (its provenance).

        A mirror revision pins every byte by itself: nothing more to ask for.
        """
        return {}

    def _provenance_problems(self, rev_dir: Path) -> list[str]:
        """Reasons the installed copy is not what this fetch asks for, beyond its bytes."""
        wanted = self.wanted()
        if not wanted:
            return []
        try:
            stored = json.loads((rev_dir / MANIFEST_NAME).read_text())
        except (OSError, ValueError):
            return ["manifest unreadable"]
        return provenance_problems(stored, wanted)

    def needs_change(self) -> bool:
        ok, _ = self.installed_ok()
        link = self.model_dir / CURRENT_LINK
        return not ok or not (link.is_symlink() and os.readlink(link) == self.revision)

    def run(self) -> FetchResult:
        self.root.mkdir(parents=True, exist_ok=True)
        with _fetch_lock(self.root, self.name):
            return self._run_locked()

    def _run_locked(self) -> FetchResult:
        actions: list[str] = []
        rehashed: list[Path] = []
        ok, problems = self.installed_ok(rehashed)
        if not ok:
            if problems != ["not installed"]:
                # A copy fetched with other settings (repo, file patterns) is not damaged.
                what = "other" if self._provenance_problems(self.target) else "damaged"
                actions.append(f"re-fetched {what} local copy: " + "; ".join(problems))
            manifest = self._fetch_into_place()
            actions.append(f"fetched {len(manifest.files)} files")
        elif rehashed:
            # Files re-hashed and found intact (moved, touched): refresh the stamp so the
            # next check is cheap again. Bookkeeping, not content: reported as no change.
            write_stamp(self.target, load_local_manifest(self.target))
        manifest = load_local_manifest(self.target)
        if point_current(self.model_dir, self.revision):
            actions.append(f"current -> {self.revision}")
        pruned = prune(self.model_dir, self.keep, self.revision, self.in_use_sources)
        actions.extend(f"pruned {r}" for r in pruned.removed)
        if pruned.refused:
            self.report(pruned.refused)
        # A partial fetch of a revision no longer pinned would never be resumed.
        for stale in self.model_dir.glob(f"{STAGING_PREFIX}*"):
            remove_tree(stale)
            actions.append(f"removed the unfinished {stale.name}")
        return FetchResult(
            changed=bool(actions),
            path=str(self.target),
            revision=self.revision,
            files=len(manifest.files),
            bytes=manifest.total_bytes,
            actions=actions,
            prune=pruned,
        )

    def _fetch_into_place(self) -> Manifest:
        raise NotImplementedError

    @property
    def staging(self) -> Path:
        # One staging dir per revision, kept when a download fails so the next run resumes.
        return self.model_dir / f"{STAGING_PREFIX}{self.revision}"

    def _check_free_space(self, needed: int) -> None:
        self.model_dir.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self.model_dir).free
        needed -= _tree_bytes(self.staging)
        if free < needed + self.margin_bytes:
            raise WeightsError(
                f"model {self.name} revision {self.revision}: needs {needed / 1e9:.2f} GB plus "
                f"{self.margin_bytes / 1e9:.2f} GB margin in {self.model_dir}, only "
                f"{free / 1e9:.2f} GB free; free space or move model_weights_root"
            )

    def _install(self, fill: Callable[[Path], Manifest], provenance: dict[str, object]) -> Manifest:
        """Fill the staging dir, record and stamp it, then rename it into place.

        ``fill`` writes the files and returns their verified manifest, or raises; it
        deletes any staged file that failed verification. Files a failed download left
        behind stay for the next run to resume; a full disk removes them all.
        """
        staging = self.staging
        staging.mkdir(parents=True, exist_ok=True)
        try:
            manifest = fill(staging)
        except DiskFullError:
            remove_tree(staging)  # free the disk again; there is nothing worth resuming
            raise
        except BaseException:
            if _tree_bytes(staging) == 0:
                remove_tree(staging)  # nothing to resume
            raise
        _write_private(
            staging / MANIFEST_NAME,
            canonical_json({**manifest.model_dump(), **provenance}),
        )
        write_stamp(staging, manifest)
        _make_read_only(staging)
        if self.target.exists():
            trash = self.model_dir / f".trash-{self.revision}-{os.getpid()}"
            self.target.rename(trash)
            staging.rename(self.target)
            remove_tree(trash)
        else:
            staging.rename(self.target)
        return manifest


def provenance_problems(stored: dict[str, object], wanted: dict[str, object]) -> list[str]:
    """How a manifest's recorded origin differs from the one asked for."""
    return [
        f"installed with {key}={stored.get(key)!r}, wanted {value!r}"
        for key, value in wanted.items()
        if stored.get(key) != value
    ]
