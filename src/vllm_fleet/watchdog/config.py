"""The watchdog's settings: ``/etc/vllm-fleet/watchdog.json``, rendered by Ansible."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from vllm_fleet.router.client import RouterTarget

GroupName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$")]


class WatchdogConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    interval_seconds: float = Field(default=5.0, gt=0)
    probe_timeout_seconds: float = Field(default=5.0, gt=0)
    failure_threshold: int = Field(default=3, ge=1)
    max_start_seconds: float = Field(default=900.0, gt=0)
    backoff_initial_seconds: float = Field(default=10.0, ge=0)
    backoff_max_seconds: float = Field(default=300.0, ge=0)
    # 0 = never restart: watch, keep unhealthy groups out of the routers, report.
    restart_budget: int = Field(default=3, ge=0)
    restart_window_seconds: float = Field(default=1800.0, gt=0)
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(default=9410, ge=1, le=65535)
    engine_config_dir: Path = Path("/etc/vllm-fleet/engines")
    groups: list[GroupName]
    unit_template: str = "vllm-engine@{group}.service"
    routers: list[RouterTarget] = Field(default_factory=list)
    probe_prompt: str = Field(default="The capital of France is", min_length=1)
    probe_max_tokens: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _consistent(self) -> WatchdogConfig:
        if "{group}" not in self.unit_template:
            raise ValueError("unit_template must contain {group}")
        if self.backoff_max_seconds < self.backoff_initial_seconds:
            raise ValueError("backoff_max_seconds must be >= backoff_initial_seconds")
        if len(set(self.groups)) != len(self.groups):
            raise ValueError("groups must not repeat")
        return self

    def unit(self, group: str) -> str:
        return self.unit_template.replace("{group}", group)
