"""One engine group's settings, and the command line and environment derived from them.

Ansible renders ``/etc/vllm-fleet/engines/<group>.json`` from the inventory; the
``vllm-fleet engine-run`` wrapper reads it on the host. Keeping the derivation here
(not in Jinja) lets it be unit tested, and one mapping serves every accelerator.
"""

from __future__ import annotations

import re
import socket
import ssl
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from vllm_fleet.names import SAFE_NAME
from vllm_fleet.router.client import RouterTarget
from vllm_fleet.tls.trust import fleet_trust

Accelerator = Literal["cpu", "cuda", "ascend"]

# Which variable restricts a process to its devices, per accelerator.
DEVICE_ENV_VAR: dict[str, str] = {
    "cpu": "VLLM_CPU_OMP_THREADS_BIND",
    "cuda": "CUDA_VISIBLE_DEVICES",
    "ascend": "ASCEND_RT_VISIBLE_DEVICES",
}


# Flags the role sets from the group's settings, and those that would undo what it enforces,
# each with the guarantee it keeps. A group's extra_args may not name them in any spelling
# vLLM's parser takes: a second --host, given last, would win over the private address.
BIND = "the engine listens only on its private bind address and port"
SETTING = "the group's setting is the one preflight planned and the router and verify read"
VERIFIED = "the engine serves only the sha256-verified local weights"
TLS = (
    "the engine serves HTTPS with its own certificate from the fleet CA whenever the fleet "
    "has one (its key handed over by systemd, never on disk where the engine's user reads it)"
)
FLAG_GUARANTEES: dict[str, str] = {
    "--host": BIND, "--port": BIND, "--uds": BIND,
    "--api-key": "the key stays off the command line (fleet_engine_api_key, a 0600 file)",
    "--config": "every setting comes from the group's settings (a config file could set the "
                "bind address or the key)",
    "--model": VERIFIED, "--generation-config": VERIFIED,
    "--trust-remote-code": "no code shipped with the weights runs unless the model's entry "
                           "in fleet_models says trust_remote_code: true",
    "--enable-log-requests": "prompts stay out of the journal",
    "--served-model-name": SETTING, "--max-model-len": SETTING, "--max-num-seqs": SETTING,
    "--dtype": SETTING, "--kv-cache-memory-bytes": SETTING, "--kv-cache-dtype": SETTING,
    "--tensor-parallel-size": SETTING, "-tp": SETTING, "--shutdown-timeout": SETTING,
    "--enable-prefix-caching": SETTING, "--enforce-eager": SETTING, "--block-size": SETTING,
    "--ssl-keyfile": TLS, "--ssl-certfile": TLS, "--ssl-ca-certs": TLS, "--ssl-cert-reqs": TLS,
    "--ssl-ciphers": TLS, "--enable-ssl-refresh": TLS,
}  # fmt: skip
OWNED_FLAGS = frozenset(FLAG_GUARANTEES)
# Names that hold secrets: they have no place in a group's env (its settings file is
# readable by the engine's group and shown in --diff; the key has its own 0600 file).
SECRET_NAME = re.compile(
    r"(^|_)(key|secret|password|passwd|token|passphrase|credentials?)s?$", re.IGNORECASE
)


def owned_flag(arg: str) -> str | None:
    """The owned flag ``arg`` sets (``--host``, ``--host=x``, ``--no-enable-log-requests``,
    ``--api_key``, an abbreviation such as ``--ho``), or None."""
    if not arg.startswith("-"):
        return None
    name = arg.split("=", 1)[0].replace("_", "-")
    if name.startswith("--no-"):
        name = "--" + name[len("--no-") :]
    for flag in OWNED_FLAGS:
        if name == flag or (name.startswith("--") and len(name) > 3 and flag.startswith(name)):
            return flag
    return None


def extra_args_problems(extra_args: list[str]) -> list[tuple[str, str]]:
    """(what is wrong, the fix) for each extra argument that sets an owned flag."""
    return [
        (
            f"{arg!r} sets {flag}, which the role owns: {FLAG_GUARANTEES[flag]}",
            "remove it; set the value through the group's settings "
            "(roles/vllm_engine/meta/argument_specs.yml), the key through fleet_engine_api_key, "
            "trust_remote_code on the model",
        )
        for arg in extra_args
        if (flag := owned_flag(arg))
    ]


def env_problems(env: dict[str, str]) -> list[tuple[str, str]]:
    """(what is wrong, the fix) for each env name the role owns or that holds a secret."""
    problems = []
    for name in env:
        if name in OWNED_ENV:
            problems.append(
                (f"{name} is set by the role: {env_guarantee(name)}", f"remove {name} from env")
            )
        elif SECRET_NAME.search(name):
            problems.append(
                (
                    f"{name} looks like a secret, and env is shown in the settings file and --diff",
                    f"remove {name}: engines load verified local weights and need no hub token; "
                    "the engine key is fleet_engine_api_key",
                )
            )
    return problems


class AscendSettings(BaseModel):
    """NPU and HCCL settings of an Ascend engine (vllm-ascend's service guides' values)."""

    model_config = ConfigDict(extra="forbid")

    pytorch_npu_alloc_conf: str = "expandable_segments:True"
    task_queue_enable: Literal[0, 1, 2] = 1
    omp_num_threads: int = Field(default=1, ge=1)
    omp_proc_bind: bool = False
    hccl_op_expansion_mode: str | None = "AIV"
    # MB per communicator; None keeps HCCL's default (200).
    hccl_buffsize: int | None = Field(default=None, gt=0)
    # Seconds ranks wait for each other at setup; None keeps HCCL's default (120).
    hccl_connect_timeout: int | None = Field(default=None, ge=120, le=7200)


class NetworkSettings(BaseModel):
    """The host's private interface, which collective communication should use."""

    model_config = ConfigDict(extra="forbid")

    interface: str | None = None
    address: str | None = None


class EngineTls(BaseModel):
    """The engine's HTTPS listener. ``cert`` and ``key`` name the unit's credentials
    (LoadCredential=: systemd hands the engine's key to this service alone, from a root-only
    file); ``ca_cert`` is the fleet CA, what the host's own clients of the engine (readiness,
    the watchdog, drains) trust alone."""

    model_config = ConfigDict(extra="forbid")

    cert: str = Field(pattern=rf"^{SAFE_NAME.pattern}$")
    key: str = Field(pattern=rf"^{SAFE_NAME.pattern}$")
    ca_cert: Path
    # The certificate's hash: a renewed certificate changes the settings, so the group
    # restarts onto it as a rolling change (systemd hands credentials over at start only).
    cert_sha256: str = Field(pattern=r"^([0-9a-f]{64})?$")  # empty: a --check run on a new host
    # The fleet CA's hash: a new CA changes the settings too, so the host's callers (the
    # watchdog) take it up with the certificate it issued.
    ca_sha256: str = Field(pattern=r"^([0-9a-f]{64})?$")


class EngineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    group: str = Field(pattern=rf"^{SAFE_NAME.pattern}$")
    accelerator: Accelerator
    stack: str
    stack_dir: Path
    model_path: Path
    served_name: str
    host: str = "0.0.0.0"
    port: int = Field(ge=1, le=65535)
    devices: list[int] = Field(min_length=1)
    max_model_len: int = Field(gt=0)
    max_num_seqs: int = Field(gt=0)
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    kv_cache_bytes: int = Field(gt=0)
    tensor_parallel_size: int = Field(default=1, ge=1)
    enforce_eager: bool = False
    enable_prefix_caching: bool = True
    # The model's catalog entry allows the code its weights ship (fleet_models: trust_remote_code).
    trust_remote_code: bool = False
    block_size: int | None = None
    shutdown_timeout: int = Field(default=30, ge=0)
    # The unit's MemoryMax= (its drop-in holds it; systemd enforces it). Here too, so a
    # changed bound restarts the group like any other setting. None: no bound.
    memory_max_bytes: int | None = Field(default=None, gt=0)
    extra_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    ascend: AscendSettings = Field(default_factory=AscendSettings)
    network: NetworkSettings = Field(default_factory=NetworkSettings)
    # None: plain HTTP (a fleet without a CA that says fleet_engine_plain_http: true).
    tls: EngineTls | None = None
    # Where routers reach this group (e.g. https://engine01:8100), and the routers it joins
    # once healthy and leaves before it stops.
    advertise_url: str | None = None
    routers: list[RouterTarget] = Field(default_factory=list)
    # Between leaving the routers and SIGTERM: requests a router already picked this
    # engine for still arrive.
    leave_grace_seconds: float = Field(default=1.0, ge=0)

    @field_validator("extra_args")
    @classmethod
    def _no_owned_flags(cls, value: list[str]) -> list[str]:
        if problems := extra_args_problems(value):
            raise ValueError("; ".join(f"{what}: {fix}" for what, fix in problems))
        return value

    @field_validator("env")
    @classmethod
    def _no_owned_or_secret_env(cls, value: dict[str, str]) -> dict[str, str]:
        if problems := env_problems(value):
            raise ValueError("; ".join(f"{what}: {fix}" for what, fix in problems))
        return value


def probe_host(cfg: EngineConfig) -> str:
    """Where processes on the host reach the engine."""
    return "127.0.0.1" if cfg.host in ("0.0.0.0", "::", "") else cfg.host


def engine_url(host: str, port: int, *, tls: bool) -> str:
    """An engine's base URL (an IPv6 address in brackets)."""
    scheme = "https" if tls else "http"
    bare = ":" in host and not host.startswith("[")
    return f"{scheme}://[{host}]:{port}" if bare else f"{scheme}://{host}:{port}"


def probe_url(cfg: EngineConfig) -> str:
    """Where processes on the host reach the engine."""
    return engine_url(probe_host(cfg), cfg.port, tls=cfg.tls is not None)


def advertise_url(cfg: EngineConfig) -> str:
    """The URL routers use for this group."""
    return cfg.advertise_url or engine_url(socket.gethostname(), cfg.port, tls=cfg.tls is not None)


def engine_trust(cfg: EngineConfig) -> ssl.SSLContext | bool:
    """httpx's ``verify`` for the host's own calls to its engine: the fleet CA alone."""
    return fleet_trust(probe_url(cfg), str(cfg.tls.ca_cert) if cfg.tls else None)


def compress_ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5' (the form OpenMP thread binding takes)."""
    ordered = sorted(set(indices))
    runs: list[list[int]] = []
    for value in ordered:
        if runs and value == runs[-1][-1] + 1:
            runs[-1].append(value)
        else:
            runs.append([value])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def device_env(accelerator: str, devices: list[int]) -> dict[str, str]:
    """Environment that pins a process to its devices."""
    if accelerator == "cpu":
        # All bound cores compute; by default vLLM would keep one back.
        return {
            DEVICE_ENV_VAR["cpu"]: compress_ranges(devices),
            "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        }
    return {DEVICE_ENV_VAR[accelerator]: ",".join(str(d) for d in devices)}


def accelerator_env(cfg: EngineConfig) -> dict[str, str]:
    """The accelerator's runtime and collective-communication variables."""
    env: dict[str, str] = {}
    iface, address = cfg.network.interface, cfg.network.address
    if cfg.accelerator == "ascend":
        npu = cfg.ascend
        env |= {
            "PYTORCH_NPU_ALLOC_CONF": npu.pytorch_npu_alloc_conf,
            "TASK_QUEUE_ENABLE": str(npu.task_queue_enable),
            "OMP_NUM_THREADS": str(npu.omp_num_threads),
            "OMP_PROC_BIND": "true" if npu.omp_proc_bind else "false",
        }
        optional = {
            "HCCL_OP_EXPANSION_MODE": npu.hccl_op_expansion_mode,
            "HCCL_BUFFSIZE": npu.hccl_buffsize,
            "HCCL_CONNECT_TIMEOUT": npu.hccl_connect_timeout,
            "HCCL_IF_IP": address,
            "HCCL_SOCKET_IFNAME": iface,
            "TP_SOCKET_IFNAME": iface,
        }
        env |= {k: str(v) for k, v in optional.items() if v is not None}
    elif cfg.accelerator == "cuda" and iface:
        env["NCCL_SOCKET_IFNAME"] = iface
    if iface:
        env["GLOO_SOCKET_IFNAME"] = iface
    return env


class CredentialsMissing(Exception):
    """The group serves TLS and the unit handed over no credentials directory."""


def tls_argv(cfg: EngineConfig, credentials_dir: str | None) -> list[str]:
    """vLLM's HTTPS flags: the certificate and key systemd handed the unit (LoadCredential=).
    No client certificate is asked for: sglang-router 0.3.2's health checker presents none."""
    if cfg.tls is None:
        return []
    if not credentials_dir:
        raise CredentialsMissing(
            f"group {cfg.group} serves HTTPS and the unit handed over no credentials "
            "(CREDENTIALS_DIRECTORY is not set; its LoadCredential= lines are missing)"
        )
    directory = Path(credentials_dir)
    return [
        "--ssl-certfile", str(directory / cfg.tls.cert),
        "--ssl-keyfile", str(directory / cfg.tls.key),
    ]  # fmt: skip


def engine_argv(cfg: EngineConfig, credentials_dir: str | None = None) -> list[str]:
    argv = [
        str(cfg.stack_dir / "bin" / "vllm"),
        "serve",
        str(cfg.model_path),
        "--served-model-name",
        cfg.served_name,
        "--host",
        cfg.host,
        "--port",
        str(cfg.port),
        "--max-model-len",
        str(cfg.max_model_len),
        "--max-num-seqs",
        str(cfg.max_num_seqs),
        "--dtype",
        cfg.dtype,
        "--kv-cache-memory-bytes",
        str(cfg.kv_cache_bytes),
        "--kv-cache-dtype",
        cfg.kv_cache_dtype,
        "--tensor-parallel-size",
        str(cfg.tensor_parallel_size),
        "--shutdown-timeout",
        str(cfg.shutdown_timeout),
        # Weights come only from the verified local path; never from a hub.
        "--generation-config",
        "auto",
        "--no-enable-log-requests",
        "--enable-prefix-caching" if cfg.enable_prefix_caching else "--no-enable-prefix-caching",
    ]
    if cfg.enforce_eager:
        argv.append("--enforce-eager")
    if cfg.trust_remote_code:
        argv.append("--trust-remote-code")
    if cfg.block_size is not None:
        argv += ["--block-size", str(cfg.block_size)]
    return argv + tls_argv(cfg, credentials_dir) + list(cfg.extra_args)


def engine_env(cfg: EngineConfig, state_dir: Path) -> dict[str, str]:
    """Variables the engine gets on top of the unit's environment."""
    env = isolation_env(state_dir)
    env.update(device_env(cfg.accelerator, cfg.devices))
    env.update(accelerator_env(cfg))
    # The group's own env wins over the accelerator's tuning (never over OWNED_ENV).
    env.update(cfg.env)
    return env


def isolation_env(state_dir: Path) -> dict[str, str]:
    """Offline, and every cache and temporary file inside the group's state directory."""
    cache = state_dir / "cache"
    return {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HOME": str(cache / "huggingface"),
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "TRITON_CACHE_DIR": str(cache / "triton"),
        "XDG_CACHE_HOME": str(cache),
        "TMPDIR": str(state_dir / "tmp"),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }


# What a group's env may not replace: isolation, the device pinning, the key (the unit's
# EnvironmentFile sets VLLM_API_KEY).
OWNED_ENV = frozenset({*isolation_env(Path("/")), *DEVICE_ENV_VAR.values(), "VLLM_API_KEY"})
OFFLINE_ENV = frozenset({"HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"})


def env_guarantee(name: str) -> str:
    """The guarantee an owned variable keeps."""
    if name in OFFLINE_ENV:
        return "the engine stays offline and loads only the sha256-verified local weights"
    if name == "VLLM_API_KEY":
        return "the key comes only from its 0600 EnvironmentFile (fleet_engine_api_key)"
    if name in DEVICE_ENV_VAR.values():
        return "each group runs on its own devices"
    if name in ("VLLM_NO_USAGE_STATS", "DO_NOT_TRACK"):
        return "the engine reports nothing to the outside"
    return "caches and temporary files stay in the group's state directory"
