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

CLIENT_KEY_ENV = "VLLM_FLEET_ROUTER_CLIENT_KEY"
# The credential's name in the unit (LoadCredential=router.env:/etc/vllm-fleet/router.env).
CREDENTIAL = "router.env"
CONTROL_KEY_ENV = "VLLM_FLEET_ROUTER_CONTROL_KEY"
# Control keys being rotated out (fleet_router_control_keys_retiring), one variable each
# (..._1, _2): the router accepts them beside the current one until the engine hosts have
# moved to it, so no host's joins and leaves are refused mid-rotation.
RETIRING_CONTROL_KEY_PREFIX = "VLLM_FLEET_ROUTER_RETIRING_CONTROL_KEY_"
# The control-plane key's identity in sglang-router's audit log.
CONTROL_KEY_ID = "vllm-fleet"


def router_kwargs(config: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """RouterArgs fields from the rendered settings plus the keys (sglang only checks keys)."""
    kwargs = dict(config["router_args"])
    if config["impl"] == "sglang":
        client_key = env.get(CLIENT_KEY_ENV, "")
        control_key = env.get(CONTROL_KEY_ENV, "")
        if not client_key or not control_key:
            raise SystemExit(
                f"router: {CLIENT_KEY_ENV} and {CONTROL_KEY_ENV} must both be set "
                "(the unit's EnvironmentFile); refusing to start an unauthenticated router"
            )
        kwargs["api_key"] = client_key
        # (id, name, key, role): only this key may add or remove workers.
        kwargs["control_plane_api_keys"] = [(CONTROL_KEY_ID, CONTROL_KEY_ID, control_key, "admin")]
        for name, key in retiring_control_keys(env):
            kwargs["control_plane_api_keys"].append((name, name, key, "admin"))
    return kwargs


def retiring_control_keys(env: dict[str, str]) -> list[tuple[str, str]]:
    """(audit id, key) of each retiring control key, in the order they were rendered."""
    found = []
    for name, key in env.items():
        suffix = name.removeprefix(RETIRING_CONTROL_KEY_PREFIX)
        if suffix != name and suffix.isdigit() and key:
            found.append((int(suffix), f"{CONTROL_KEY_ID}-retiring-{suffix}", key))
    return [(audit_id, key) for _, audit_id, key in sorted(found)]


def is_key_variable(name: str) -> bool:
    return name in (CLIENT_KEY_ENV, CONTROL_KEY_ENV) or name.startswith(RETIRING_CONTROL_KEY_PREFIX)


def keys_from(credentials_dir: str | None, env: dict[str, str]) -> dict[str, str]:
    """The keys: from the unit's credential when there is one, else from the environment."""
    from vllm_fleet.env_file import read_env_file

    if credentials_dir and (Path(credentials_dir) / CREDENTIAL).is_file():
        return read_env_file(Path(credentials_dir) / CREDENTIAL)
    return {k: v for k, v in env.items() if is_key_variable(k)}


def build_args(config: dict[str, Any], env: dict[str, str]) -> object:
    package = config["package"]
    router_args = importlib.import_module(f"{package}.router_args").RouterArgs
    known = {f.name for f in dataclasses.fields(router_args)}
    kwargs = router_kwargs(config, env)
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise SystemExit(f"router: {package} does not take {', '.join(unknown)}")
    return router_args(**kwargs)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m vllm_fleet.router.launch ROUTER.json", file=sys.stderr)
        return 2
    config = json.loads(Path(argv[0]).read_text())
    keys = keys_from(os.environ.get("CREDENTIALS_DIRECTORY"), dict(os.environ))
    args = build_args(config, keys)
    # Out of the environment, so nothing the router spawns inherits them.
    for name in [n for n in os.environ if is_key_variable(n)]:
        os.environ.pop(name, None)
    launcher = importlib.import_module(f"{config['package']}.launch_router")
    launcher.launch_router(args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
