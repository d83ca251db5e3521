"""The engine-host image the tests share: tagged by what went into it."""

from __future__ import annotations

import hashlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINE_IMAGE_ENV = "VLLM_FLEET_ENGINE_IMAGE"
ENGINE_IMAGE_REPO = "localhost/vllm-fleet-lab-engine"


def engine_image_tag() -> str:
    """localhost/vllm-fleet-lab-engine:<hash of the role, the stack lock and the agent's source>."""
    digest = hashlib.sha256()
    inputs = sorted(
        [
            *ROOT.glob("roles/engine_runtime/**/*"),
            *ROOT.glob("src/vllm_fleet/**/*.py"),
            ROOT / "catalog/stacks.yml",
            *ROOT.glob("catalog/locks/*.lock"),
        ]
    )
    for path in inputs:
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(path.relative_to(ROOT).as_posix().encode())
            digest.update(path.read_bytes())
    return f"{ENGINE_IMAGE_REPO}:{digest.hexdigest()[:12]}"
