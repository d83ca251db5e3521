"""What the watchdog needs to know about one engine group, read from its engine config."""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx

from vllm_fleet.engine.config import EngineConfig, advertise_url, engine_trust, probe_url
from vllm_fleet.env_file import read_env_file
from vllm_fleet.tls.trust import TrustError, fleet_trust
from vllm_fleet.watchdog.config import WatchdogConfig


class GroupConfigError(Exception):
    pass


@dataclass(frozen=True)
class GroupSpec:
    group: str
    unit: str
    probe_url: str  # where the watchdog probes it, on this host
    advertise_url: str  # what the routers get
    served_name: str
    api_key: str = field(repr=False)
    # What the probe trusts: the fleet CA alone for an engine that serves HTTPS (and its hash:
    # a new CA at the same path makes a new client).
    ca_file: str | None = None
    ca_sha256: str | None = None


def load_group(config: WatchdogConfig, group: str) -> GroupSpec:
    settings = config.engine_config_dir / f"{group}.json"
    secrets = config.engine_config_dir / f"{group}.env"
    try:
        cfg = EngineConfig.model_validate_json(settings.read_text())
        api_key = read_env_file(secrets).get("VLLM_API_KEY", "")
    except (OSError, ValueError) as err:
        raise GroupConfigError(f"group {group}: cannot read its engine config: {err}") from None
    if not api_key:
        raise GroupConfigError(f"group {group}: {secrets} sets no VLLM_API_KEY")
    try:
        engine_trust(cfg)
    except TrustError as err:
        raise GroupConfigError(f"group {group}: {err}") from None
    return GroupSpec(
        group=group,
        unit=config.unit(group),
        probe_url=probe_url(cfg),
        advertise_url=advertise_url(cfg).rstrip("/"),
        served_name=cfg.served_name,
        api_key=api_key,
        ca_file=str(cfg.tls.ca_cert) if cfg.tls else None,
        ca_sha256=cfg.tls.ca_sha256 if cfg.tls else None,
    )


def probe_client(spec: GroupSpec, timeout: float) -> httpx.Client:
    """The watchdog's client for one group: the fleet CA alone for an engine on HTTPS."""
    return httpx.Client(timeout=timeout, verify=fleet_trust(spec.probe_url, spec.ca_file))
