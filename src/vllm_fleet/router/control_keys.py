"""One router control key per engine host, derived from the fleet's key on the controller.

The routers' control plane adds and removes workers; a worker receives clients' prompts.
One key shared by every engine host would let any one host's compromise register workers
for ever, and the routers' audit log could not say which host acted. So each engine host
holds its own key, ``HMAC-SHA256(fleet key, host/generation)``: the operator keeps one
secret in Ansible Vault (``fleet_router_control_key``), the roles derive each host's key on
the controller, an engine host never sees the fleet's key or another host's, and the
routers accept exactly the keys of the hosts in the inventory, each under its host's name.

Revoking a host's key is bumping its ``fleet_router_control_key_generation`` (the host gets a
new key, the routers stop accepting the old one) or removing the host from the inventory.
The fleet's key itself is the operator's identity at the routers ("operator"), for the
controller's own calls; keys in ``fleet_router_control_keys_retiring`` (a rotation of the
fleet's key) keep their derived host keys accepted until the engine hosts hold the new ones.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

# The identity the fleet's own key acts under in the routers' audit log.
OPERATOR_ID = "operator"
# The credential (LoadCredential=) the router unit hands the keys over in.
CREDENTIAL = "router-control-keys.json"
# Inventory names are the audit identities: keep them to what a log line can carry plainly.
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


def host_control_key(fleet_key: str, host: str, generation: int = 0) -> str:
    """The control key of one engine host (URL-safe base64 of an HMAC-SHA256, 43 characters)."""
    if not fleet_key:
        return ""
    generation = int(generation)
    if generation < 0:
        raise ValueError(f"{host}: fleet_router_control_key_generation={generation} is negative")
    message = f"vllm-fleet/router-control/v1/{host}/{generation}".encode()
    digest = hmac.new(fleet_key.encode(), message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def router_control_keys(
    fleet_key: str, retiring: Iterable[str], generations: Mapping[str, int]
) -> list[dict[str, str]]:
    """Every key a router accepts, as {id, key}: the operator's, then one per engine host.

    ``generations`` maps each engine host of the inventory to its key generation. A retiring
    fleet key adds its operator key and its host keys (ids suffixed ``-retiring-N``).
    """
    hosts = sorted(generations)
    bad = [h for h in hosts if not _ID_RE.match(h) or h == OPERATOR_ID]
    if bad:
        raise ValueError(f"engine host names not usable as control-key identities: {bad}")
    keys: list[dict[str, str]] = []
    for index, master in enumerate([fleet_key, *retiring]):
        suffix = "" if index == 0 else f"-retiring-{index}"
        keys.append({"id": OPERATOR_ID + suffix, "key": master})
        for host in hosts:
            keys.append(
                {"id": host + suffix, "key": host_control_key(master, host, generations[host])}
            )
    return keys


def host_generations(
    hosts: Iterable[str], hostvars: Mapping[str, Mapping[str, object]]
) -> dict[str, int]:
    """Each host's fleet_router_control_key_generation (0 when unset)."""
    found: dict[str, int] = {}
    for host in hosts:
        # A host named in the engines list but not in the inventory has no variables.
        # (Ansible's hostvars answers such a host with Undefined rather than a KeyError.)
        variables = hostvars[host] if host in hostvars else {}  # noqa: SIM401
        value = variables.get("fleet_router_control_key_generation", 0)
        found[host] = int(value)  # type: ignore[call-overload]
    return found


def read_control_keys(path: Path) -> list[tuple[str, str]]:
    """(id, key) of every key in the router's credential, refusing an empty or malformed one."""
    entries = json.loads(path.read_text())
    keys = [(str(e["id"]), str(e["key"])) for e in entries if e.get("key")]
    if not keys:
        raise ValueError(f"{path}: no control keys")
    return keys
