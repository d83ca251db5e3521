"""Start the fleet's router in-process, keys from a systemd credential (never argv).

Runs inside the router's own venv (``python -m vllm_fleet.router.launch CONFIG``), where
only the router's wheels and this package (without its dependencies) are installed: it
imports nothing but the standard library and the router. Both routers take a RouterArgs
dataclass; building it here keeps the client and control keys out of ``ps``. The unit
hands the keys over with LoadCredential= rather than EnvironmentFile=, so they are not in
the process's environment block (/proc/<pid>/environ) either.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from vllm_fleet.router.control_keys import CREDENTIAL as CONTROL_CREDENTIAL
from vllm_fleet.router.control_keys import read_control_keys

CLIENT_KEY_ENV = "VLLM_FLEET_ROUTER_CLIENT_KEY"
# The credentials' names in the unit (LoadCredential=router.env:/etc/vllm-fleet/router.env):
# the client key, and every control key the router accepts with its identity
# (vllm_fleet.router.control_keys: the operator's and one per engine host).
CREDENTIAL = "router.env"
# What router.json holds (roles/router/templates/router.json.j2). Anything else is refused:
# a launcher older than its settings would otherwise drop what it does not know (a "tls"
# ignored is a router serving plain HTTP).
# "trust" holds the fleet CA's hash (the unit's SSL_CERT_FILE, which the router reads only at
# start): nothing for the launcher, it is there so a new CA restarts the router.
SETTINGS = frozenset({"impl", "package", "router_args", "tls", "trust"})


def router_kwargs(
    config: dict[str, Any], env: dict[str, str], control_keys: list[tuple[str, str]]
) -> dict[str, Any]:
    """RouterArgs fields from the rendered settings plus the keys (sglang only checks keys)."""
    kwargs = dict(config["router_args"])
    if config["impl"] == "sglang":
        client_key = env.get(CLIENT_KEY_ENV, "")
        if not client_key or not control_keys:
            raise SystemExit(
                f"router: {CLIENT_KEY_ENV} ({CREDENTIAL}) and the control keys "
                f"({CONTROL_CREDENTIAL}) must both be set; refusing to start an "
                "unauthenticated router"
            )
        kwargs["api_key"] = client_key
        # (id, name, key, role): only these keys may add or remove workers; the id is what
        # the audit log names (control_plane_audit_enabled in router.json).
        kwargs["control_plane_api_keys"] = [(i, i, key, "admin") for i, key in control_keys]
    return kwargs


def tls_kwargs(config: dict[str, Any], credentials_dir: str | None) -> dict[str, str]:
    """The client port's certificate and key (sglang's server_cert_path/server_key_path), from
    the unit's credentials (LoadCredential=tls.crt/tls.key: the key stays root-only on disk)."""
    tls = config.get("tls")
    if not tls:
        return {}
    paths = {field: Path(credentials_dir or "") / str(tls[name]) for field, name in
             (("server_cert_path", "cert"), ("server_key_path", "key"))}  # fmt: skip
    missing = [str(p) for p in paths.values() if not credentials_dir or not p.is_file()]
    if missing:
        raise SystemExit(
            f"router: TLS is on and {', '.join(missing)} is missing: the unit hands the host's "
            "certificate and key over with LoadCredential= (host_tls); refusing to serve plain HTTP"
        )
    return {field: str(path) for field, path in paths.items()}


def is_key_variable(name: str) -> bool:
    return name == CLIENT_KEY_ENV


def keys_from(credentials_dir: str | None, env: dict[str, str]) -> dict[str, str]:
    """The client key: from the unit's credential when there is one, else from the environment."""
    from vllm_fleet.env_file import read_env_file

    if credentials_dir and (Path(credentials_dir) / CREDENTIAL).is_file():
        return read_env_file(Path(credentials_dir) / CREDENTIAL)
    return {k: v for k, v in env.items() if is_key_variable(k)}


def control_keys_from(credentials_dir: str | None) -> list[tuple[str, str]]:
    """(id, key) of every control key in the unit's credential; none without one."""
    if credentials_dir and (Path(credentials_dir) / CONTROL_CREDENTIAL).is_file():
        return read_control_keys(Path(credentials_dir) / CONTROL_CREDENTIAL)
    return []


def build_args(
    config: dict[str, Any], env: dict[str, str], control_keys: list[tuple[str, str]]
) -> object:
    package = config["package"]
    router_args = importlib.import_module(f"{package}.router_args").RouterArgs
    known = {f.name for f in dataclasses.fields(router_args)}
    kwargs = router_kwargs(config, env, control_keys)
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise SystemExit(f"router: {package} does not take {', '.join(unknown)}")
    return router_args(**kwargs)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m vllm_fleet.router.launch ROUTER.json", file=sys.stderr)
        return 2
    config = json.loads(Path(argv[0]).read_text())
    unknown = sorted(set(config) - SETTINGS)
    if unknown:
        raise SystemExit(f"router: {argv[0]} holds settings this launcher does not know: {unknown}")
    credentials = os.environ.get("CREDENTIALS_DIRECTORY")
    keys = keys_from(credentials, dict(os.environ))
    config["router_args"] = {**config["router_args"], **tls_kwargs(config, credentials)}
    args = build_args(config, keys, control_keys_from(credentials))
    # Out of the environment, so nothing the router spawns inherits them.
    for name in [n for n in os.environ if is_key_variable(n)]:
        os.environ.pop(name, None)
    launcher = importlib.import_module(f"{config['package']}.launch_router")
    launcher.launch_router(args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
