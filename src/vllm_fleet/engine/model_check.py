"""Is a local Hugging Face-format model directory complete enough for vLLM to start?

An engine that starts on an incomplete model fails minutes later, deep inside vLLM's
loader, or worse, starts with weights it never read. ``engine-run`` checks first and
refuses with one line that names the file and the reason.

What counts as required (what transformers / vLLM actually read, nothing more):

- ``config.json``: must exist and be a JSON object (vLLM parses it first).
- a tokenizer, in one of the forms transformers loads: ``tokenizer.json`` (fast),
  ``tokenizer.model`` (sentencepiece), ``vocab.json`` + ``merges.txt`` (byte-level BPE),
  ``vocab.txt`` (WordPiece) or ``tekken.json`` (Mistral). ``tokenizer_config.json`` is
  optional (AutoTokenizer falls back to config.json's model_type), but transformers reads
  it first when present, so a present one must parse.
- the weights: with ``model.safetensors.index.json`` (else ``pytorch_model.bin.index.json``)
  every file in its ``weight_map``, non-empty; without an index ``model.safetensors`` or
  ``pytorch_model.bin``, or a complete ``*-0000i-of-0000n`` shard set.
- ``generation_config.json``: optional (vLLM reads it when present, we pass
  ``--generation-config auto``); a present one must parse.
- the fleet manifest (``.vllm-fleet-manifest.json``), when present: every file it lists
  exists with the listed size. Only stat(): hashes are ``weights verify``'s job.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from vllm_fleet.weights.base import MANIFEST_NAME
from vllm_fleet.weights.manifest import Manifest

# vLLM prefers safetensors: with both indexes present (repos that ship both formats,
# mirrored with only one), the .bin index describes files vLLM will not load.
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
SINGLE_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
SHARD_RE = re.compile(r"^(?P<stem>.+)-(?P<index>\d+)-of-(?P<total>\d+)\.(?P<ext>safetensors|bin)$")
TOKENIZER_FORMS = (
    ("tokenizer.json",),
    ("tokenizer.model",),
    ("vocab.json", "merges.txt"),
    ("vocab.txt",),
    ("tekken.json",),
)
# Parsed in full, like config.json and tokenizer_config.json: small files whose breakage
# fails the load. tokenizer.json and the weights can be hundreds of MB; for those only
# presence and size are checked here.
OPTIONAL_JSON = ("generation_config.json",)


@dataclass(frozen=True)
class Problem:
    """One reason the model cannot start: the file concerned and a full sentence."""

    file: str
    message: str

    def __str__(self) -> str:
        return self.message


def check_model(
    model_dir: Path, tokenizer_dir: Path | None = None, *, skip_tokenizer: bool = False
) -> list[Problem]:
    """Everything missing or unreadable in model_dir; empty when vLLM can start on it.

    ``tokenizer_dir`` is where the tokenizer is looked for (vLLM's ``--tokenizer``,
    default model_dir); ``skip_tokenizer`` mirrors ``--skip-tokenizer-init``.
    One problem per file: a shard both the index and the manifest list is named once.
    """
    if not model_dir.is_dir():
        why = "is not a directory" if model_dir.exists() else "does not exist"
        return [Problem(str(model_dir), f"the model directory {why}")]
    problems = check_model_files(model_dir)
    if not skip_tokenizer:
        problems += check_tokenizer(tokenizer_dir or model_dir)
    unique: dict[str, Problem] = {}
    for problem in problems:
        unique.setdefault(problem.file, problem)
    return list(unique.values())


def check_model_files(model_dir: Path) -> list[Problem]:
    """config.json, weights, optional JSON files and the manifest; not the tokenizer."""
    problems = _check_json(model_dir, "config.json", required=True)
    problems += check_weights(model_dir)
    for name in OPTIONAL_JSON:
        problems += _check_json(model_dir, name, required=False)
    problems += check_manifest(model_dir)
    return problems


def missing_files(model_dir: Path) -> list[str]:
    """The messages of :func:`check_model`: what vLLM would miss in model_dir."""
    return [p.message for p in check_model(model_dir)]


def _load_json(path: Path) -> tuple[Any, str | None]:
    """(parsed value, None) or (None, why it cannot be used)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, "is missing"
    except (OSError, UnicodeDecodeError) as err:
        return None, f"cannot be read ({err})"
    try:
        return json.loads(text), None
    except json.JSONDecodeError as err:
        return None, f"is not valid JSON ({err})"


def _check_json(model_dir: Path, name: str, required: bool) -> list[Problem]:
    path = model_dir / name
    if not required and not path.exists():
        return []
    value, why = _load_json(path)
    if why is None and not isinstance(value, dict):
        why = "is not a JSON object"
    return [] if why is None else [Problem(name, f"{name} {why}")]


def _size_problem(model_dir: Path, name: str, because: str = "") -> Problem | None:
    """None when name is a non-empty file; else why not ("<because> <name>, which is ...")."""
    path = model_dir / name
    state = "missing" if not path.is_file() else "empty" if path.stat().st_size == 0 else None
    if state is None:
        return None
    return Problem(name, f"{because} {name}, which is {state}" if because else f"{name} is {state}")


def check_weights(model_dir: Path) -> list[Problem]:
    for index in WEIGHT_INDEXES:
        if (model_dir / index).exists():
            return _check_index(model_dir, index)
    return _check_unindexed(model_dir)


def _index_files(value: Any) -> list[str] | None:
    """The weight files an index's weight_map names; None when it has no usable map."""
    weight_map = value.get("weight_map") if isinstance(value, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        return None
    return sorted(set(weight_map.values()))


def _check_index(model_dir: Path, index: str) -> list[Problem]:
    value, why = _load_json(model_dir / index)
    files = _index_files(value)
    if why is None and files is None:
        why = "has no weight_map of tensor names to files"
    elif why is None and not files:
        why = "lists no weight files"
    if why is not None or files is None:
        return [Problem(index, f"{index} {why}")]
    found = (_size_problem(model_dir, f, f"{index} lists") for f in files)
    return [p for p in found if p is not None]


def _check_unindexed(model_dir: Path) -> list[Problem]:
    for name in SINGLE_WEIGHTS:
        if (model_dir / name).exists():
            problem = _size_problem(model_dir, name)
            return [] if problem is None else [problem]
    shards = [m for p in sorted(model_dir.iterdir()) if (m := SHARD_RE.match(p.name))]
    if not shards:
        return [
            Problem(
                SINGLE_WEIGHTS[0],
                "no weights: neither an index (model.safetensors.index.json, "
                "pytorch_model.bin.index.json) nor model.safetensors / pytorch_model.bin",
            )
        ]
    return _check_shard_sets(model_dir, shards)


def _check_shard_sets(model_dir: Path, shards: list[re.Match[str]]) -> list[Problem]:
    """Without an index, vLLM loads whatever shards exist: the names say how many there are."""
    problems: list[Problem] = []
    for stem, total, ext in sorted({(m["stem"], m["total"], m["ext"]) for m in shards}):
        width = len(total)
        first = f"{stem}-{1:0{width}d}-of-{total}.{ext}"
        for i in range(1, int(total) + 1):
            name = f"{stem}-{i:0{width}d}-of-{total}.{ext}"
            problem = _size_problem(model_dir, name, f"shard names like {first} imply")
            if problem is not None:
                problems.append(problem)
    return problems


def check_tokenizer(tokenizer_dir: Path) -> list[Problem]:
    problems = _check_json(tokenizer_dir, "tokenizer_config.json", required=False)
    return problems + _tokenizer_files(tokenizer_dir)


def _tokenizer_files(tokenizer_dir: Path) -> list[Problem]:
    for form in TOKENIZER_FORMS:
        if all((tokenizer_dir / name).exists() for name in form):
            found = (_size_problem(tokenizer_dir, n) for n in form)
            return [p for p in found if p is not None]
    if (tokenizer_dir / "vocab.json").exists():
        # Half a BPE tokenizer is the typical interrupted download: say which half.
        why = "vocab.json is present but merges.txt, which BPE needs, is missing"
        return [Problem("merges.txt", why)]
    why = (
        "no tokenizer: none of tokenizer.json, tokenizer.model (sentencepiece), "
        "vocab.json + merges.txt (BPE), vocab.txt, tekken.json"
    )
    return [Problem("tokenizer.json", why)]


def check_manifest(model_dir: Path) -> list[Problem]:
    """Every file the fleet manifest lists is present with its size (no hashing)."""
    path = model_dir / MANIFEST_NAME
    if not path.exists():
        return []
    try:
        manifest = Manifest.model_validate_json(path.read_bytes())
    except (OSError, ValidationError) as err:
        first = str(err).splitlines()[0]
        return [Problem(MANIFEST_NAME, f"{MANIFEST_NAME} cannot be used ({first})")]
    problems = []
    for entry in manifest.files:
        file = model_dir / entry.path
        if not file.is_file():
            problems.append(
                Problem(entry.path, f"{MANIFEST_NAME} lists {entry.path}, which is missing")
            )
        elif (size := file.stat().st_size) != entry.size:
            problems.append(
                Problem(
                    entry.path,
                    f"{MANIFEST_NAME} lists {entry.path} with {entry.size} bytes; it has {size}",
                )
            )
    return problems


def main(model_dir: Path) -> int:
    """``vllm-fleet model-check``: print the problems; 0 complete, 1 not."""
    problems = check_model(model_dir)
    for problem in problems:
        print(f"{model_dir}: {problem}")
    if not problems:
        print(f"{model_dir}: complete")
    return 1 if problems else 0
