"""Preflight refuses a fleet whose model cache would serve, or be read, without a strong
read token or without TLS (vllm_fleet.preflight.model_cache), naming the host and never
the token."""

from __future__ import annotations

from vllm_fleet.preflight import HostInput
from vllm_fleet.preflight.facts import HostFacts
from vllm_fleet.preflight.model_cache import check_model_cache

MODELS = {
    "gated": {"source": "hf", "repo": "org/gated", "revision": "a" * 40},
    "mirrored": {"source": "mirror", "url": "http://mirror/m", "revision": "b" * 64},
}
STRONG = "Q2hhbmdlIG1lOiBhIHRlc3QgdG9rZW4gb25seS4u"  # 40 characters of base64
CA = {"fleet_ca_dir": "/srv/fleet-ca"}


def engine(model: str, name: str = "engine01", **extra: object) -> HostInput:
    variables: dict[str, object] = {
        "fleet_models": MODELS,
        "fleet_engine_groups": [{"name": "g0", "model": model}],
        **extra,
    }
    return HostInput(name, variables, HostFacts())


def cache_host(**extra: object) -> HostInput:
    return HostInput("cache01", {"fleet_models": MODELS, **extra}, HostFacts())


def test_no_cache_no_token_needed():
    assert check_model_cache([engine("gated")], []) == []


def test_an_engine_host_reading_a_gated_model_from_the_cache_needs_the_token():
    [finding] = check_model_cache([engine("gated", **CA)], ["cache01"])
    text = str(finding)
    assert text.startswith("engine01: fleet_model_cache_token='<redacted>': is not set")
    assert "fetches gated from the model cache cache01" in text
    assert "openssl rand -base64 32" in text


def test_an_engine_host_of_mirrored_models_only_needs_none():
    assert check_model_cache([engine("mirrored")], ["cache01"]) == []


def test_the_cache_host_needs_it_and_a_weak_or_odd_token_is_refused_unshown():
    for token, why in (
        ("short", "is 5 characters long, fewer than 32"),
        ("A" * 201, "is 201 characters long, more than 200"),
        ('"; return 200; #' + "x" * 20, "holds characters other than base64's"),
        (12345, "is not set"),
    ):
        [finding] = check_model_cache(
            [cache_host(fleet_model_cache_token=token, **CA)], ["cache01"]
        )
        assert why in str(finding), token
        assert "this host is the model cache" in str(finding)
        assert str(token) not in str(finding)


def test_without_a_fleet_ca_the_cache_and_its_readers_are_refused_unless_plain_is_said():
    hosts = [
        cache_host(fleet_model_cache_token=STRONG),
        engine("gated", fleet_model_cache_token=STRONG),
    ]
    findings = check_model_cache(hosts, ["cache01"])
    assert [(f.host, f.key) for f in findings] == [
        ("cache01", "fleet_ca_dir"),
        ("engine01", "fleet_ca_dir"),
    ]
    assert "this host serves the model cache, which speaks HTTPS" in str(findings[0])
    assert "vllm-fleet ca init DIR" in str(findings[0])
    assert "fleet_model_cache_plain_http: true" in str(findings[1])
    plain = [
        cache_host(fleet_model_cache_token=STRONG, fleet_model_cache_plain_http=True),
        engine("gated", fleet_model_cache_token=STRONG, fleet_model_cache_plain_http=True),
    ]
    assert check_model_cache(plain, ["cache01"]) == []
    [odd] = check_model_cache(
        [cache_host(fleet_model_cache_token=STRONG, fleet_model_cache_plain_http="yes")],
        ["cache01"],
    )
    assert str(odd).startswith("cache01: fleet_model_cache_plain_http='yes': must be true or false")


def test_a_strong_token_and_a_fleet_ca_pass_everywhere():
    hosts = [
        cache_host(fleet_model_cache_token=STRONG, **CA),
        engine("gated", fleet_model_cache_token=STRONG, **CA),
        engine("gated", "engine02", fleet_model_cache_token=STRONG, **CA),
    ]
    assert check_model_cache(hosts, ["cache01"]) == []
