"""The ``vllm-fleet`` command: one entry point for controller and hosts."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_fleet import __version__

if TYPE_CHECKING:
    from vllm_fleet.engine.config import EngineConfig


def _cmd_engine_run(args: argparse.Namespace) -> int:
    from vllm_fleet.engine.exec import run

    return run(Path(args.config))


def _cmd_engine_membership(args: argparse.Namespace) -> int:
    from vllm_fleet.engine.membership import join_main, leave_main

    env_file = Path(args.env_file) if args.env_file else None
    config, control = Path(args.config), Path(args.control_key_file)
    if args.command == "engine-join":
        return join_main(config, env_file, control)
    return leave_main(config, env_file, control, grace=not args.no_grace)


def _cmd_smoke(args: argparse.Namespace) -> int:
    from vllm_fleet.engine.config import EngineConfig, engine_url, probe_host
    from vllm_fleet.env_file import read_env_file
    from vllm_fleet.tls.trust import fleet_trust
    from vllm_fleet.verify.smoke import report_lines, smoke_endpoint

    cfg = EngineConfig.model_validate_json(Path(args.config).read_text())
    key = read_env_file(Path(args.env_file)).get("VLLM_API_KEY", "")
    if not key:
        print(f"{args.env_file}: no VLLM_API_KEY", file=sys.stderr)
        return 2
    address = args.address or probe_host(cfg)
    url = engine_url(address, cfg.port, tls=cfg.tls is not None)
    verify = fleet_trust(url, str(cfg.tls.ca_cert) if cfg.tls else None)
    result = asyncio.run(smoke_endpoint(url, key, cfg.served_name, args.timeout, verify=verify))
    print("\n".join(report_lines(result)))
    return 0 if result.status != "fail" else 1


def _cmd_publish(args: argparse.Namespace) -> int:
    from vllm_fleet.weights.publish import publish

    print(publish(args.model, Path(args.source), Path(args.mirror_dir), args.workers))
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from vllm_fleet.weights.base import load_local_manifest, verify_dir

    rev_dir = Path(args.path)
    problems = verify_dir(rev_dir, load_local_manifest(rev_dir), args.full, args.workers, _stderr)
    for problem in problems:
        print(f"{rev_dir}: {problem}")
    if not problems:
        print(f"{rev_dir}: verified")
    return 1 if problems else 0


def _cmd_fetch(args: argparse.Namespace) -> int:
    from vllm_fleet.weights.base import WeightsError
    from vllm_fleet.weights.mirror import MirrorFetch

    fetch = MirrorFetch(
        name=args.name,
        revision=args.revision,
        base_url=args.url,
        root=Path(args.root),
        keep=args.keep,
        full_verify=args.full,
        workers=args.workers,
        report=_stderr,
    )
    try:
        print(json.dumps(asdict(fetch.run())))
    except WeightsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


def _cmd_model_info(args: argparse.Namespace) -> int:
    from vllm_fleet.preflight.kv_planner import safetensors_weight_bytes

    model_dir = Path(args.path)
    config = json.loads((model_dir / "config.json").read_text())
    print(json.dumps({"config": config, "weight_bytes": safetensors_weight_bytes(model_dir)}))
    return 0


def _cmd_lock(args: argparse.Namespace) -> int:
    from vllm_fleet.wheels.lock import lock_lines

    print("\n".join(lock_lines(Path(args.wheelhouse), set(args.exclude))))
    return 0


def _cmd_lock_resolve(args: argparse.Namespace) -> int:
    import tempfile

    from vllm_fleet.wheels.lock import resolve_lock

    with tempfile.TemporaryDirectory() as workdir:
        lines = resolve_lock(
            args.requirements,
            Path(workdir),
            set(args.exclude),
            python_version=args.python,
            index_url=args.index_url,
            extra_index_urls=args.extra_index_url,
            constraints=Path(args.constraint) if args.constraint else None,
        )
    print("\n".join(lines))
    return 0


def _cmd_wheelhouse(args: argparse.Namespace) -> int:
    import yaml

    from vllm_fleet.wheels.wheelhouse import WheelhouseError, build_wheelhouse

    root = Path(args.root)
    stacks = yaml.safe_load((root / "catalog" / "stacks.yml").read_text())["fleet_stacks"]
    if args.stack not in stacks:
        print(f"unknown stack {args.stack}; catalog/stacks.yml has {', '.join(stacks)}")
        return 2
    try:
        dest = build_wheelhouse(
            args.stack, stacks[args.stack], root, Path(args.dest), args.index_url
        )
    except WheelhouseError as error:
        print(f"wheelhouse: {error}", file=sys.stderr)
        return 1
    print(f"{dest}: {len(list(dest.glob('*.whl')))} wheels of {args.stack}")
    return 0


def _cmd_fleet_verify(args: argparse.Namespace) -> int:
    import os

    from vllm_fleet.env_file import read_env_file
    from vllm_fleet.verify.runner import main as verify_main

    if args.env_file:
        # Keys travel in a 0600 file, never on the command line.
        os.environ.update(read_env_file(Path(args.env_file)))
    metrics = ["--metrics-file", args.metrics_file] if args.metrics_file else []
    return verify_main(["--config", args.config, "--out", args.out, *metrics])


def _cmd_watchdog(args: argparse.Namespace) -> int:
    from vllm_fleet.watchdog.service import main as watchdog_main

    return watchdog_main(["--config", args.config, *(["--once"] if args.once else [])])


def _traffic_inputs(args: argparse.Namespace) -> tuple[EngineConfig, dict[str, str], str | None]:
    """The group's settings, its env file and the control key (vllm_fleet.engine.membership)."""
    from vllm_fleet.engine.config import EngineConfig
    from vllm_fleet.engine.membership import control_key
    from vllm_fleet.env_file import read_env_file

    cfg = EngineConfig.model_validate_json(Path(args.config).read_text())
    env = read_env_file(Path(args.env_file))
    return cfg, env, control_key(Path(args.control_key_file), env)


def _cmd_traffic_drain(args: argparse.Namespace) -> int:
    from vllm_fleet.router.traffic import TrafficError, drain

    cfg, _env, key = _traffic_inputs(args)
    try:
        result = drain(
            cfg,
            key,
            args.timeout,
            args.reason,
            min_peers=args.min_peers,
        )
    except TrafficError as err:
        _stderr(f"drain: {err}")
        return 1
    print(json.dumps(asdict(result)))
    return 0


def _cmd_traffic_release(args: argparse.Namespace) -> int:
    from vllm_fleet.router.traffic import TrafficError, release

    cfg, env, key = _traffic_inputs(args)
    try:
        seconds = release(cfg, env.get("VLLM_API_KEY", ""), key, args.timeout)
    except TrafficError as err:
        _stderr(f"release: {err}")
        return 1
    print(json.dumps({"group": cfg.group, "seconds": seconds}))
    return 0


def _cmd_drift(args: argparse.Namespace) -> int:
    from vllm_fleet.deploy.drift import FAILED, default_out_dir, drift

    root = Path(args.root).resolve()
    out_dir = Path(args.out) if args.out else default_out_dir(root)
    result = drift(args.playbook, out_dir, args.ansible_args, root)
    print("\n" + result.markdown.split("\n## ")[0].rstrip())
    print(f"drift: {out_dir / 'drift.md'}, {out_dir / 'drift.json'}")
    if result.status == FAILED and not result.hosts:
        _stderr(
            f"drift: ansible-playbook exited {result.playbook_rc}; see {out_dir / 'ansible.log'}"
        )
    return result.status


def _cmd_apply(args: argparse.Namespace) -> int:
    from vllm_fleet.deploy.gitops import apply

    return apply(Path(args.root).resolve(), args.since, args.inventory, args.dry_run)


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _add_control_key_file(p: argparse.ArgumentParser) -> None:
    from vllm_fleet.engine.membership import CONTROL_KEY_FILE

    p.add_argument(
        "--control-key-file",
        default=str(CONTROL_KEY_FILE),
        help="root-only file with the routers' control key (else the env file's, if it has one)",
    )


def _add_traffic(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    traffic = sub.add_parser(
        "traffic", help="take an engine group out of the routers and back (upgrades)"
    ).add_subparsers(dest="traffic_command", required=True)
    p = traffic.add_parser("drain", help="hold the group out of the routers; wait until idle")
    p.add_argument("config", help="/etc/vllm-fleet/engines/<group>.json")
    p.add_argument("--env-file", required=True, help="the group's root-only env file (keys)")
    _add_control_key_file(p)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for idle")
    p.add_argument("--reason", default="drained by vllm-fleet", help="recorded in the hold")
    p.add_argument(
        "--min-peers",
        type=int,
        default=0,
        help="refuse unless every router serves the model on at least this many other engines",
    )
    p.set_defaults(func=_cmd_traffic_drain)
    p = traffic.add_parser("release", help="lift the hold; rejoin every router and wait")
    p.add_argument("config", help="/etc/vllm-fleet/engines/<group>.json")
    p.add_argument("--env-file", required=True, help="the group's root-only env file (keys)")
    _add_control_key_file(p)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for listing")
    p.set_defaults(func=_cmd_traffic_release)


def _add_verify(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "verify", help="verify the fleet: smoke, cross-talk under load, prefix cache; report"
    )
    p.add_argument("--config", required=True, help="verify.json (rendered by fleet_verify)")
    p.add_argument("--out", required=True, help="directory for report.json and report.md")
    p.add_argument("--env-file", help="file with VLLM_FLEET_ENGINE_API_KEY / _CLIENT_API_KEY")
    p.add_argument("--metrics-file", help="also write Prometheus metrics (node exporter textfile)")
    p.set_defaults(func=_cmd_fleet_verify)


def _add_lock_resolve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "lock-resolve",
        help="print a hash lock for requirements, resolved by pip from wheel metadata only",
    )
    p.add_argument("requirements", nargs="+", help="e.g. vllm==0.33.0")
    p.add_argument("--python", default="3.11", help="target CPython version")
    p.add_argument("--index-url", default="https://pypi.org/simple")
    p.add_argument("--extra-index-url", action="append", default=[])
    p.add_argument("--constraint", help="a pip constraints file")
    p.add_argument("--exclude", nargs="*", default=[], help="names left out of the lock")
    p.set_defaults(func=_cmd_lock_resolve)


def _add_wheelhouse(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "wheelhouse",
        help="download a stack's locked wheels by hash and build its sdist-only ones",
    )
    p.add_argument("stack", help="a key of catalog/stacks.yml")
    p.add_argument("dest", help="the wheelhouse directory (publish it as fleet_wheelhouse_url)")
    p.add_argument("--root", default=".", help="the bundle's directory (catalog/)")
    p.add_argument("--index-url", default="https://pypi.org/simple", help="where sdists come from")
    p.set_defaults(func=_cmd_wheelhouse)


def _add_drift(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "drift",
        help="site.yml --check --diff: what would change per host; exit 0 none, 2 drift, 1 failed",
    )
    p.add_argument("--playbook", default="site.yml")
    p.add_argument("--root", default=".", help="the bundle's directory (ansible.cfg)")
    p.add_argument("--out", help="report directory (default reports/drift-<time>/)")
    p.add_argument(
        "ansible_args", nargs="*", help="passed to ansible-playbook (after --), e.g. --limit"
    )
    p.set_defaults(func=_cmd_drift)

    p = sub.add_parser(
        "apply",
        help="apply a fleet repo change: rolling upgrade where engines changed, then site.yml",
    )
    p.add_argument(
        "--since",
        default="deployed",
        help="what engine hosts run now: 'deployed' (each host's deployed.json) or a commit",
    )
    p.add_argument("--inventory", default="inventories/lab")
    p.add_argument("--root", default=".", help="the fleet repository (a git checkout)")
    p.add_argument("--dry-run", action="store_true", help="print the decision only")
    p.set_defaults(func=_cmd_apply)


def _add_weights(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    weights = sub.add_parser(
        "weights", help="model weights: publish, fetch, verify"
    ).add_subparsers(dest="weights_command", required=True)
    p = weights.add_parser("publish", help="copy a model into a mirror; prints its revision")
    p.add_argument("--model", required=True)
    p.add_argument("source")
    p.add_argument("mirror_dir", help="<mirror>/models/<model>")
    p.add_argument("--workers", type=int, default=4)
    p.set_defaults(func=_cmd_publish)

    p = weights.add_parser("fetch", help="fetch a pinned revision from a mirror, verified")
    p.add_argument("--name", required=True)
    p.add_argument("--revision", required=True)
    p.add_argument("--url", required=True, help="mirror base URL of this model")
    p.add_argument("--root", default="/srv/models")
    p.add_argument("--keep", type=int, default=2)
    p.add_argument("--full", action="store_true", help="re-hash every file, ignore stamps")
    p.add_argument("--workers", type=int, default=4)
    p.set_defaults(func=_cmd_fetch)

    p = weights.add_parser("verify", help="verify an installed revision against its manifest")
    p.add_argument("path")
    p.add_argument("--full", action="store_true")
    p.add_argument("--workers", type=int, default=4)
    p.set_defaults(func=_cmd_verify)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm-fleet", description=__doc__)
    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("engine-run", help="run one engine group (systemd's main process)")
    p.add_argument("config", help="/etc/vllm-fleet/engines/<group>.json")
    p.set_defaults(func=_cmd_engine_run)

    for name, what in (
        ("engine-join", "as root, once the group is ready: join the routers unless it is held"),
        ("engine-leave", "as root, before the group stops: leave the routers, wait the grace"),
    ):
        p = sub.add_parser(name, help=what)
        p.add_argument("config", help="/etc/vllm-fleet/engines/<group>.json")
        p.add_argument("--env-file", help="the group's env file (default: beside the config)")
        _add_control_key_file(p)
        if name == "engine-leave":
            p.add_argument(
                "--no-grace", action="store_true", help="after the stop: do not wait the grace"
            )
        p.set_defaults(func=_cmd_engine_membership)

    p = sub.add_parser("smoke", help="smoke-test one engine group on this host")
    p.add_argument("--config", required=True)
    p.add_argument("--env-file", required=True, help="EnvironmentFile holding VLLM_API_KEY")
    p.add_argument("--address", help="default: where the group listens (loopback if all)")
    p.add_argument("--timeout", type=float, default=120.0)
    p.set_defaults(func=_cmd_smoke)

    _add_weights(sub)

    p = sub.add_parser("model-info", help="config.json and weight bytes (from safetensors headers)")
    p.add_argument("path", help="an installed model revision directory")
    p.set_defaults(func=_cmd_model_info)

    _add_verify(sub)

    p = sub.add_parser("watchdog", help="probe this host's engine groups; restart hung ones")
    p.add_argument("--config", required=True, help="/etc/vllm-fleet/watchdog.json")
    p.add_argument(
        "--once", action="store_true", help="one pass; print states; exit 1 unless healthy"
    )
    p.set_defaults(func=_cmd_watchdog)

    _add_traffic(sub)
    _add_drift(sub)
    _add_lock_resolve(sub)
    _add_wheelhouse(sub)

    p = sub.add_parser("lock", help="print a hash lock for a wheelhouse")
    p.add_argument("wheelhouse")
    p.add_argument("--exclude", nargs="*", default=[])
    p.set_defaults(func=_cmd_lock)

    p = sub.add_parser(
        "model-check", help="are a local model's files complete for vLLM? exit 0 yes, 1 no"
    )
    p.add_argument("path", help="a model directory in Hugging Face format")
    p.set_defaults(func=_cmd_model_check)

    p = sub.add_parser(
        "engine-state",
        help="what each engine group runs: stale settings, stopped units, holds (read-only, JSON)",
    )
    p.add_argument("--config-dir", default="/etc/vllm-fleet/engines")
    p.add_argument("--unit-file", default="/etc/systemd/system/vllm-engine@.service")
    p.add_argument("--group", action="append", default=[], help="also report this group")
    p.set_defaults(func=_cmd_engine_state)

    _add_ca(sub)

    p = sub.add_parser(
        "router-inflight", help="requests the router on this host is working on now (a number)"
    )
    p.add_argument("--metrics-url", required=True, help="the router's Prometheus endpoint")
    p.add_argument(
        "--metric",
        required=True,
        action="append",
        help="an in-flight gauge (catalog/routers.yml); repeat it for each router release",
    )
    p.set_defaults(func=_cmd_router_inflight)
    return parser


def _cmd_ca(args: argparse.Namespace) -> int:
    from cryptography.hazmat.primitives import hashes

    from vllm_fleet.tls.ca import CaError, init_ca, load_ca

    directory = Path(args.directory)
    try:
        if args.ca_command == "init":
            init_ca(directory, args.name, args.days)
        ca = load_ca(directory)
    except CaError as err:
        print(f"vllm-fleet ca: {err}", file=sys.stderr)
        return 1
    fingerprint = ca.cert.fingerprint(hashes.SHA256()).hex(":")
    print(f"{directory}: {ca.cert.subject.rfc4514_string()}")
    print(f"  valid until {ca.cert.not_valid_after_utc:%Y-%m-%d}, sha256 {fingerprint}")
    return 0


def _add_ca(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ca = sub.add_parser("ca", help="the fleet's certificate authority (on the controller)")
    ca_sub = ca.add_subparsers(dest="ca_command", required=True)
    p = ca_sub.add_parser("init", help="create a CA in DIRECTORY (refuses to replace one)")
    p.add_argument("directory")
    p.add_argument("--name", default="vllm-fleet CA", help="the CA certificate's common name")
    p.add_argument("--days", type=int, default=3650, help="how long the CA certificate is valid")
    p.set_defaults(func=_cmd_ca)
    p = ca_sub.add_parser("show", help="check the CA in DIRECTORY and print what it is")
    p.add_argument("directory")
    p.set_defaults(func=_cmd_ca)


def _cmd_router_inflight(args: argparse.Namespace) -> int:
    from vllm_fleet.router.inflight import router_inflight

    print(router_inflight(args.metrics_url, args.metric))
    return 0


def _cmd_engine_state(args: argparse.Namespace) -> int:
    from vllm_fleet.engine.state import host_state

    print(host_state(Path(args.config_dir), Path(args.unit_file), args.group).to_json())
    return 0


def _cmd_model_check(args: argparse.Namespace) -> int:
    from vllm_fleet.engine.model_check import main as model_check_main

    return model_check_main(Path(args.path))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
