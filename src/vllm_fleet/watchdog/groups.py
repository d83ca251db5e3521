"""What the watchdog needs to know about one engine group, read from its engine config."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm_fleet.engine.config import EngineConfig, advertise_url, probe_host
from vllm_fleet.env_file import read_env_file
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


def _http_base(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


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
    return GroupSpec(
        group=group,
        unit=config.unit(group),
        probe_url=_http_base(probe_host(cfg), cfg.port),
        advertise_url=advertise_url(cfg).rstrip("/"),
        served_name=cfg.served_name,
        api_key=api_key,
    )
