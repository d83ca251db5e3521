"""The inventory checks. Each finding names the host, the key, the value and the fix."""

from __future__ import annotations

import difflib
import ipaddress
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from vllm_fleet.engine.config import SECRET_NAME, env_problems, extra_args_problems, owned_flag
from vllm_fleet.names import SAFE_NAME, SAFE_NAME_RULE
from vllm_fleet.preflight.facts import INT64_MAX, HostFacts
from vllm_fleet.preflight.kv_planner import (
    DTYPE_BYTES,
    AttentionShape,
    PlanError,
    largest_len,
    plan,
    request_kv_bytes,
)
from vllm_fleet.preflight.memory_plan import (
    DEFAULT_CPU_OVERHEAD,
    cpu_engine_bytes,
    device_engine_share,
    weights_in_memory,
)
from vllm_fleet.weights.pins import PINS, REQUIRED, SOURCES, is_pinned

ACCELERATORS = ("cpu", "cuda", "ascend")
MODEL_SOURCES = SOURCES
# Settings of one engine group: the vllm_engine role's argument spec (a test keeps them equal).
GROUP_REQUIRED = ("name", "model", "devices", "port", "max_model_len", "max_num_seqs")
GROUP_OPTIONAL = (
    "kv_cache_bytes", "dtype", "kv_cache_dtype", "enforce_eager", "enable_prefix_caching",
    "tensor_parallel_size", "block_size", "extra_args", "env", "memory_max_bytes",
)  # fmt: skip
MODEL_KEYS = (
    "source",
    "url",
    "repo",
    "endpoint",
    "allow_patterns",
    "ignore_patterns",
    "path",
    "manifest",
    "revision",
    "served_name",
    "config",
    "weight_bytes",
    "ttft_p99_threshold_seconds",
    "trust_remote_code",
)
# The other string settings of a model (the pin and the setting each source requires are
# vllm_fleet.weights.pins', shared with the model_weights role and the fetches).
MODEL_STRINGS = ("url", "repo", "endpoint", "path", "manifest")
GROUP_NAME = SAFE_NAME
DNS_NAME = re.compile(
    r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*"
)
GIB = 1024**3
# Variables whose values are secrets: a finding names them but never shows the value.
SECRET_KEY = SECRET_NAME
REDACTED = "<redacted>"
# An unknown variable or setting may be a misspelt secret (fleet_hf_tokn): its value is
# never shown, only its name.
NOT_SHOWN = "<not shown>"


def shown_value(key: str, value: object) -> object:
    """The value as a finding may show it: secrets inside it (a secret-named key of a
    mapping, the value after a flag such as --api-key) replaced by <redacted>."""
    if value is NOT_SHOWN:
        return value
    return REDACTED if SECRET_KEY.search(key.rsplit(".", 1)[-1]) else scrubbed(value)


def secret_flag(arg: str) -> bool:
    name = arg.split("=", 1)[0].lstrip("-").replace("-", "_")
    return arg.startswith("-") and (
        SECRET_KEY.search(name) is not None or owned_flag(arg) == "--api-key"
    )


def scrubbed(value: object) -> object:
    if isinstance(value, dict):
        return {k: REDACTED if SECRET_KEY.search(str(k)) else scrubbed(v) for k, v in value.items()}
    if isinstance(value, list):
        out: list[object] = []
        for i, item in enumerate(value):
            after_flag = i > 0 and isinstance(value[i - 1], str) and secret_flag(value[i - 1])
            if isinstance(item, str) and "=" in item and secret_flag(item):
                out.append(item.split("=", 1)[0] + "=" + REDACTED)
            elif after_flag and not (isinstance(item, str) and item.startswith("-")):
                out.append(REDACTED)
            else:
                out.append(scrubbed(item))
        return out
    return value


def is_address(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def is_network(value: object) -> bool:
    try:
        ipaddress.ip_network(value, strict=False)  # type: ignore[arg-type]
    except (ValueError, TypeError):
        return False
    return isinstance(value, str)


def is_int(value: object, minimum: int = 1) -> bool:
    """A whole number from minimum to the largest 64-bit integer; true and false are not numbers."""
    return isinstance(value, int) and not isinstance(value, bool) and minimum <= value <= INT64_MAX


def is_str_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def is_str_map(value: object) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


# Optional engine group settings: (accepts the value, what to use). Values vllm_engine's
# template and EngineConfig (read on the host) would refuse, after hosts changed.
OPTIONAL_SETTINGS: dict[str, tuple[Callable[[object], bool], str]] = {
    "kv_cache_bytes": (is_int, "a positive number of bytes, or leave it out for the plan"),
    "dtype": (lambda v: isinstance(v, str), "auto, float32, bfloat16 or float16"),
    "kv_cache_dtype": (lambda v: isinstance(v, str), "auto, bfloat16, float16 or fp8"),
    "enforce_eager": (lambda v: isinstance(v, bool), "true or false"),
    "enable_prefix_caching": (lambda v: isinstance(v, bool), "true or false"),
    "tensor_parallel_size": (is_int, "a positive integer"),
    "block_size": (lambda v: v is None or is_int(v), "a positive number of tokens"),
    "extra_args": (is_str_list, "a list of strings, e.g. ['--max-logprobs', '5']"),
    "env": (is_str_map, "a mapping of names to strings (quote numbers: FOO: '1')"),
    "memory_max_bytes": (is_int, "a positive number of bytes, or leave it out for the plan"),
}


@dataclass
class Finding:
    host: str
    key: str
    value: object
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.host}: {self.key}={self.value!r}: {self.message}; fix: {self.fix}"


@dataclass
class HostInput:
    """What preflight knows of one host: its inventory variables and its facts."""

    name: str
    variables: dict[str, object]
    facts: HostFacts
    # What the host's installed weights say of a model: {"config": ..., "weight_bytes": ...}.
    installed_models: dict[str, dict[str, object]] = field(default_factory=dict)
    # The engine settings the host has now, as the probe slurped them (change_safety reads them).
    engine_settings: object = None
    # The router's and watchdog's key files as the probe slurped them (key_rotation reads them).
    key_files: object = None


@dataclass
class PlanRow:
    host: str
    group: str
    stack: str
    devices: list[int]
    kv_bytes_per_token: int
    kv_cache_bytes: int
    capacity_tokens: int
    max_concurrency: float
    max_model_len: int
    max_num_seqs: int


@dataclass
class PreflightResult:
    errors: list[Finding] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)
    plan: list[PlanRow] = field(default_factory=list)
    # host -> group -> the unit's MemoryMax= in bytes (set or planned; absent: no bound).
    memory_plan: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors


def did_you_mean(word: str, choices: object) -> str:
    close = difflib.get_close_matches(word, [str(c) for c in choices], n=1, cutoff=0.6)  # type: ignore[attr-defined]
    return f"did you mean {close[0]!r}?" if close else ""


class HostChecker:
    def __init__(
        self,
        host: HostInput,
        catalog: dict[str, dict[str, object]],
        known_keys: set[str],
        result: PreflightResult,
    ) -> None:
        self.host = host
        self.v = host.variables
        self.catalog = catalog
        self.known_keys = known_keys
        self.result = result

    def error(self, key: str, value: object, message: str, fix: str) -> None:
        finding = Finding(self.host.name, key, shown_value(key, value), message, fix)
        self.result.errors.append(finding)

    def warn(self, key: str, value: object, message: str, fix: str) -> None:
        finding = Finding(self.host.name, key, shown_value(key, value), message, fix)
        self.result.warnings.append(finding)

    def run(self) -> None:
        self.check_facts()
        self.check_unknown_keys()
        self.check_address()
        self.check_firewall_settings()
        if "fleet_engine_groups" not in self.v:
            return
        self.check_memory_settings()
        accelerator = self.check_accelerator()
        stack = self.check_stack(accelerator)
        groups = self.v.get("fleet_engine_groups")
        if not isinstance(groups, list):
            self.error(
                "fleet_engine_groups",
                groups,
                "must be a list of engine groups",
                "write one '- name: ...' item per engine group",
            )
            return
        valid = [g for i, g in enumerate(groups) if self.check_group_shape(i, g)]
        self.check_collisions(valid)
        for group in valid:
            self.check_group(group, accelerator, stack)
        self.check_memory_total(valid)

    # -- host level -----------------------------------------------------------------------
    def check_facts(self) -> None:
        for p in self.host.facts.problems:
            report = self.error if p.severity == "error" else self.warn
            report(p.key, p.value, p.message, p.fix)

    def check_address(self) -> None:
        """fleet_address: what routers, engines and Prometheus connect to (an address, so a
        DNS outage cannot keep a restarted engine out of the routers)."""
        value = self.v.get("fleet_address")
        valid = isinstance(value, str) and (is_address(value) or DNS_NAME.fullmatch(value))
        if value is not None and not valid:
            self.error(
                "fleet_address",
                value,
                "not an IP address or host name",
                "set the address the other fleet hosts reach this host on, e.g. 10.0.0.21",
            )
            return
        if value is None and isinstance(self.v.get("ansible_host"), str):
            value = self.v["ansible_host"]
        if not is_address(str(value or self.host.name)):
            self.warn(
                "fleet_address" if value else "ansible_host",
                value or self.host.name,
                "the fleet reaches this host by name, resolved again on every new connection: "
                "a DNS outage keeps a restarted engine out of the routers",
                "set fleet_address to the host's private IP address",
            )

    def check_firewall_settings(self) -> None:
        on = self.v.get("fleet_engine_firewall", True)
        if not isinstance(on, bool):
            self.error(
                "fleet_engine_firewall",
                on,
                "must be true or false",
                "leave it out (true: engines' ports open only to routers and monitoring hosts)",
            )
        sources = self.v.get("fleet_engine_firewall_sources", [])
        bad = [s for s in sources if not is_network(s)] if isinstance(sources, list) else sources
        if bad:
            self.error(
                "fleet_engine_firewall_sources",
                sources,
                f"not IP addresses or networks: {bad!r}",
                "list addresses or networks also allowed to the engines, e.g. ['10.0.9.0/24']",
            )

    def check_memory_settings(self) -> None:
        utilization = self.v.get("fleet_memory_utilization", 0.9)
        number = isinstance(utilization, float | int) and not isinstance(utilization, bool)
        if not (number and 0 < utilization <= 1):  # type: ignore[operator]
            self.error(
                "fleet_memory_utilization",
                utilization,
                "must be a fraction of device memory",
                "use a number above 0 and at most 1, e.g. 0.9",
            )
        reserve = self.v.get("fleet_memory_reserve_bytes", 2 * GIB)
        if not is_int(reserve, 0):
            self.error(
                "fleet_memory_reserve_bytes",
                reserve,
                "must be a number of bytes",
                "use a whole number >= 0, e.g. 2147483648",
            )
        overhead = self.v.get("fleet_engine_memory_overhead_bytes", DEFAULT_CPU_OVERHEAD)
        if not is_int(overhead, 0):
            self.error(
                "fleet_engine_memory_overhead_bytes",
                overhead,
                "must be a number of bytes",
                f"use a whole number >= 0, e.g. {DEFAULT_CPU_OVERHEAD}",
            )

    def check_unknown_keys(self) -> None:
        prefixes = {k.split("_", 1)[0] + "_" for k in self.known_keys}
        for key in self.v:
            if key in self.known_keys or not any(key.startswith(p) for p in prefixes):
                continue
            hint = did_you_mean(key, self.known_keys)
            self.error(
                key,
                NOT_SHOWN,
                f"unknown variable {hint}".strip(),
                "rename it to a documented variable (roles/*/meta/argument_specs.yml) or remove it",
            )

    def check_accelerator(self) -> str | None:
        value = self.v.get("fleet_accelerator")
        if value not in ACCELERATORS:
            hint = did_you_mean(str(value), ACCELERATORS)
            self.error(
                "fleet_accelerator",
                value,
                f"not an accelerator vllm-fleet drives {hint}".strip(),
                f"set it to one of {', '.join(ACCELERATORS)}",
            )
            return None
        return str(value)

    def check_stack(self, accelerator: str | None) -> dict[str, object] | None:
        name = self.v.get("fleet_engine_stack")
        if not isinstance(name, str) or name not in self.catalog:
            hint = did_you_mean(str(name), self.catalog)
            self.error(
                "fleet_engine_stack",
                name,
                f"not in the stacks catalog {hint}".strip(),
                f"use one of {', '.join(sorted(self.catalog))} (catalog/stacks.yml)",
            )
            return None
        stack = self.catalog[str(name)]
        if accelerator and stack.get("accelerator") != accelerator:
            self.error(
                "fleet_engine_stack",
                name,
                f"is built for {stack.get('accelerator')}, this host's fleet_accelerator is {accelerator}",
                f"pick a {accelerator} stack from catalog/stacks.yml",
            )
        facts = self.host.facts
        if facts.python and str(stack.get("python")) != facts.python:
            self.error(
                "fleet_engine_stack",
                name,
                f"is locked for Python {stack.get('python')}, the host has Python {facts.python}",
                f"install Python {stack.get('python')} on the host or pick a stack for {facts.python}",
            )
        requires = stack.get("requires")
        requires = requires if isinstance(requires, dict) else {}
        self.check_driver(str(name), requires, facts)
        return stack

    def check_driver(self, name: str, requires: dict[str, object], facts: HostFacts) -> None:
        minimum = requires.get("cuda_driver_min")
        if minimum and facts.driver_version:
            branch = re.match(r"[0-9]{1,9}", facts.driver_version)
            if branch is None:
                self.error(
                    "fleet_engine_stack",
                    name,
                    f"needs NVIDIA driver >= {minimum}, and the host's driver version "
                    f"{facts.driver_version!r} cannot be read",
                    "check the driver with nvidia-smi (or the fixture's driver_version)",
                )
            elif int(branch.group()) < int(str(minimum)):
                self.error(
                    "fleet_engine_stack",
                    name,
                    f"needs NVIDIA driver >= {minimum} (CUDA {requires.get('cuda')}), "
                    f"the host has {facts.driver_version}",
                    f"upgrade the driver to branch {minimum} or newer (cuda_stack) or pick an older stack",
                )
        cann = requires.get("cann")
        if cann and facts.cann_version and not facts.cann_version.startswith(str(cann)):
            self.error(
                "fleet_engine_stack",
                name,
                f"needs CANN {cann}, the host has CANN {facts.cann_version}",
                f"install CANN {cann} (ascend_stack) or pick the stack matching CANN {facts.cann_version}",
            )

    # -- groups ---------------------------------------------------------------------------
    def check_group_shape(self, index: int, group: object) -> bool:
        where = f"fleet_engine_groups[{index}]"
        if not isinstance(group, dict):
            self.error(
                where,
                group,
                "an engine group must be a mapping",
                "write name:, model:, devices:, ... keys",
            )
            return False
        label = f"fleet_engine_groups[{group.get('name', index)}]"
        ok = True
        for key in group:
            if key not in GROUP_REQUIRED + GROUP_OPTIONAL:
                hint = did_you_mean(str(key), GROUP_REQUIRED + GROUP_OPTIONAL)
                self.error(
                    f"{label}.{key}",
                    NOT_SHOWN,
                    f"unknown engine group setting {hint}".strip(),
                    "use the settings listed in roles/vllm_engine/meta/argument_specs.yml",
                )
                ok = False
        for key in GROUP_REQUIRED:
            if key not in group:
                self.error(
                    f"{label}.{key}", None, "required setting missing", f"add {key}: to the group"
                )
                ok = False
        if not ok:
            return False
        checks = [
            (
                "name",
                isinstance(group["name"], str) and GROUP_NAME.fullmatch(group["name"]) is not None,
                f"{SAFE_NAME_RULE} (it becomes a unit name)",
            ),
            (
                "port",
                is_int(group["port"]) and 1024 <= group["port"] <= 65535,
                "an integer from 1024 to 65535",
            ),
            (
                "devices",
                isinstance(group["devices"], list)
                and bool(group["devices"])
                and all(is_int(d, 0) for d in group["devices"]),
                "a non-empty list of device indices (integers >= 0)",
            ),
            ("max_model_len", is_int(group["max_model_len"]), "a positive number of tokens"),
            ("max_num_seqs", is_int(group["max_num_seqs"]), "a positive number of requests"),
        ]
        checks += [
            (key, good(group[key]), fix)
            for key, (good, fix) in OPTIONAL_SETTINGS.items()
            if key in group
        ]
        for key, good, fix in checks:
            if not good:
                self.error(f"{label}.{key}", group[key], "invalid value", f"use {fix}")
                ok = False
        if not ok:
            return False
        owned = {
            "extra_args": extra_args_problems(group.get("extra_args", [])),  # type: ignore[arg-type]
            "env": env_problems(group.get("env", {})),  # type: ignore[arg-type]
        }
        for key, problems in owned.items():
            for what, fix in problems:
                self.error(f"{label}.{key}", group[key], what, fix)
        return not any(owned.values())

    def check_collisions(self, groups: list[dict[str, object]]) -> None:
        seen_names: set[object] = set()
        ports: dict[object, object] = {}
        owners: dict[int, object] = {}
        for group in groups:
            name = group["name"]
            if name in seen_names:
                self.error(
                    f"fleet_engine_groups[{name}].name",
                    name,
                    "two groups share this name",
                    "give every group on a host its own name",
                )
            seen_names.add(name)
            port = group["port"]
            if port in ports:
                self.error(
                    f"fleet_engine_groups[{name}].port",
                    port,
                    f"already used by group {ports[port]}",
                    "give every group on a host its own port",
                )
            ports[port] = name
            devices = group["devices"]
            assert isinstance(devices, list)
            if len(set(devices)) != len(devices):
                self.error(
                    f"fleet_engine_groups[{name}].devices",
                    devices,
                    "lists a device twice",
                    "list each device once",
                )
            for device in devices:
                if device in owners and owners[device] != name:
                    self.error(
                        f"fleet_engine_groups[{name}].devices",
                        devices,
                        f"device {device} is also given to group {owners[device]}",
                        "give each device to one group only",
                    )
                owners.setdefault(device, name)

    def check_group(
        self, group: dict[str, object], accelerator: str | None, stack: dict[str, object] | None
    ) -> None:
        name = group["name"]
        label = f"fleet_engine_groups[{name}]"
        devices = group["devices"]
        assert isinstance(devices, list)
        self.check_device_indices(label, devices, accelerator)
        model = self.check_model(label, group)
        tp = group.get("tensor_parallel_size", 1)
        assert isinstance(tp, int)
        if tp != len(devices):
            self.error(
                f"{label}.tensor_parallel_size",
                tp,
                f"differs from the {len(devices)} devices the group has",
                f"set tensor_parallel_size: {len(devices)} or list {tp} devices",
            )
        dtype = str(group.get("dtype", "auto"))
        if dtype != "auto" and dtype.lower() not in DTYPE_BYTES:
            self.error(
                f"{label}.dtype",
                dtype,
                "not a dtype vLLM serves",
                "use auto, float32, bfloat16 or float16",
            )
            return
        kv_dtype = str(group.get("kv_cache_dtype", "auto"))
        if kv_dtype != "auto" and kv_dtype.lower() not in DTYPE_BYTES:
            self.error(
                f"{label}.kv_cache_dtype",
                kv_dtype,
                "not a KV cache dtype vLLM knows",
                "use auto, bfloat16, float16, fp8, fp8_e4m3 or fp8_e5m2",
            )
            return
        block = group.get("block_size")
        if accelerator == "cpu" and isinstance(block, int) and block % 32:
            self.error(
                f"{label}.block_size",
                block,
                "the CPU backend needs a multiple of 32",
                "use 32, 64, 128 ... or leave it unset (128)",
            )
        kv = group.get("kv_cache_bytes")
        if accelerator == "cpu" and kv is None:
            self.error(
                f"{label}.kv_cache_bytes",
                None,
                "must be set on CPU: vLLM would otherwise take 92% of the host's RAM",
                "set kv_cache_bytes (e.g. 1073741824 for 1 GiB)",
            )
        if model is not None and stack is not None and accelerator is not None:
            self.plan_group(
                label=label, group=group, model=model, accelerator=accelerator, tp=tp, dtype=dtype
            )
            self.plan_memory(label, group, model, accelerator, dtype)

    def check_device_indices(self, label: str, devices: list[int], accelerator: str | None) -> None:
        facts = self.host.facts
        if accelerator == "cpu":
            count, what = facts.cpu_count, "CPU cores"
        else:
            count, what = len(facts.devices), f"{accelerator} devices"
        if not count:
            return
        beyond = [d for d in devices if d >= count]
        if beyond:
            self.error(
                f"{label}.devices",
                devices,
                f"devices {beyond} do not exist: the host has {count} {what} (0-{count - 1})",
                f"use indices below {count}",
            )
        unhealthy = [d.index for d in facts.devices if d.index in devices and not d.healthy]
        if unhealthy:
            self.error(
                f"{label}.devices",
                devices,
                f"devices {unhealthy} report unhealthy",
                "repair them (npu-smi info / nvidia-smi) or move the group to healthy devices",
            )

    def check_model(self, label: str, group: dict[str, object]) -> dict[str, object] | None:
        models = self.v.get("fleet_models") or {}
        if not isinstance(models, dict):
            self.error(
                "fleet_models",
                models,
                "must be a mapping of model name to its settings",
                "write fleet_models: {<name>: {source: ..., revision: ..., served_name: ...}}",
            )
            return None
        name = group["model"]
        if not isinstance(name, str) or name not in models:
            hint = did_you_mean(str(name), models)
            self.error(
                f"{label}.model",
                name,
                f"not in fleet_models {hint}".strip(),
                f"add it to fleet_models or use one of {', '.join(sorted(map(str, models)))}",
            )
            return None
        model = models[name]
        where = f"fleet_models.{name}"
        if GROUP_NAME.fullmatch(name) is None:
            self.error(
                where,
                name,
                "a model name becomes a directory under the models root",
                f"use {SAFE_NAME_RULE}",
            )
            return None
        if not isinstance(model, dict):
            self.error(
                where,
                model,
                "must be a mapping",
                "give the model source:, revision: and served_name:",
            )
            return None
        for key in model:
            if key not in MODEL_KEYS:
                hint = did_you_mean(str(key), MODEL_KEYS)
                self.error(
                    f"{where}.{key}",
                    NOT_SHOWN,
                    f"unknown model setting {hint}".strip(),
                    f"use {', '.join(MODEL_KEYS)}",
                )
        source = model.get("source")
        if source not in MODEL_SOURCES:
            self.error(
                f"{where}.source",
                source,
                "unknown source",
                f"use one of {', '.join(MODEL_SOURCES)}",
            )
            return None
        revision = model.get("revision")
        if not is_pinned(str(source), revision):
            self.error(f"{where}.revision", revision, "not pinned", PINS[str(source)].fix())
        served = model.get("served_name")
        if not served or not isinstance(served, str):
            self.error(
                f"{where}.served_name",
                served,
                "missing" if not served else "must be a string",
                "set the name clients will ask for",
            )
        ok = self.check_model_settings(where, model, str(source))
        return model if ok else None

    def check_model_settings(self, where: str, model: dict[str, object], source: str) -> bool:
        """Types of the other model settings, as model_weights, monitoring and the plan read them."""
        problems: list[tuple[str, str]] = []
        needed = REQUIRED[source]
        if not model.get(needed):
            self.error(
                f"{where}.{needed}",
                model.get(needed),
                f"required for source {source}",
                f"set {needed}: (the model_weights role fetches from it)",
            )
        for key in MODEL_STRINGS:
            if model.get(key) is not None and not isinstance(model[key], str):
                problems.append((key, "a string"))
        for key in ("allow_patterns", "ignore_patterns"):
            if model.get(key) is not None and not is_str_list(model[key]):
                problems.append((key, "a list of glob patterns, like ['*.safetensors', '*.json']"))
        if model.get("weight_bytes") is not None and not is_int(model["weight_bytes"], 0):
            problems.append(("weight_bytes", "a whole number of bytes"))
        if "ttft_p99_threshold_seconds" in model:
            ttft = model["ttft_p99_threshold_seconds"]
            number = isinstance(ttft, float | int) and not isinstance(ttft, bool)
            if not (number and 0 < ttft < math.inf):  # type: ignore[operator]
                problems.append(("ttft_p99_threshold_seconds", "a positive number of seconds"))
        if "trust_remote_code" in model and not isinstance(model["trust_remote_code"], bool):
            problems.append(
                ("trust_remote_code", "true or false (true lets the weights' own code run)")
            )
        if model.get("config") is not None and not isinstance(model["config"], dict):
            problems.append(("config", "a mapping: the fields of the model's config.json"))
        for key, fix in problems:
            self.error(f"{where}.{key}", model[key], "invalid value", f"use {fix}")
        return not problems

    # -- KV plan --------------------------------------------------------------------------
    def plan_group(
        self,
        *,
        label: str,
        group: dict[str, object],
        model: dict[str, object],
        accelerator: str,
        tp: int,
        dtype: str,
    ) -> None:
        installed = self.host.installed_models.get(str(group["model"]), {})
        config = installed.get("config")
        if not isinstance(config, dict):
            config = model.get("config")
        if not isinstance(config, dict):
            self.warn(
                f"fleet_models.{group['model']}.config",
                None,
                "no config.json known for this model: KV plan skipped",
                "add the attention fields of its config.json under config:, or fetch the weights once",
            )
            return
        try:
            shape = AttentionShape.from_config(config)
        except PlanError as err:
            self.error(
                f"fleet_models.{group['model']}.config",
                None,
                str(err),
                "copy the model's config.json fields",
            )
            return
        heads, kv_heads = shape.num_attention_heads, shape.num_kv_heads
        if heads % tp:
            self.error(
                f"{label}.tensor_parallel_size",
                tp,
                f"does not divide the model's {heads} attention heads",
                f"use a TP size that divides {heads}",
            )
            return
        if not shape.is_mla and kv_heads % tp and tp % kv_heads:
            self.error(
                f"{label}.tensor_parallel_size",
                tp,
                f"and the model's {kv_heads} KV heads do not divide one another",
                f"use a TP size that divides {kv_heads} or a multiple of it",
            )
            return
        limit = config.get("max_position_embeddings")
        max_len = int(group["max_model_len"])  # type: ignore[call-overload]
        if is_int(limit) and max_len > limit:  # type: ignore[operator]
            self.error(
                f"{label}.max_model_len",
                max_len,
                f"exceeds the model's max_position_embeddings {limit}",
                f"use max_model_len <= {limit}",
            )
            return
        kv_dtype = self.kv_dtype(group, shape, dtype)
        capacity = self.kv_capacity(label, group, model, accelerator, tp)
        if kv_dtype is None or capacity is None:
            return
        seqs = int(group["max_num_seqs"])  # type: ignore[call-overload]
        result = plan(shape, capacity, max_len, seqs, tp=tp, kv_dtype=kv_dtype)
        self.result.plan.append(
            PlanRow(
                self.host.name,
                str(group["name"]),
                str(self.v.get("fleet_engine_stack")),
                list(group["devices"]),
                result.kv_bytes_per_token,
                capacity,  # type: ignore[call-overload]
                result.capacity_tokens,
                round(result.max_concurrency, 2),
                max_len,
                seqs,
            )
        )
        if not result.one_request_fits:
            one = largest_len(shape, capacity, 1, tp, kv_dtype)
            fixes = [f"lower max_model_len to {one}"]
            needed = request_kv_bytes(shape, max_len, tp, kv_dtype)
            fixes.append(
                f"raise kv_cache_bytes to {needed}"
                if group.get("kv_cache_bytes")
                else self.fitting_tp(shape, group, model, max_len, kv_dtype)
            )
            self.error(
                f"{label}.max_model_len",
                max_len,
                f"one {max_len}-token request needs {needed / GIB:.2f} GiB of KV cache "
                f"({result.kv_bytes_per_token} bytes/token), only {capacity / GIB:.2f} GiB is available",
                " or ".join(fixes),
            )
        elif not result.target_fits:
            fit = int(result.max_concurrency)
            self.warn(
                f"{label}.max_num_seqs",
                seqs,
                f"{seqs} requests of {max_len} tokens need {seqs * result.request_bytes / GIB:.2f} GiB "
                f"of KV cache, {capacity / GIB:.2f} GiB holds {result.max_concurrency:.1f}",
                f"lower max_num_seqs to {fit} or max_model_len to {result.max_model_len_for_target}",
            )

    def kv_dtype(self, group: dict[str, object], shape: AttentionShape, dtype: str) -> str | None:
        """The KV cache dtype: vLLM's "auto" is the dtype the model is served in."""
        kv_dtype = str(group.get("kv_cache_dtype", "auto"))
        if kv_dtype == "auto":
            kv_dtype = shape.dtype if dtype == "auto" else dtype
        if kv_dtype.lower() in DTYPE_BYTES:
            return kv_dtype
        self.error(
            f"fleet_models.{group['model']}.config",
            shape.dtype,
            "the model's torch_dtype is not a dtype vLLM serves with dtype: auto",
            f"set dtype: on group {group['name']} (float32, bfloat16 or float16)",
        )
        return None

    def fitting_tp(
        self,
        shape: AttentionShape,
        group: dict[str, object],
        model: dict[str, object],
        max_len: int,
        kv_dtype: str,
    ) -> str:
        """The smallest larger TP size that divides the heads and holds one max-length request."""
        tp = int(group.get("tensor_parallel_size", 1))  # type: ignore[call-overload]
        for candidate in (2, 4, 8, 16, 32):
            if candidate <= tp or shape.num_attention_heads % candidate:
                continue
            budget = self.budget(group, model, "gpu", candidate)[0]
            if budget and budget >= request_kv_bytes(shape, max_len, candidate, kv_dtype):
                return f"raise tensor_parallel_size to {candidate}"
        return "spread the model over more devices (no TP size up to 32 holds it)"

    def budget(
        self, group: dict[str, object], model: dict[str, object], accelerator: str, tp: int
    ) -> tuple[int | None, int, int]:
        """(KV bytes available per device or None if memory is unknown, memory, weights per device)."""
        installed = self.host.installed_models.get(str(group["model"]), {})
        weights = installed.get("weight_bytes")
        if not is_int(weights, 0):
            weights = model.get("weight_bytes") or 0  # checked by check_model_settings
        assert isinstance(weights, int)
        if accelerator == "cpu":
            memory, per_device_weights = self.host.facts.memory_bytes, weights
        else:
            devices = [d for d in self.host.facts.devices if d.index in group["devices"]]  # type: ignore[operator]
            memory = min((d.memory_bytes for d in devices), default=0)
            per_device_weights = weights // tp
        if not memory:
            return None, 0, per_device_weights
        return (
            int(memory * self.utilization) - per_device_weights - self.reserve,
            memory,
            per_device_weights,
        )

    @property
    def utilization(self) -> float:
        value = self.v.get("fleet_memory_utilization", 0.9)
        # An invalid value is refused by check_memory_settings; the plan goes on with the default.
        valid = isinstance(value, float | int) and not isinstance(value, bool) and 0 < value <= 1  # type: ignore[operator]
        return float(value) if valid else 0.9  # type: ignore[arg-type]

    @property
    def reserve(self) -> int:
        value = self.v.get("fleet_memory_reserve_bytes", 2 * GIB)
        return value if is_int(value, 0) else 2 * GIB  # type: ignore[return-value]

    def kv_capacity(
        self,
        label: str,
        group: dict[str, object],
        model: dict[str, object],
        accelerator: str,
        tp: int,
    ) -> int | None:
        explicit = group.get("kv_cache_bytes")
        available, memory, per_device_weights = self.budget(group, model, accelerator, tp)
        utilization, reserve = self.utilization, self.reserve
        if explicit is not None:
            assert isinstance(explicit, int)  # checked with the group's shape
            if available is not None and explicit > available:
                self.error(
                    f"{label}.kv_cache_bytes",
                    explicit,
                    f"does not fit: {memory / GIB:.1f} GiB x {utilization} - {per_device_weights / GIB:.2f} GiB "
                    f"weights - {reserve / GIB:.1f} GiB reserve leaves {available / GIB:.2f} GiB",
                    f"set kv_cache_bytes <= {max(available, 0)} or free memory",
                )
                return None
            return explicit
        if available is None:
            self.warn(
                f"{label}.kv_cache_bytes",
                None,
                "no device memory known: KV plan skipped",
                "set kv_cache_bytes explicitly",
            )
            return None
        if available <= 0:
            self.error(
                f"{label}.devices",
                group["devices"],
                f"the weights ({per_device_weights / GIB:.2f} GiB per device) leave no memory for a KV cache",
                "raise tensor_parallel_size or use bigger devices",
            )
            return None
        return available

    # -- host memory bound (the unit's MemoryMax=) ------------------------------------------
    def weights_and_config(
        self, group: dict[str, object], model: dict[str, object]
    ) -> tuple[int, dict[str, object]]:
        installed = self.host.installed_models.get(str(group["model"]), {})
        weights = installed.get("weight_bytes")
        if not is_int(weights, 0):
            weights = model.get("weight_bytes") or 0
        config = installed.get("config")
        if not isinstance(config, dict):
            config = model.get("config")
        return int(weights), config if isinstance(config, dict) else {}  # type: ignore[call-overload]

    @property
    def cpu_overhead(self) -> int:
        value = self.v.get("fleet_engine_memory_overhead_bytes", DEFAULT_CPU_OVERHEAD)
        return value if is_int(value, 0) else DEFAULT_CPU_OVERHEAD  # type: ignore[return-value]

    def planned_kv(self, group: dict[str, object]) -> int | None:
        explicit = group.get("kv_cache_bytes")
        if isinstance(explicit, int):
            return explicit
        rows = [
            r for r in self.result.plan if r.host == self.host.name and r.group == group["name"]
        ]
        return rows[-1].kv_cache_bytes if rows else None

    def plan_memory(
        self,
        label: str,
        group: dict[str, object],
        model: dict[str, object],
        accelerator: str,
        dtype: str,
    ) -> None:
        """The group's MemoryMax=: its own memory_max_bytes (checked against what a CPU engine
        must hold) or the plan (memory_plan's module docstring)."""
        explicit = group.get("memory_max_bytes")
        weights, config = self.weights_and_config(group, model)
        stored = config.get("torch_dtype") or config.get("dtype")
        kv = self.planned_kv(group)
        if accelerator == "cpu":
            if kv is None:
                return
            held = weights_in_memory(weights, stored, dtype) + kv
            if isinstance(explicit, int) and explicit < held:
                self.error(
                    f"{label}.memory_max_bytes",
                    explicit,
                    f"is below what the engine holds: {held / GIB:.2f} GiB of weights and KV cache "
                    "(it would be killed while it loads)",
                    f"raise it to at least {held + self.cpu_overhead} (with "
                    f"fleet_engine_memory_overhead_bytes) or leave it out for the plan",
                )
                return
            limit = (
                explicit
                if isinstance(explicit, int)
                else cpu_engine_bytes(
                    weights_in_memory(weights, stored, dtype), kv, self.cpu_overhead
                )
            )
        elif isinstance(explicit, int):
            limit = explicit
        else:
            facts = self.host.facts
            share = device_engine_share(
                facts.memory_bytes,
                self.reserve,
                len(group["devices"]),  # type: ignore[arg-type]
                len(facts.devices),
            )
            if share is None:
                self.warn(
                    f"{label}.memory_max_bytes",
                    None,
                    "the host's memory is unknown: the engine's unit gets no memory bound",
                    "set memory_max_bytes for the group",
                )
                return
            limit = share
        self.result.memory_plan.setdefault(self.host.name, {})[str(group["name"])] = limit

    def check_memory_total(self, groups: list[dict[str, object]]) -> None:
        """Every group's bound together fits the host, less the reserve."""
        limits = self.result.memory_plan.get(self.host.name, {})
        memory = self.host.facts.memory_bytes
        total = sum(limits.values())
        if not memory or total <= memory - self.reserve:
            return
        each = ", ".join(f"{name} {limit / GIB:.2f} GiB" for name, limit in sorted(limits.items()))
        self.error(
            "fleet_engine_groups",
            [g["name"] for g in groups],
            f"their memory bounds ({each}) add up to {total / GIB:.2f} GiB, more than the host's "
            f"{memory / GIB:.2f} GiB less the {self.reserve / GIB:.2f} GiB reserve: an engine "
            "would take memory the host needs",
            "lower kv_cache_bytes or memory_max_bytes, lower fleet_engine_memory_overhead_bytes, "
            "or move a group to another host",
        )


def validate(
    hosts: list[HostInput], catalog: dict[str, dict[str, object]], known_keys: set[str]
) -> PreflightResult:
    result = PreflightResult()
    for host in hosts:
        HostChecker(host, catalog, known_keys, result).run()
    return result
