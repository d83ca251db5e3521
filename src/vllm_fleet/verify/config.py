"""The verify configuration (rendered by Ansible from the inventory) and the API keys.

Keys come from the environment only, so they never show up in ``ps`` or shell history.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from vllm_fleet.tls.trust import TrustError, fleet_trust

ENGINE_KEY_VAR = "VLLM_FLEET_ENGINE_API_KEY"
CLIENT_KEY_VAR = "VLLM_FLEET_CLIENT_API_KEY"
# dtype values that make greedy decoding reproducible enough to demand identical text.
FLOAT32_DTYPES = frozenset({"float32", "float"})
DEFAULT_FAMILIES = [
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:num_preemptions",
    "vllm:time_to_first_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:cache_config_info",
]
URL_PATTERN = r"^https?://[^/\s]+$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EngineSpec(_Strict):
    host: str
    group: str
    url: str = Field(pattern=URL_PATTERN)
    stack: str
    model: str
    # The name clients ask for (the model's served_name): each name is verified on its own.
    served_name: str
    revision: str
    devices: list[int]
    max_num_seqs: int = Field(gt=0)
    dtype: str = "auto"
    enable_prefix_caching: bool = True
    # The bundle commit the host's /etc/vllm-fleet/deployed.json names ("+dirty": the
    # checkout had uncommitted changes when it was applied).
    commit: str = "not recorded"

    @property
    def label(self) -> str:
        return f"{self.host}/{self.group}"


class RouterSpec(_Strict):
    # Where clients send requests (the routers' VIP when there is one).
    url: str = Field(pattern=URL_PATTERN)
    # Behind a VIP: each router at its own address; every one must serve, since any of them
    # may hold the VIP next.
    members: list[str] = Field(default_factory=list)
    # The fleet CA's certificate, trusted alone when the routers serve https (host_tls).
    ca_file: str | None = None
    policy: str
    # The router cuts a request (503) that runs longer than this (fleet_router's
    # request_timeout_seconds): the cross-talk load must finish well inside it.
    request_timeout_seconds: float = Field(gt=0.0)
    # The router admits admission_factor x (sum of max_num_seqs) requests at once and refuses
    # the excess with a bare 429 (no Retry-After); None: it admits any number.
    admission_factor: int | None = Field(default=None, gt=0)


class CrosstalkSettings(_Strict):
    prompts: int = Field(default=10, ge=2, le=24)
    # None: sized from a measured wave (vllm_fleet.verify.sizing); set: used if it fits.
    concurrency: int | None = Field(default=None, gt=0)
    max_concurrency: int = Field(default=200, gt=0)
    # Whole waves a measured C asks for: every slot filled, and one more queued behind it
    # (where the field's cross-talk showed); fewer when they would not end in time.
    waves: int = Field(default=2, ge=1)
    max_tokens: int = Field(default=24, gt=0)
    seed: int = 1234
    # The fleet's peak of running requests must reach this share of min(C, sum(max_num_seqs)).
    min_overlap_fraction: float = Field(default=0.5, ge=0.0, le=1.0)
    sample_interval_seconds: float = Field(default=0.1, gt=0.0)


class PrefixProbeSettings(_Strict):
    prefix_tokens_approx: int = Field(default=600, ge=64)


class RetrySettings(_Strict):
    """How 429/503 answers carrying Retry-After are retried (a router shedding load)."""

    max_retries: int = Field(default=3, ge=0)
    max_delay_seconds: float = Field(default=30.0, ge=0.0)


class VerifyConfig(_Strict):
    engines: list[EngineSpec] = Field(min_length=1)
    router: RouterSpec | None = None
    # The fleet CA's certificate on the verifying host: trusted alone by every https endpoint
    # (the engines' ports with fleet_engine_tls, the routers' with fleet_router_tls).
    ca_file: str | None = None
    crosstalk: CrosstalkSettings = CrosstalkSettings()
    prefix_probe: PrefixProbeSettings = PrefixProbeSettings()
    retry: RetrySettings = RetrySettings()
    metrics_families: list[str] = Field(default_factory=lambda: list(DEFAULT_FAMILIES))
    # Verify's own per-request timeout (fleet_verify_timeout): the deadline of direct engine
    # calls, and through a router the deadline when it is tighter than the router's.
    timeout_seconds: float = Field(default=120.0, gt=0.0)

    def tls_verify(self) -> ssl.SSLContext | bool:
        """httpx's `verify` for every client of a run: the fleet CA alone once any endpoint,
        an engine or the router, speaks https (plain-http URLs ignore it)."""
        urls = [e.url for e in self.engines] + ([self.router.url] if self.router else [])
        https = next((url for url in urls if url.startswith("https://")), None)
        if https is None:
            return True
        ca_file = self.ca_file or (self.router.ca_file if self.router else None)
        if not ca_file:
            # Fleet listeners carry certificates from the fleet CA: never the system's trust.
            raise TrustError(f"{https} speaks HTTPS and the verification has no fleet CA to trust")
        return fleet_trust(https, ca_file)

    @property
    def served_names(self) -> list[str]:
        return sorted({e.served_name for e in self.engines})

    @property
    def served_name(self) -> str:
        """The one name this config's engines serve (a view of one name, see ``views``)."""
        names = self.served_names
        if len(names) != 1:
            raise ValueError(f"engines serve {len(names)} names {names}: verify each view")
        return names[0]

    def views(self) -> list[VerifyConfig]:
        """One config per served name, holding only that name's engines: each name's smoke,
        cross-talk load and prefix probes run against its own engines and capacity."""
        return [
            self.model_copy(update={"engines": [e for e in self.engines if e.served_name == n]})
            for n in self.served_names
        ]

    @property
    def fleet_max_num_seqs(self) -> int:
        return sum(e.max_num_seqs for e in self.engines)

    @property
    def all_float32(self) -> bool:
        return all(e.dtype in FLOAT32_DTYPES for e in self.engines)


def load_config(path: Path) -> VerifyConfig:
    return VerifyConfig.model_validate_json(path.read_text())


class MissingKeyError(ValueError):
    """A required key is missing from the environment."""


@dataclass(frozen=True)
class ApiKeys:
    engine: str
    client: str


def keys_from_env(cfg: VerifyConfig, environ: Mapping[str, str] = os.environ) -> ApiKeys:
    engine = environ.get(ENGINE_KEY_VAR, "")
    client = environ.get(CLIENT_KEY_VAR, "")
    if not engine:
        raise MissingKeyError(f"{ENGINE_KEY_VAR} is not set")
    if cfg.router is not None and not client:
        raise MissingKeyError(f"{CLIENT_KEY_VAR} is not set (the config has a router)")
    return ApiKeys(engine=engine, client=client)
