"""Filters of the model_weights role: which models a host or the cache host fetches, and how.

Kept in Python so the tasks stay free of long Jinja: each source's settings map to the
vllm_fleet_weights module's arguments, and a missing or unpinned setting becomes one
sentence naming the model, the key, the value and the fix.
"""

from __future__ import annotations

from typing import Any

from vllm_fleet.weights.pins import (
    REQUIRED,
    SOURCES,
    UPSTREAM,
    cache_token_problem,
    is_source,
    revision_problem,
)

PATTERN_KEYS = ("allow_patterns", "ignore_patterns")


def spec_problems(name: str, catalog: dict[str, Any]) -> list[str]:
    """What is wrong with fleet_models[name] for fetching it; empty when it can be fetched."""
    spec = catalog.get(name)
    if not isinstance(spec, dict):
        return [f"fleet_models.{name} is missing: add it with source, revision and served_name"]
    source = spec.get("source")
    if not is_source(source):
        return [
            f"fleet_models.{name}.source={source!r} is not a source this role fetches; "
            f"use one of {', '.join(SOURCES)}"
        ]
    problems = []
    pinned = revision_problem(name, str(source), spec.get("revision"))
    if pinned:
        problems.append(pinned)
    key = REQUIRED[str(source)]
    if not spec.get(key):
        problems.append(f"fleet_models.{name}.{key} is required for source={source}")
    for key in PATTERN_KEYS:
        value = spec.get(key)
        if value is not None and not (
            isinstance(value, list) and all(isinstance(v, str) for v in value)
        ):
            problems.append(
                f"fleet_models.{name}.{key}={value!r} must be a list of glob patterns, "
                "like ['*.safetensors', '*.json']"
            )
    return problems


def fleet_models(hostvars: dict[str, Any], hosts: list[str], sources: list[str]) -> list[str]:
    """The models the engine groups of these hosts use whose source is in sources."""
    names: set[str] = set()
    for host in hosts:
        variables = hostvars[host]
        catalog = variables.get("fleet_models") or {}
        for group in variables.get("fleet_engine_groups") or []:
            model = group.get("model")
            if isinstance(catalog.get(model), dict) and catalog[model].get("source") in sources:
                names.add(model)
    return sorted(names)


def fetch_args(name: str, catalog: dict[str, Any], cache_url: str = "") -> dict[str, Any]:
    """The module arguments that fetch fleet_models[name]: from the cache host when
    cache_url is given and the source is upstream, else from the source itself."""
    spec = catalog[name]
    source = spec["source"]
    args: dict[str, Any] = {"name": name, "revision": spec["revision"], "source": source}
    if source == "mirror":
        args["url"] = spec["url"]
    elif source == "local":
        args["path"] = spec["path"]
        if spec.get("manifest"):
            args["manifest"] = spec["manifest"]
    else:
        args["repo"] = spec["repo"]
        for key in ("endpoint", *PATTERN_KEYS):
            if spec.get(key) is not None:
                args[key] = spec[key]
        if cache_url:
            args.update(source="cache", upstream=source, url=cache_url)
    return args


def token_for(args: dict[str, Any], tokens: dict[str, str]) -> str | None:
    """The upstream token a fetch needs: only when it goes to the upstream itself."""
    if args["source"] in UPSTREAM:
        return tokens.get(args["source"]) or None
    return None


def cache_models(names: list[str], catalog: dict[str, Any], cache_url: str = "") -> list[str]:
    """Which of names this host fetches from the cache host."""
    return [n for n in names if fetch_args(n, catalog, cache_url)["source"] == "cache"]


def manifest_pins(stats: dict[str, Any]) -> dict[str, str]:
    """model -> the sha256 of the cache host's own manifest, from the role's looped stat of
    them on the cache host (``{results: [{item: model, stat: {exists, checksum}}]}``)."""
    pins = {}
    for result in stats.get("results", []):
        stat = result.get("stat") or {}
        if stat.get("exists") and stat.get("checksum"):
            pins[str(result["item"])] = str(stat["checksum"])
    return pins


FILTERS = {
    "model_weights_spec_problems": spec_problems,
    "model_weights_fleet_models": fleet_models,
    "model_weights_fetch_args": fetch_args,
    "model_weights_token_for": token_for,
    "model_weights_cache_models": cache_models,
    "model_weights_manifest_pins": manifest_pins,
    "model_weights_cache_token_problem": cache_token_problem,
}
