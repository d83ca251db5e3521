"""An engine group's place in the routers, changed only by root.

vLLM runs as the engine's user, and so does ``engine-run``, its parent: any key either held
would be readable by vLLM (and by code a model ships) from ``/proc``. The routers' control key
adds workers, which then receive clients' prompts, so it never reaches that user. It lives in
a root-only file; the unit joins the group as root once it is ready
(``ExecStartPost=+vllm-fleet engine-join``) and leaves the routers before it stops
(``ExecStop=+vllm-fleet engine-leave``, which systemd runs before it signals engine-run;
``ExecStopPost=`` leaves again, without the grace, for a main process that died on its own,
after which systemd skips ExecStop); the watchdog, also root, keeps registrations reconciled.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from vllm_fleet.engine.config import EngineConfig, advertise_url
from vllm_fleet.env_file import read_env_file
from vllm_fleet.router import hold
from vllm_fleet.router.client import RouterError, router_client

CONTROL_KEY_ENV = "VLLM_FLEET_ROUTER_CONTROL_KEY"
# Root-only (0600), written by the vllm_engine role: the key the host's engines join with.
CONTROL_KEY_FILE = Path("/etc/vllm-fleet/router-control.env")
ROUTER_TIMEOUT = 3.0


def log(message: str) -> None:
    print(f"engine-membership: {message}", file=sys.stderr, flush=True)


class Membership:
    """This group's place in the routers: joined once ready, left once stopping."""

    def __init__(self, cfg: EngineConfig, engine_key: str, control_key: str | None) -> None:
        self.cfg = cfg
        self.url = advertise_url(cfg)
        self.engine_key = engine_key
        self.control_key = control_key
        self.stopping = False
        self._lock = threading.Lock()

    def _each_router(self, action: Callable[..., bool], verb: str, done: str) -> None:
        for target in self.cfg.routers:
            client = router_client(target, self.control_key, ROUTER_TIMEOUT)
            try:
                with contextlib.closing(client):
                    action(client)
                log(f"{self.cfg.group}: {done} router {target.url} as {self.url}")
            except (RouterError, httpx.HTTPError) as err:
                # Not fatal: the host's watchdog reconciles registrations every few seconds.
                log(f"{self.cfg.group}: could not {verb} router {target.url}: {err}")

    def join(self) -> None:
        with self._lock:
            if self.stopping:
                return
            self._each_router(
                lambda c: c.join(self.url, self.engine_key, self.cfg.served_name), "join", "joined"
            )

    def leave(self) -> None:
        with self._lock:
            self.stopping = True
            self._each_router(lambda c: c.leave(self.url), "leave", "left")


def admit(cfg: EngineConfig, membership: Membership) -> str:
    """Join the routers unless the group is held out of them; a suffix for the status."""
    if hold.is_held(cfg.group):
        # An upgrade checks the group directly before it gets traffic again.
        log(f"{cfg.group}: held out of the routers ({hold.hold_path(cfg.group)}); not joining")
        return ", held out of the routers"
    membership.join()
    return ""


def control_key(control_file: Path, env: dict[str, str]) -> str | None:
    """The control key: the root-only file's, else one an older settings file still holds."""
    if control_file.exists():
        key = read_env_file(control_file).get(CONTROL_KEY_ENV)
        if key:
            return key
    return env.get(CONTROL_KEY_ENV) or None


def membership_for(
    config_path: Path, env_file: Path | None, control_file: Path
) -> Membership | None:
    """The group's membership with its keys; None (logged) when there is no control key."""
    cfg = EngineConfig.model_validate_json(config_path.read_text())
    env = read_env_file(env_file or config_path.with_suffix(".env"))
    key = control_key(control_file, env)
    if key is None or not cfg.routers:
        log(f"{cfg.group}: no routers or no control key ({control_file}); nothing to do")
        return None
    return Membership(cfg, env.get("VLLM_API_KEY", ""), key)


def join_main(config_path: Path, env_file: Path | None, control_file: Path) -> int:
    membership = membership_for(config_path, env_file, control_file)
    if membership is not None:
        admit(membership.cfg, membership)
    # A router that could not be reached is the watchdog's to retry: the group serves.
    return 0


def leave_main(
    config_path: Path, env_file: Path | None, control_file: Path, *, grace: bool = True
) -> int:
    membership = membership_for(config_path, env_file, control_file)
    if membership is not None:
        membership.leave()
        if grace:
            # Requests a router already picked this engine for still arrive.
            time.sleep(membership.cfg.leave_grace_seconds)
    return 0
