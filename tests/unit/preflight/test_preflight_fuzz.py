"""Fuzz the inventory schema against preflight (the action plugin's own path).

Every generated inventory starts from a good host of bases.py and gets random mutations:
wrong types, deleted required keys, unknown keys and typos, duplicated groups, ports and
devices, out-of-range values, bogus stack and model references, broken facts, and whole
variables replaced by random JSON-like trees. Each host goes through the plugin's
host_input (hostvars -> HostInput), validate and the plugin's summarize / report_json.

Properties:
- nothing raises (no try/except around the call: an exception fails the test);
- every finding names its host and key, has a message and a fix, and carries no Python or
  Jinja garbage (Traceback, object reprs);
- a mutation that can never be valid is refused, and when it is the only one, a finding
  names its key;
- whatever the engine's own settings model (EngineConfig, read on the host) or the
  model_weights role (spec_problems) would refuse later, after hosts changed, preflight
  refuses first;
- a host that passes without warnings has a KV size for every group, set or planned.

Each run generates 1000 new inventories (no derandomize; a failure prints its example and a
@reproduce_failure blob); PREFLIGHT_FUZZ_SCALE=N runs N times as many.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import string
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tests.support.paths import ROOT
from tests.unit.preflight.bases import BASES, base
from tests.unit.preflight.test_facts import NPU_SMI_INFO as NPU_SMI
from vllm_fleet.ansible import model_weights as WEIGHTS
from vllm_fleet.ansible import preflight_action as PLUGIN
from vllm_fleet.engine.config import EngineConfig
from vllm_fleet.preflight import Finding, PreflightResult, validate
from vllm_fleet.preflight.checks import (
    ACCELERATORS,
    GROUP_OPTIONAL,
    GROUP_REQUIRED,
    MODEL_KEYS,
    MODEL_SOURCES,
)
from vllm_fleet.preflight.kv_planner import DTYPE_BYTES

CATALOG = yaml.safe_load((ROOT / "catalog/stacks.yml").read_text())["fleet_stacks"]
KNOWN: set[str] = PLUGIN.known_variables(ROOT / "roles")
GROUP_KEYS = GROUP_REQUIRED + GROUP_OPTIONAL
GROUP_NAME = re.compile(r"[A-Za-z0-9_.-]+")
PINS = {"mirror": 64, "local": 64, "hf": 40, "modelscope": 40}
SOURCE_KEY = {"mirror": "url", "local": "path", "hf": "repo", "modelscope": "repo"}
INT64 = 2**63 - 1
# What a finding's message or fix must never contain: a Python or Jinja failure leaking out.
GARBAGE = re.compile(
    r"Traceback|<built-in|<bound method| object at 0x|<function |<class '|Undefined|"
    r"AnsibleUndefined|jinja2\."
)
# vllm_engine's vllm_engine_group_defaults: a group's settings as the template sees them.
GROUP_DEFAULTS = {
    "dtype": "auto", "kv_cache_dtype": "auto", "enforce_eager": False,
    "enable_prefix_caching": True, "tensor_parallel_size": 1, "block_size": None,
    "extra_args": [], "env": {},
}  # fmt: skip
RAN = {"inventories": 0, "hosts": 0, "refused": 0, "certain": 0}
# A longer hunt: PREFLIGHT_FUZZ_SCALE=20 runs twenty times the examples.
SCALE = int(os.environ.get("PREFLIGHT_FUZZ_SCALE", "1"))

# -- values ------------------------------------------------------------------------------
HUGE = st.sampled_from([2**31, 2**63, 2**64, 10**30, -(2**63), 10**400, -(10**400)])
INTS = st.one_of(st.integers(), st.integers(-(2**80), 2**80), HUGE)
LONG = st.builds(lambda c, n: c * n, st.characters(), st.integers(1000, 20000))
STRS = st.one_of(
    st.text(max_size=24),
    st.text(alphabet=string.printable, max_size=24),
    st.sampled_from(["", " ", "\n", "{{ undefined_var }}", "null", "yes", "0x1F", "1e3", "é"]),
    LONG,
)
KEYS = st.one_of(st.text(max_size=12), st.integers(-5, 5), st.booleans(), st.none())
LEAF = st.one_of(st.none(), st.booleans(), INTS, st.floats(), STRS)
TREE = st.recursive(
    LEAF,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(KEYS, kids, max_size=4),
    max_leaves=12,
)
KINDS: dict[str, st.SearchStrategy[object]] = {
    "none": st.none(),
    "bool": st.booleans(),
    "int": INTS,
    "float": st.floats(),
    "str": STRS,
    "list": st.lists(LEAF, max_size=3),
    "dict": st.dictionaries(KEYS, LEAF, max_size=3),
}


def other_than(*kinds: str) -> st.SearchStrategy[object]:
    """Any value whose type is none of these kinds (bool counts apart from int)."""
    return st.one_of(*[s for k, s in KINDS.items() if k not in kinds])


def with_bad_item(
    good: st.SearchStrategy[object], bad: st.SearchStrategy[object]
) -> st.SearchStrategy[list[object]]:
    """A list of good items with one bad item somewhere."""
    return st.tuples(st.lists(good, max_size=3), bad, st.integers(0, 3)).map(
        lambda t: [*t[0][: t[2]], t[1], *t[0][t[2] :]]
    )


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def positive_int(value: object, minimum: int = 1) -> bool:
    return is_int(value) and minimum <= value <= INT64  # type: ignore[operator]


NOT_POSITIVE_INT = st.one_of(other_than("int"), st.integers(max_value=0), st.integers(INT64 + 1))
NOT_DTYPE = st.one_of(
    other_than("str"), STRS.filter(lambda s: s != "auto" and s.lower() not in DTYPE_BYTES)
)

# Values that a setting can never take, and values of the right type (valid or not).
GROUP_BAD: dict[str, st.SearchStrategy[object]] = {
    "name": st.one_of(
        other_than("str"), STRS.filter(lambda s: not GROUP_NAME.fullmatch(s)), st.just("g0\n")
    ),
    "model": other_than("str"),
    "devices": st.one_of(
        other_than("list"),
        st.just([]),
        with_bad_item(st.integers(0, 7), st.one_of(other_than("int"), st.integers(max_value=-1))),
        st.integers(0, 7).map(lambda d: [d, d]),
    ),
    "port": st.one_of(other_than("int"), st.integers(max_value=1023), st.integers(65536)),
    "max_model_len": NOT_POSITIVE_INT,
    "max_num_seqs": NOT_POSITIVE_INT,
    "kv_cache_bytes": NOT_POSITIVE_INT,
    "memory_max_bytes": NOT_POSITIVE_INT,
    "dtype": NOT_DTYPE,
    "kv_cache_dtype": NOT_DTYPE,
    "enforce_eager": other_than("bool"),
    "enable_prefix_caching": other_than("bool"),
    "tensor_parallel_size": NOT_POSITIVE_INT,
    "block_size": st.one_of(
        other_than("int", "none"), st.integers(max_value=0), st.integers(INT64 + 1)
    ),
    "extra_args": st.one_of(other_than("list"), with_bad_item(STRS, other_than("str"))),
    "env": st.one_of(
        other_than("dict"),
        st.dictionaries(st.text(min_size=1, max_size=8), other_than("str"), min_size=1, max_size=3),
    ),
}
GROUP_MAYBE: dict[str, st.SearchStrategy[object]] = {
    "name": st.from_regex(GROUP_NAME, fullmatch=True),
    "model": STRS,
    "devices": st.lists(st.integers(0, 300), min_size=1, max_size=9),
    "port": st.integers(1024, 65535),
    "max_model_len": st.one_of(st.integers(1, 2**20), st.integers(1, INT64)),
    "max_num_seqs": st.one_of(st.integers(1, 1024), st.integers(1, INT64)),
    "kv_cache_bytes": st.one_of(st.integers(1, 2**40), st.integers(1, INT64)),
    "memory_max_bytes": st.one_of(st.integers(1, 2**40), st.integers(1, INT64)),
    "dtype": st.sampled_from(["auto", *DTYPE_BYTES, "BFloat16", "FP8"]),
    "kv_cache_dtype": st.sampled_from(["auto", *DTYPE_BYTES]),
    "enforce_eager": st.booleans(),
    "enable_prefix_caching": st.booleans(),
    "tensor_parallel_size": st.integers(1, 64),
    "block_size": st.one_of(st.none(), st.integers(1, 1024), st.sampled_from([16, 32, 128])),
    "extra_args": st.lists(STRS, max_size=3),
    "env": st.dictionaries(st.text(min_size=1, max_size=8), STRS, max_size=3),
}
CONFIG_REQUIRED = ("num_hidden_layers", "num_attention_heads")
MODEL_NAMES = sorted({m for b in BASES.values() for m in b["variables"]["fleet_models"]})  # type: ignore[attr-defined]


# -- mutations ---------------------------------------------------------------------------
@dataclass
class Mutation:
    label: str
    # Certainly invalid when it still holds in the final inventory.
    certain: bool
    holds: Callable[[dict[str, object]], bool]
    # Fragments one of which a finding's key contains (checked when it is the only mutation).
    expect: tuple[str, ...]


def always(_: dict[str, object]) -> bool:
    return True


def groups_of(variables: dict[str, object]) -> list[dict[str, object]]:
    groups = variables.get("fleet_engine_groups")
    return [g for g in groups if isinstance(g, dict)] if isinstance(groups, list) else []


def has_groups(variables: dict[str, object]) -> bool:
    return "fleet_engine_groups" in variables


def group_alive(group: dict[str, object]) -> Callable[[dict[str, object]], bool]:
    def holds(variables: dict[str, object]) -> bool:
        groups = variables.get("fleet_engine_groups")
        return isinstance(groups, list) and any(g is group for g in groups)

    return holds


def model_alive(name: str, model: dict[str, object]) -> Callable[[dict[str, object]], bool]:
    """The model entry is still this object and a group still uses it."""

    def holds(variables: dict[str, object]) -> bool:
        models = variables.get("fleet_models")
        return (
            isinstance(models, dict)
            and models.get(name) is model
            and any(g.get("model") == name for g in groups_of(variables))
        )

    return holds


def unchanged(container: dict[object, object], key: object, value: object) -> Callable[[], bool]:
    missing = object()
    return lambda: container.get(key, missing) is value


def typo(word: str, draw: st.DrawFn) -> str:
    """One edit of word: a dropped, doubled, swapped or replaced character."""
    i = draw(st.integers(0, len(word) - 1))
    edit = draw(st.sampled_from(["drop", "double", "swap", "replace"]))
    if edit == "drop":
        return word[:i] + word[i + 1 :]
    if edit == "double":
        return word[:i] + word[i] + word[i:]
    if edit == "swap" and i + 1 < len(word):
        return word[:i] + word[i + 1] + word[i] + word[i + 2 :]
    return word[:i] + draw(st.sampled_from("aeiosx_")) + word[i + 1 :]


def pick_group(draw: st.DrawFn, variables: dict[str, object]) -> dict[str, object] | None:
    groups = groups_of(variables)
    return draw(st.sampled_from(groups)) if groups else None


def pick_model(draw: st.DrawFn, variables: dict[str, object]) -> tuple[str, dict] | None:
    models = variables.get("fleet_models")
    if not isinstance(models, dict):
        return None
    used = [
        g["model"] for g in groups_of(variables) if isinstance(g.get("model"), str)
    ]  # fmt: skip
    names = [n for n in used if isinstance(models.get(n), dict)]
    if not names:
        return None
    name = draw(st.sampled_from(sorted(set(names))))
    return name, models[name]


NOOP = Mutation("nothing to mutate", False, always, ())


def m_group_field(draw: st.DrawFn, host: dict) -> Mutation:
    variables = host["variables"]
    group = pick_group(draw, variables)
    if group is None:
        return NOOP
    field = draw(st.sampled_from(GROUP_KEYS))
    bad = draw(st.booleans())
    value = draw(GROUP_BAD[field] if bad else GROUP_MAYBE[field])
    group[field] = value
    alive, same = group_alive(group), unchanged(group, field, value)
    if field == "block_size" and not bad and variables.get("fleet_accelerator") == "cpu":
        # The CPU backend takes multiples of 32 only.
        bad = value is not None and value % 32 != 0  # type: ignore[operator]

        def holds(v: dict[str, object]) -> bool:
            return alive(v) and same() and v.get("fleet_accelerator") == "cpu"

    elif field == "tensor_parallel_size" and not bad:
        bad = True

        def holds(v: dict[str, object]) -> bool:
            devices = group.get("devices")
            return alive(v) and same() and isinstance(devices, list) and len(devices) != value

    else:

        def holds(v: dict[str, object]) -> bool:
            return alive(v) and same()

    return Mutation(f"group.{field}={value!r:.60}", bad, holds, (f".{field}",))


def m_group_delete(draw: st.DrawFn, host: dict) -> Mutation:
    group = pick_group(draw, host["variables"])
    if not group:
        return NOOP
    field = draw(st.sampled_from(sorted(group, key=repr)))
    del group[field]
    alive = group_alive(group)
    certain = field in GROUP_REQUIRED or (
        field == "kv_cache_bytes" and host["variables"].get("fleet_accelerator") == "cpu"
    )

    def holds(v: dict[str, object]) -> bool:
        cpu = field != "kv_cache_bytes" or v.get("fleet_accelerator") == "cpu"
        return alive(v) and field not in group and cpu

    return Mutation(f"del group.{field}", certain, holds, (f".{field}",))


def m_group_unknown(draw: st.DrawFn, host: dict) -> Mutation:
    group = pick_group(draw, host["variables"])
    if group is None:
        return NOOP
    if draw(st.booleans()):
        key = typo(draw(st.sampled_from(GROUP_KEYS)), draw)
    else:
        key = draw(st.text(min_size=1, max_size=16))
    if key in GROUP_KEYS:
        return NOOP
    value = draw(TREE)
    group[key] = value
    alive, same = group_alive(group), unchanged(group, key, value)
    return Mutation(f"group.{key!r}", True, lambda v: alive(v) and same(), (key,))


def m_duplicate(draw: st.DrawFn, host: dict) -> Mutation:
    """A second group sharing the name, the port or a device of the first."""
    variables = host["variables"]
    group = pick_group(draw, variables)
    if group is None:
        return NOOP
    shared = draw(st.sampled_from(["name", "port", "devices"]))
    twin = copy.deepcopy(group)
    if shared != "name":
        twin["name"] = f"{group.get('name')}-twin"
    if shared != "port" and is_int(group.get("port")):
        twin["port"] = group["port"] + 1 if group["port"] < 65535 else 1024
    if shared != "devices" and isinstance(group.get("devices"), list) and group["devices"]:
        twin["devices"] = [group["devices"][0]]
        twin["tensor_parallel_size"] = 1
    variables["fleet_engine_groups"].append(twin)  # type: ignore[union-attr]
    alive, alive_twin = group_alive(group), group_alive(twin)
    value = group.get(shared)

    def holds(v: dict[str, object]) -> bool:
        both = alive(v) and alive_twin(v)
        return both and group.get(shared) == value and twin.get(shared) == value

    return Mutation(f"twin sharing {shared}", True, holds, (f".{shared}",))


TOP = (
    "fleet_accelerator", "fleet_engine_stack", "fleet_engine_groups", "fleet_models",
    "fleet_memory_utilization", "fleet_memory_reserve_bytes", "preflight_facts",
)  # fmt: skip


def top_level_certain(key: str, value: object) -> bool:
    """Whether a whole variable set to this value can never be right for an engine host."""
    if key == "fleet_accelerator":
        return value not in ACCELERATORS
    if key == "fleet_engine_stack":
        return not (isinstance(value, str) and value in CATALOG)
    if key == "fleet_engine_groups":
        return value != []
    if key == "fleet_models":
        return True  # the groups' models cannot be in a random tree (checked in holds)
    if key == "fleet_memory_utilization":
        number = isinstance(value, float | int) and not isinstance(value, bool)
        return not (number and 0 < value <= 1)  # type: ignore[operator]
    if key == "fleet_memory_reserve_bytes":
        return not positive_int(value, 0)
    return not isinstance(value, dict)  # preflight_facts


def m_top_tree(draw: st.DrawFn, host: dict) -> Mutation:
    variables = host["variables"]
    key = draw(st.sampled_from(TOP))
    value = draw(
        st.one_of(
            TREE,
            other_than(),
            st.floats(0.01, 1.0) if key == "fleet_memory_utilization" else st.nothing(),
            st.integers(0, 8 * 2**30) if key == "fleet_memory_reserve_bytes" else st.nothing(),
        )
    )
    target = host if key == "preflight_facts" else variables
    target[key if key != "preflight_facts" else "facts"] = value
    same = unchanged(target, key if key != "preflight_facts" else "facts", value)
    certain = top_level_certain(key, value)

    def holds(v: dict[str, object]) -> bool:
        if not same():
            return False
        if key == "fleet_models":
            used = [g.get("model") for g in groups_of(v)]
            return bool(used) and not (
                isinstance(value, dict) and any(isinstance(u, str) and u in value for u in used)
            )
        if key == "preflight_facts":
            return "probe" not in host
        return has_groups(v)

    expect = (key, "fleet_engine_groups") if key == "fleet_models" else (key,)
    return Mutation(f"{key}={value!r:.60}", certain, holds, expect)


def m_top_delete(draw: st.DrawFn, host: dict) -> Mutation:
    variables = host["variables"]
    if not variables:
        return NOOP
    key = draw(st.sampled_from(sorted(variables)))
    del variables[key]
    certain = key in ("fleet_accelerator", "fleet_engine_stack", "fleet_models")

    def holds(v: dict[str, object]) -> bool:
        if key == "fleet_models":
            return key not in v and bool(groups_of(v))
        return key not in v and has_groups(v)

    expect = (key, "fleet_engine_groups") if key == "fleet_models" else (key,)
    return Mutation(f"del {key}", certain, holds, expect)


def m_top_unknown(draw: st.DrawFn, host: dict) -> Mutation:
    """A variable under a fleet prefix that no role documents: a typo or made up."""
    variables = host["variables"]
    known = sorted(k for k in KNOWN if k.split("_", 1)[0] in PLUGIN.PREFIXES)
    word = draw(st.sampled_from(known))
    prefix, rest = word.split("_", 1)
    suffix = draw(
        st.one_of(
            st.just(typo(rest, draw)),
            st.text(alphabet=string.ascii_lowercase + "_", min_size=1, max_size=12),
        )
    )
    key = f"{prefix}_{suffix}"
    if key in KNOWN or key in variables:
        return NOOP
    value = draw(TREE)
    variables[key] = value
    same = unchanged(variables, key, value)
    return Mutation(f"{key}=...", True, lambda v: same(), (key,))


def m_model_field(draw: st.DrawFn, host: dict) -> Mutation:
    variables = host["variables"]
    picked = pick_model(draw, variables)
    if picked is None:
        return NOOP
    name, model = picked
    source = model.get("source")
    field = draw(st.sampled_from([*MODEL_KEYS, "unknown", "delete", "entry"]))
    alive = model_alive(name, model)
    where = f"fleet_models.{name}"
    if field == "entry":
        value = draw(other_than("dict"))
        variables["fleet_models"][name] = value  # type: ignore[index]
        models = variables["fleet_models"]
        same = unchanged(models, name, value)  # type: ignore[arg-type]

        def entry_holds(v: dict[str, object]) -> bool:
            used = any(g.get("model") == name for g in groups_of(v))
            return v.get("fleet_models") is models and same() and used

        return Mutation(f"{where}={value!r:.60}", True, entry_holds, (where,))
    if field == "delete":
        if not model:
            return NOOP
        key = draw(st.sampled_from(sorted(model, key=repr)))
        del model[key]
        required = ("source", "revision", "served_name", SOURCE_KEY.get(str(source)))
        return Mutation(
            f"del {where}.{key}",
            key in required,
            lambda v: alive(v) and key not in model and model.get("source") == source,
            (f"{where}.{key}", f"{where}.source"),
        )
    if field == "unknown":
        key = typo(draw(st.sampled_from(MODEL_KEYS)), draw) if draw(st.booleans()) else draw(KEYS)
        if key in MODEL_KEYS:
            return NOOP
        value = draw(TREE)
        model[key] = value
        same = unchanged(model, key, value)
        return Mutation(f"{where}.{key!r}", True, lambda v: alive(v) and same(), (str(key),))
    bad, value = draw(model_value(field, source))
    if field == "config" and not bad:
        return m_config(draw, name, model, alive)
    model[field] = value
    same = unchanged(model, field, value)

    def holds(v: dict[str, object]) -> bool:
        return alive(v) and same() and model.get("source") == source

    return Mutation(f"{where}.{field}={value!r:.60}", bad, holds, (f"{where}.{field}",))


def model_value(field: str, source: object) -> st.SearchStrategy[tuple[bool, object]]:
    """(certainly invalid, value) for one model setting."""
    maybe = TREE.map(lambda v: (False, v))
    if field == "source":
        bad = TREE.filter(lambda v: v not in MODEL_SOURCES)
        valid = st.sampled_from(MODEL_SOURCES).map(lambda v: (False, v))
        return st.one_of(bad.map(lambda v: (True, v)), valid)
    if field == "revision":
        width = PINS.get(str(source), 64)
        pinned = re.compile(rf"[0-9a-f]{{{width}}}")
        bad = st.one_of(other_than("str"), STRS, st.just("b" * width + "\n"))
        return st.one_of(
            bad.filter(lambda v: not (isinstance(v, str) and pinned.fullmatch(v))).map(
                lambda v: (True, v)
            ),
            st.from_regex(pinned, fullmatch=True).map(lambda v: (False, v)),
        )
    if field == "served_name":
        return st.one_of(other_than("str"), st.just("")).map(lambda v: (True, v))
    if field in ("url", "repo", "path", "endpoint", "manifest"):
        required = SOURCE_KEY.get(str(source)) == field
        bad = other_than("str") if required else other_than("str", "none")
        return st.one_of(
            bad.map(lambda v: (True, v)),
            st.just((required, "")),
            STRS.filter(bool).map(lambda v: (False, v)),
        )
    if field in ("allow_patterns", "ignore_patterns"):
        return st.one_of(
            other_than("list", "none").map(lambda v: (True, v)),
            with_bad_item(STRS, other_than("str")).map(lambda v: (True, v)),
            st.lists(STRS, max_size=3).map(lambda v: (False, v)),
        )
    if field == "weight_bytes":
        return st.one_of(
            st.one_of(
                other_than("int", "none"), st.integers(max_value=-1), st.integers(INT64 + 1)
            ).map(lambda v: (True, v)),
            st.integers(0, 2**45).map(lambda v: (False, v)),
        )
    if field == "ttft_p99_threshold_seconds":
        return st.one_of(
            st.one_of(
                other_than("int", "float"),
                st.integers(max_value=0),
                st.floats(max_value=0),
                st.sampled_from([math.nan, math.inf]),
            ).map(lambda v: (True, v)),
            st.floats(0.001, 600).map(lambda v: (False, v)),
        )
    if field == "config":
        return st.one_of(
            other_than("dict", "none").map(lambda v: (True, v)), st.just((False, None))
        )
    return maybe


def m_config(
    draw: st.DrawFn, name: str, model: dict, alive: Callable[[dict[str, object]], bool]
) -> Mutation:
    """A config.json field with a wrong value (the KV plan reads them)."""
    config = model.get("config")
    if not isinstance(config, dict):
        return NOOP
    key = draw(
        st.sampled_from(
            [*CONFIG_REQUIRED, "num_key_value_heads", "head_dim", "hidden_size",
             "max_position_embeddings", "sliding_window", "torch_dtype", "kv_lora_rank",
             "layer_types", "text_config"]
        )
    )  # fmt: skip
    where = f"fleet_models.{name}"
    if key in CONFIG_REQUIRED and draw(st.booleans()):
        del config[key]
        return Mutation(
            f"del {where}.config.{key}",
            True,
            lambda v: alive(v) and model.get("config") is config and key not in config,
            (f"{where}.config",),
        )
    bad = draw(st.booleans()) and key in (*CONFIG_REQUIRED, "num_key_value_heads", "head_dim")
    if bad:
        value = draw(
            st.one_of(
                other_than("int", "none"),
                st.integers(max_value=-1),
                st.integers(INT64 + 1),
                st.just(0) if key in CONFIG_REQUIRED else st.nothing(),
            ).filter(lambda v: key in CONFIG_REQUIRED or bool(v))
        )
    else:
        value = draw(st.one_of(TREE, st.integers(0, 256)))
    config[key] = value
    same = unchanged(config, key, value)
    return Mutation(
        f"{where}.config.{key}={value!r:.60}",
        bad,
        lambda v: alive(v) and model.get("config") is config and same(),
        (f"{where}.config",),
    )


FACT_BAD: dict[str, st.SearchStrategy[object]] = {
    "python": other_than("str"),
    "cpu_count": st.one_of(other_than("int"), st.integers(max_value=-1), st.integers(INT64 + 1)),
    "memory_bytes": st.one_of(other_than("int"), st.integers(max_value=-1), st.integers(INT64 + 1)),
    "driver_version": other_than("str"),
    "cann_version": other_than("str"),
    "devices": st.one_of(
        other_than("list"),
        with_bad_item(
            st.fixed_dictionaries({"index": st.integers(0, 7), "memory_bytes": st.integers(0)}),
            st.one_of(
                other_than("dict"),
                st.fixed_dictionaries({"memory_bytes": st.integers(0)}),
                st.fixed_dictionaries({"index": other_than("int"), "memory_bytes": INTS}),
                st.fixed_dictionaries(
                    {"index": st.integers(0, 7), "memory_bytes": other_than("int")}
                ),
                st.fixed_dictionaries({"index": st.integers(0, 7), "healthy": other_than("bool")}),
                st.fixed_dictionaries({"index": st.integers(0, 7), "bogus": TREE}),
            ),
        ),
    ),
    "models": st.one_of(
        other_than("dict", "none"),
        st.dictionaries(st.text(min_size=1, max_size=8), other_than("dict"), min_size=1),
    ),
}
FACT_MAYBE: dict[str, st.SearchStrategy[object]] = {
    "python": st.sampled_from(["3.10", "3.11", "3.12", ""]),
    "cpu_count": st.integers(0, 512),
    "memory_bytes": st.integers(0, 2**45),
    "driver_version": st.one_of(st.text(max_size=12), st.from_regex(r"[0-9]{3}\.[0-9]{2}")),
    "cann_version": st.text(max_size=12),
    "devices": st.lists(
        st.fixed_dictionaries(
            {"index": st.integers(0, 15), "memory_bytes": st.integers(0, 2**38)},
            optional={"healthy": st.booleans()},
        ),
        max_size=9,
    ),
    # Installed models (the groups' own among them): their config and size replace the catalog's.
    "models": st.dictionaries(
        st.one_of(st.sampled_from(MODEL_NAMES), st.text(min_size=1, max_size=8)),
        st.fixed_dictionaries({}, optional={"config": TREE, "weight_bytes": TREE}),
        max_size=2,
    ),
}


def m_facts(draw: st.DrawFn, host: dict) -> Mutation:
    facts = host["facts"]
    if not isinstance(facts, dict):
        return NOOP
    field = draw(st.sampled_from([*FACT_BAD, "unknown"]))
    if field == "unknown":
        key = draw(st.text(min_size=1, max_size=12).filter(lambda k: k not in FACT_BAD))
        value = draw(TREE)
        bad = True
    else:
        key = field
        bad = draw(st.booleans())
        value = draw(FACT_BAD[field] if bad else FACT_MAYBE[field])
    facts[key] = value
    same = unchanged(facts, key, value)
    return Mutation(
        f"preflight_facts.{key}={value!r:.60}",
        bad,
        lambda v: host["facts"] is facts and same() and "probe" not in host,
        ("preflight_facts",),
    )


NVIDIA_SMI = st.one_of(
    st.just("0, 81559, 580.95.05\n1, 81559, 580.95.05\n"),
    st.just("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"),
    st.just("0, [N/A], 580.95.05\n"),
    st.just("0, 81559\n"),
    STRS,
)
PROBE = st.fixed_dictionaries(
    {},
    optional={
        # set_fact renders every value: numbers arrive as strings.
        "python": st.one_of(st.sampled_from(["3.11", "3.12"]), STRS),
        "cpu_count": st.one_of(st.integers(0, 512).map(str), STRS, INTS),
        "memory_mb": st.one_of(st.integers(0, 2**21).map(str), STRS, INTS),
        "nvidia_smi": NVIDIA_SMI,
        "npu_smi": st.one_of(st.just(NPU_SMI), STRS),
        "ascend_driver_info": st.one_of(st.just("Version=25.2.0\n"), STRS),
        "cann_info": st.one_of(st.just("version=9.1.0\n"), STRS, INTS),
    },
)
MODEL_INFO = st.fixed_dictionaries(
    {
        "results": st.lists(
            st.fixed_dictionaries(
                {
                    "item": st.one_of(st.sampled_from(MODEL_NAMES), STRS),
                    "rc": st.sampled_from([0, 0, 1]),
                    "stdout": st.one_of(
                        TREE.map(lambda t: json.dumps(t, default=str)),
                        st.fixed_dictionaries({"config": TREE, "weight_bytes": TREE}).map(
                            json.dumps
                        ),
                        STRS,
                    ),
                }
            ),
            max_size=2,
        )
    }
)


def m_probe(draw: st.DrawFn, host: dict) -> Mutation:
    """Facts from the hosts' own probes (read-only commands) instead of a fixture."""
    host["probe"] = {"preflight_probe": draw(PROBE), "preflight_model_info": draw(MODEL_INFO)}
    return Mutation("probed facts", False, always, ())


def m_random_path(draw: st.DrawFn, host: dict) -> Mutation:
    """Any node of the variables set to a random tree, or deleted: valid or not, unknown."""
    node: object = host["variables"]
    for _ in range(draw(st.integers(1, 5))):
        if isinstance(node, dict) and node:
            key = draw(st.sampled_from(sorted(node, key=repr)))
        elif isinstance(node, list) and node:
            key = draw(st.integers(0, len(node) - 1))
        else:
            break
        child = node[key]  # type: ignore[index]
        if not isinstance(child, dict | list) or not child or draw(st.booleans()):
            if draw(st.booleans()) and isinstance(node, dict):
                del node[key]
            else:
                node[key] = draw(TREE)  # type: ignore[index]
            return Mutation(f"random at {key!r:.40}", False, always, ())
        node = child
    return NOOP


MUTATIONS = [
    m_group_field, m_group_field, m_group_field, m_group_delete, m_group_unknown, m_duplicate,
    m_top_tree, m_top_delete, m_top_unknown, m_model_field, m_model_field, m_facts,
    m_probe, m_random_path,
]  # fmt: skip


@dataclass
class Host:
    name: str
    base: str
    variables: dict[str, object]
    facts: object
    mutations: list[Mutation]
    probe: dict[str, object] | None = None

    def hostvars(self) -> dict[str, object]:
        hostvars = dict(self.variables)
        if self.probe is None:
            hostvars["preflight_facts"] = self.facts
        else:
            hostvars |= self.probe
        # Ansible's own variables are there too; the plugin must read only the fleet's.
        hostvars |= {"inventory_hostname": self.name, "ansible_host": "10.0.0.1", "groups": {}}
        return hostvars

    @property
    def certain(self) -> list[Mutation]:
        final = self.variables
        return [m for m in self.mutations if m.certain and m.holds(final)]


@st.composite
def hosts(draw: st.DrawFn, index: int = 0) -> Host:
    name = draw(st.sampled_from(sorted(BASES)))
    host = base(name)
    mutations = [
        draw(st.sampled_from(MUTATIONS))(draw, host) for _ in range(draw(st.integers(1, 3)))
    ]
    probe = host.get("probe")
    return Host(f"host{index}", name, host["variables"], host["facts"], mutations, probe)


@st.composite
def inventories(draw: st.DrawFn) -> list[Host]:
    return [draw(hosts(i)) for i in range(draw(st.integers(1, 2)))]


@st.composite
def random_tree_inventories(draw: st.DrawFn) -> list[Host]:
    """Whole fleet_engine_groups or fleet_models replaced by a random JSON-like tree."""
    name = draw(st.sampled_from(sorted(BASES)))
    host = base(name)
    key = draw(st.sampled_from(["fleet_engine_groups", "fleet_models"]))
    if key == "fleet_engine_groups":
        value = draw(
            st.one_of(
                TREE,
                st.lists(
                    st.dictionaries(st.sampled_from(GROUP_KEYS), TREE, max_size=8), max_size=3
                ),
            )
        )
    else:
        model = draw(st.sampled_from(sorted(host["variables"]["fleet_models"])))
        value = draw(
            st.one_of(
                TREE,
                st.dictionaries(
                    st.one_of(st.just(model), KEYS),
                    st.one_of(TREE, st.dictionaries(st.sampled_from(MODEL_KEYS), TREE)),
                    max_size=3,
                ),
            )
        )
    host["variables"][key] = value
    mutation = Mutation(f"{key} = random tree", False, always, ())
    return [Host("host0", name, host["variables"], host["facts"], [mutation])]


# -- the properties ----------------------------------------------------------------------
def preflight(inventory: list[Host]) -> PreflightResult:
    """The plugin's path: hostvars -> HostInput -> validate -> the task's result and report."""
    inputs = [PLUGIN.host_input(h.name, h.hostvars(), {}) for h in inventory]
    outcome = validate(inputs, CATALOG, KNOWN)
    names = [h.name for h in inventory]
    result = PLUGIN.summarize(outcome, names)
    json.loads(PLUGIN.report_json(outcome))
    assert isinstance(result["msg"], str) and result["msg"]
    if outcome.errors:
        assert result["failed"] is True
        assert "no host was changed" in result["msg"]
    return outcome


def assert_well_formed(finding: Finding, hosts: list[str]) -> None:
    assert finding.host in hosts
    for part in (finding.key, finding.message, finding.fix):
        assert isinstance(part, str) and part.strip(), finding
    text = str(finding)
    assert text.startswith(f"{finding.host}: {finding.key}=") and "; fix: " in text
    for part in (finding.message, finding.fix):
        assert not GARBAGE.search(part), text


def engine_config_refuses(variables: dict[str, object], group: object) -> bool:
    """Whether the host would refuse this group later: vllm_engine's template, then EngineConfig."""
    models = variables.get("fleet_models")
    if not isinstance(group, dict) or not isinstance(models, dict):
        return True
    if any(k not in group for k in GROUP_REQUIRED):
        return True
    settings_ = {**GROUP_DEFAULTS, **group}
    model = settings_["model"]
    if not isinstance(model, str) or not isinstance(models.get(model), dict):
        return True
    entry = models[model]
    if "served_name" not in entry or not isinstance(settings_["extra_args"], list):
        return True  # an undefined attribute or list + str: the template fails
    data = {
        "group": settings_["name"],
        "accelerator": variables.get("fleet_accelerator"),
        "stack": variables.get("fleet_engine_stack"),
        "stack_dir": f"/opt/vllm-fleet/stacks/{variables.get('fleet_engine_stack')}",
        "model_path": f"/srv/models/{model}/{entry.get('revision')}",
        "served_name": entry["served_name"],
        "port": settings_["port"],
        "devices": settings_["devices"],
        "max_model_len": settings_["max_model_len"],
        "max_num_seqs": settings_["max_num_seqs"],
        "kv_cache_bytes": settings_.get("kv_cache_bytes", 1),  # or the plan's
        "memory_max_bytes": settings_.get("memory_max_bytes"),  # or the plan's
        "dtype": settings_["dtype"],
        "kv_cache_dtype": settings_["kv_cache_dtype"],
        "enforce_eager": settings_["enforce_eager"],
        "enable_prefix_caching": settings_["enable_prefix_caching"],
        "tensor_parallel_size": settings_["tensor_parallel_size"],
        "block_size": settings_["block_size"],
        "extra_args": settings_["extra_args"],
        "env": settings_["env"],
    }
    try:
        # to_nice_json then the host's json.load: the values as the host reads them.
        EngineConfig.model_validate(json.loads(json.dumps(data, default=str)))
    except (ValidationError, ValueError):
        return True
    return False


def later_refusals(variables: dict[str, object]) -> list[str]:
    """What the roles after preflight would refuse on this host (after changing it)."""
    if "fleet_engine_groups" not in variables:
        return []
    groups = variables["fleet_engine_groups"]
    if not isinstance(groups, list):
        return ["fleet_engine_groups is not a list"]
    problems = [
        f"EngineConfig refuses {g!r:.80}" for g in groups if engine_config_refuses(variables, g)
    ]
    models = variables.get("fleet_models")
    for group in groups_of(variables):
        name = group.get("model")
        if isinstance(models, dict) and isinstance(name, str):
            problems += weights_problems(name, models)
    return problems


def weights_problems(name: str, models: dict[object, object]) -> list[str]:
    """The model_weights role's own check of a model; its failure fails the role, too."""
    return WEIGHTS.spec_problems(name, models)


def check_inventory(inventory: list[Host]) -> None:
    RAN["inventories"] += 1
    outcome = preflight(inventory)
    names = [h.name for h in inventory]
    for finding in outcome.errors + outcome.warnings:
        assert_well_formed(finding, names)
    for host in inventory:
        RAN["hosts"] += 1
        errors = [e for e in outcome.errors if e.host == host.name]
        RAN["refused"] += bool(errors)
        certain = host.certain
        RAN["certain"] += bool(certain)
        if certain:
            assert errors, f"{host.name} ({host.base}) passed: {[m.label for m in certain]}"
        if len(host.mutations) == 1 and certain:
            [mutation] = certain
            keys = [e.key for e in errors]
            assert any(f in k for f in mutation.expect for k in keys), (mutation.label, keys)
        later = later_refusals(host.variables)
        if later:
            assert errors, f"{host.name} ({host.base}) passed, refused later: {later}"
        warnings = [w for w in outcome.warnings if w.host == host.name]
        if not errors and not warnings:
            planned = {row.group for row in outcome.plan if row.host == host.name}
            for group in groups_of(host.variables):
                assert "kv_cache_bytes" in group or group["name"] in planned, group


COMMON = {
    "deadline": None,
    "print_blob": True,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}


@settings(max_examples=800 * SCALE, **COMMON)
@given(inventories())
def fuzz_mutated(inventory: list[Host]) -> None:
    check_inventory(inventory)


@settings(max_examples=200 * SCALE, **COMMON)
@given(random_tree_inventories())
def fuzz_random_trees(inventory: list[Host]) -> None:
    check_inventory(inventory)


# Crashes the fuzz found on the plugin's own path (fixtures, probes, the agent's model-info),
# which cases.yml cannot express: each is now a finding. They also run as explicit examples
# of the fuzz, through every property above.
def regression(base_name: str, *, facts: object = None, probe: dict | None = None) -> list[Host]:
    host = base(base_name)
    if facts is not None:
        host["facts"] = facts(host["facts"]) if callable(facts) else facts
    mutation = Mutation("regression", False, always, ())
    return [Host("host0", base_name, host["variables"], host["facts"], [mutation], probe)]


def probed(**probe: object) -> dict[str, object]:
    model_info = probe.pop("model_info", [])
    return {"preflight_probe": probe, "preflight_model_info": {"results": model_info}}


def info(stdout: str) -> list[dict[str, object]]:
    return [{"item": "qwen2.5-32b", "rc": 0, "stdout": stdout}]


NVIDIA_SMI_FAILED = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
REGRESSIONS = {
    # dict(preflight_facts) raised TypeError or ValueError.
    "fixture that is not a mapping": (
        regression("cpu", facts="python 3.11"),
        "error",
        "preflight_facts='python 3.11': must be a mapping of the host's facts",
    ),
    # plan_group called .get on it: AttributeError.
    "installed models that are not a mapping": (
        regression("ascend", facts=lambda f: {**f, "models": False}),
        "error",
        "preflight_facts.models=False: must be a mapping of model name to its facts",
    ),
    # parse_nvidia_smi unpacked three fields: ValueError.
    "nvidia-smi that cannot reach the driver": (
        regression("cuda", probe=probed(nvidia_smi=NVIDIA_SMI_FAILED)),
        "warning",
        "preflight_nvidia_smi=\"NVIDIA-SMI has failed because it couldn't communicate",
    ),
    # float('[N/A]'): ValueError.
    "nvidia-smi without a memory size": (
        regression("cuda", probe=probed(nvidia_smi="0, [N/A], 580.95.05\n")),
        "warning",
        "preflight_nvidia_smi='0, [N/A], 580.95.05': nvidia-smi printed a line preflight cannot read",
    ),
    # int() of the rendered fact: ValueError.
    "a CPU count that is no number": (
        regression("cpu", probe=probed(python="3.11", cpu_count="{{ undefined_var }}")),
        "warning",
        "preflight_probe.cpu_count='{{ undefined_var }}': the host's facts gave no number here",
    ),
    # json.loads: JSONDecodeError.
    "model-info output that is not JSON": (
        regression("ascend", probe=probed(model_info=info("Traceback (most recent call last):"))),
        "warning",
        "preflight_model_info[qwen2.5-32b]='Traceback (most recent call last):': the agent's "
        "model-info printed no JSON mapping",
    ),
    # plan_group called .get on None: AttributeError.
    "model-info output that is JSON null": (
        regression("ascend", probe=probed(model_info=info("null"))),
        "warning",
        "preflight_model_info[qwen2.5-32b]='null'",
    ),
    # json.loads: RecursionError.
    "model-info output nested past the parser's depth": (
        regression("ascend", probe=probed(model_info=info("[" * 5000))),
        "warning",
        "preflight_model_info[qwen2.5-32b]='[[[[",
    ),
}


for _inventory, _severity, _expect in REGRESSIONS.values():
    fuzz_mutated = example(_inventory)(fuzz_mutated)


@pytest.mark.parametrize("name", sorted(REGRESSIONS))
def test_crashes_the_fuzz_found_are_findings(name):
    inventory, severity, expect = REGRESSIONS[name]
    outcome = preflight(inventory)
    findings = outcome.errors if severity == "error" else outcome.warnings
    assert any(expect in str(f) for f in findings), [str(f) for f in findings]


def test_fuzzed_inventories_are_refused_with_messages_never_a_traceback():
    RAN.update(inventories=0, hosts=0, refused=0, certain=0)
    fuzz_mutated()
    fuzz_random_trees()
    print(f"preflight fuzz: {RAN}")
    assert RAN["inventories"] >= 1000, RAN
