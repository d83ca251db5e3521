"""The model_weights role's filters: which host fetches what, from where, with which token."""

from __future__ import annotations

from vllm_fleet.ansible import model_weights as filters

CATALOG = {
    "mir": {"source": "mirror", "url": "http://m/models/mir", "revision": "b" * 64},
    "hub": {
        "source": "hf",
        "repo": "org/x",
        "revision": "c" * 40,
        "allow_patterns": ["*.json", "*.safetensors"],
    },
    "ms": {"source": "modelscope", "repo": "org/y", "revision": "d" * 40, "endpoint": "http://e"},
    "loc": {"source": "local", "path": "/media/staged/loc", "revision": "e" * 64},
}


def test_upstream_models_go_through_the_cache_host_and_others_do_not():
    cache = "http://cache01:8090"
    assert filters.fetch_args("hub", CATALOG, cache) == {
        "name": "hub",
        "revision": "c" * 40,
        "source": "cache",
        "upstream": "hf",
        "url": cache,
        "repo": "org/x",
        "allow_patterns": ["*.json", "*.safetensors"],
    }
    assert filters.fetch_args("ms", CATALOG, cache)["source"] == "cache"
    assert filters.fetch_args("mir", CATALOG, cache) == {
        "name": "mir",
        "revision": "b" * 64,
        "source": "mirror",
        "url": "http://m/models/mir",
    }
    assert filters.fetch_args("loc", CATALOG, cache)["path"] == "/media/staged/loc"
    # Without a cache host, the upstream itself.
    assert filters.fetch_args("hub", CATALOG)["source"] == "hf"


def test_the_token_goes_only_to_a_fetch_that_reaches_the_upstream():
    tokens = {"hf": "hf_x", "modelscope": "ms_y"}
    assert filters.token_for(filters.fetch_args("hub", CATALOG), tokens) == "hf_x"
    assert filters.token_for(filters.fetch_args("ms", CATALOG), tokens) == "ms_y"
    assert filters.token_for(filters.fetch_args("hub", CATALOG, "http://c:1"), tokens) is None
    assert filters.token_for(filters.fetch_args("mir", CATALOG), tokens) is None
    assert filters.token_for(filters.fetch_args("hub", CATALOG), {"hf": ""}) is None


def test_the_cache_host_fetches_each_upstream_model_the_engines_use_once():
    hostvars = {
        "engine01": {
            "fleet_models": CATALOG,
            "fleet_engine_groups": [{"model": "hub"}, {"model": "mir"}],
        },
        "engine02": {
            "fleet_models": CATALOG,
            "fleet_engine_groups": [{"model": "hub"}, {"model": "ms"}, {"model": "nope"}],
        },
        "router01": {"fleet_models": CATALOG, "fleet_engine_groups": [{"model": "loc"}]},
    }
    engines = ["engine01", "engine02"]
    assert filters.fleet_models(hostvars, engines, ["hf", "modelscope"]) == ["hub", "ms"]


def test_every_source_is_valid_as_written_in_the_catalog():
    for name in CATALOG:
        assert filters.spec_problems(name, CATALOG) == []


def test_each_problem_names_the_key_the_value_and_the_fix():
    catalog = {
        "a": {"source": "mirror", "revision": "v1"},
        "b": {"source": "modelscope", "repo": "o/r", "revision": "master"},
        "c": {"source": "hf", "repo": "o/r", "revision": "c" * 40, "ignore_patterns": [1]},
        "d": "not a mapping",
    }
    assert filters.spec_problems("a", catalog) == [
        "fleet_models.a.revision='v1' is not pinned for source=mirror: pin the 64-hex sha256 "
        "of the mirror's manifest.json (vllm-fleet weights publish prints it)",
        "fleet_models.a.url is required for source=mirror",
    ]
    assert "pin a 40-hex commit id" in filters.spec_problems("b", catalog)[0]
    assert filters.spec_problems("c", catalog) == [
        "fleet_models.c.ignore_patterns=[1] must be a list of glob patterns, "
        "like ['*.safetensors', '*.json']"
    ]
    assert "fleet_models.d is missing" in filters.spec_problems("d", catalog)[0]
    assert "fleet_models.zz is missing" in filters.spec_problems("zz", catalog)[0]


def test_the_role_agrees_with_preflight_on_odd_values():
    """What the fuzz found: a revision with a trailing newline passed the role's `^...$`, and an
    unhashable source raised TypeError instead of naming the value."""
    newline = {"a": {"source": "mirror", "url": "http://m/a", "revision": "a" * 64 + "\n"}}
    assert filters.spec_problems("a", newline)[0].startswith(
        "fleet_models.a.revision='" + "a" * 64 + "\\n' is not pinned for source=mirror"
    )
    unhashable = {"a": {"source": ["hf"], "repo": "o/r", "revision": "a" * 40}}
    assert filters.spec_problems("a", unhashable) == [
        "fleet_models.a.source=['hf'] is not a source this role fetches; "
        "use one of mirror, local, hf, modelscope"
    ]
