"""How each model source pins its bytes, and what it needs: the one home of these rules.

Preflight, the model_weights role's filters and every fetch read them from here, so a model
that preflight accepts is one the role and the fetch accept too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX40 = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class Pin:
    pattern: re.Pattern[str]
    what: str  # what the revision must be
    where: str  # where an operator finds it

    def fix(self) -> str:
        return f"pin {self.what} ({self.where})"


PINS: dict[str, Pin] = {
    "mirror": Pin(
        _HEX64,
        "the 64-hex sha256 of the mirror's manifest.json",
        "vllm-fleet weights publish prints it",
    ),
    "local": Pin(
        _HEX64,
        "the 64-hex sha256 of the staged manifest.json",
        "vllm-fleet weights publish prints it",
    ),
    "hf": Pin(
        _HEX40,
        "a 40-hex commit sha",
        "the full id in the Hub repo's history, lowercase: a branch or tag can move under you",
    ),
    "modelscope": Pin(
        _HEX40,
        "a 40-hex commit id",
        "the full id in the ModelScope repo's history, lowercase: a branch or tag can move under you",
    ),
}
SOURCES = tuple(PINS)
# The setting each source cannot fetch without.
REQUIRED = {"mirror": "url", "local": "path", "hf": "repo", "modelscope": "repo"}
# Sources fetched from outside the fleet: once, on the cache host, when there is one.
UPSTREAM = ("hf", "modelscope")


def is_source(source: object) -> bool:
    return isinstance(source, str) and source in PINS


def is_pinned(source: str, revision: object) -> bool:
    """Whether ``revision`` pins bytes for ``source`` (whole string: no trailing newline)."""
    return isinstance(revision, str) and PINS[source].pattern.fullmatch(revision) is not None


def is_commit(value: object) -> bool:
    """A full 40-hex commit id, as the Hub and ModelScope name them."""
    return isinstance(value, str) and _HEX40.fullmatch(value) is not None


def revision_problem(name: str, source: str, revision: object) -> str:
    """The sentence a fetch raises for an unpinned revision; '' when it is pinned."""
    if is_pinned(source, revision):
        return ""
    return f"fleet_models.{name}.revision={revision!r} is not pinned for source={source}: {PINS[source].fix()}"


# What nginx's map can hold as a literal key and a shell never needs quoting for: base64
# (openssl rand -base64 32) or hex.
CACHE_TOKEN_MIN = 32
# "Bearer <token>" must fit one bucket of nginx's map hash (map_hash_bucket_size 256).
CACHE_TOKEN_MAX = 200
CACHE_TOKEN_CHARS = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=._-"
)


def cache_token_problem(token: object) -> str:
    """Why fleet_model_cache_token cannot guard the cache ('' when it can); never its value."""
    if not isinstance(token, str) or not token:
        return "is not set"
    if len(token) < CACHE_TOKEN_MIN:
        return f"is {len(token)} characters long, fewer than {CACHE_TOKEN_MIN}"
    if len(token) > CACHE_TOKEN_MAX:
        return f"is {len(token)} characters long, more than {CACHE_TOKEN_MAX}"
    if not set(token) <= CACHE_TOKEN_CHARS:
        return "holds characters other than base64's (letters, digits, + / =) and . _ -"
    return ""
