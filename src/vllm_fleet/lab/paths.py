"""Where the lab keeps what it builds. The cache survives clones and CI runs."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
# Where the lab's clients reach the routers: their VIP (inventories/lab fleet_router.vip) on
# the lab bridge, whichever router holds it.
LAB_ROUTER_URL = "http://10.89.0.100:30000"


@dataclass(frozen=True)
class LabPaths:
    repo: Path
    cache: Path

    @classmethod
    def default(cls) -> LabPaths:
        cache = Path(os.environ.get("VLLM_FLEET_CACHE", "/var/cache/vllm-fleet"))
        return cls(repo=REPO_ROOT, cache=cache)

    @property
    def mirror(self) -> Path:
        return self.cache / "mirror"

    @property
    def wheels(self) -> Path:
        return self.mirror / "wheels"

    @property
    def models(self) -> Path:
        return self.mirror / "models"

    @property
    def downloads(self) -> Path:
        return self.cache / "downloads"

    @property
    def collections(self) -> Path:
        return self.repo / ".collections"

    @property
    def secrets(self) -> Path:
        return self.repo / ".lab" / "secrets"

    @property
    def catalog(self) -> Path:
        return self.repo / "catalog"
