#!/usr/bin/python
"""Ansible module: install one model revision, verified (runs on the host's agent python)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_fleet_weights
short_description: Fetch a model revision into <root>/<name>/<revision>, every file verified
description:
  - Runs with the vllm-fleet agent's Python (it imports vllm_fleet).
  - "Sources: C(mirror) (HTTP(S) mirror + manifest.json), C(hf) (Hugging Face Hub or a Hub
    mirror, at a pinned commit, checked against the Hub's file metadata), C(modelscope),
    C(local) (a pre-staged directory checked against a manifest) and C(cache) (the fleet's
    cache host, which fetched the upstream source once)."
  - Staging directory, per-file checks, atomic rename, then the C(current) link. A failure
    installs nothing and leaves every other revision in place; an interrupted download is
    resumed by the next run.
  - Then old revisions are pruned. Kept are C(current), every revision named by an engine
    settings file in I(engine_config_dir) or an upgrade snapshot in I(upgrade_snapshot_dir)
    (read at that moment), and the newest I(keep) by install time. If one of those files
    cannot be read, nothing is pruned. The result's C(prune) lists each kept revision with
    why, and the removed ones.
  - In check mode it only reports whether anything would change.
options:
  name: {description: Model name (key of fleet_models)., type: str, required: true}
  source: {description: Where the files come from., type: str, required: true, choices: [mirror, hf, modelscope, local, cache]}
  upstream: {description: "For C(cache): the upstream source the cache host fetched from.", type: str, choices: [hf, modelscope]}
  revision: {description: Pinned revision., type: str, required: true}
  url: {description: "Mirror base URL (mirror), or the cache host's base URL (cache).", type: str}
  repo: {description: Repository id (hf and modelscope)., type: str}
  endpoint: {description: Hub or ModelScope endpoint; default the public one., type: str}
  allow_patterns: {description: Only files matching these (hf and modelscope)., type: list, elements: str}
  ignore_patterns: {description: Never files matching these (hf and modelscope)., type: list, elements: str}
  path: {description: Pre-staged directory (local)., type: path}
  manifest: {description: "Manifest of the pre-staged directory (local); default <path>/manifest.json.", type: path}
  token: {description: Hub or ModelScope token; never logged., type: str}
  manifest_sha256:
    description:
      - "For C(cache): the sha256 of the cache host's own manifest of this revision, read over
        the controller's connection to it; a served manifest that hashes otherwise is refused."
    type: str
  cache_token: {description: "For C(cache): the token the cache serves its readers; never logged.", type: str}
  ca_cert: {description: "For C(cache) over HTTPS: the fleet CA's certificate, the only one trusted.", type: path}
  root: {description: Models root on the host., type: path, default: /srv/models}
  keep: {description: "Newest revisions kept per model (for rollback), beyond those in use.", type: int, default: 2}
  engine_config_dir: {description: "Engine groups' settings (EngineConfig JSON); revisions they name are kept.", type: path, default: /etc/vllm-fleet/engines}
  upgrade_snapshot_dir: {description: "The last upgrade's snapshot of those settings (its rollback target); revisions it names are kept.", type: path, default: /var/lib/vllm-fleet/upgrade/previous}
  verify: {description: "stamp: trust unchanged files' verified stamp; full: re-hash all.", type: str, default: stamp, choices: [stamp, full]}
  workers: {description: Parallel downloads and hashes., type: int, default: 4}
"""

import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ansible.module_utils.basic import AnsibleModule

TOKEN_ENV = {"hf": "HF_TOKEN", "modelscope": "MODELSCOPE_API_TOKEN"}


def upstream_fetch(source: str, params: dict[str, Any], common: dict[str, Any]) -> Any:
    """The fetch object of an upstream source (also what a cache copy must have come from)."""
    if source == "mirror":
        from vllm_fleet.weights.mirror import MirrorFetch

        return MirrorFetch(base_url=params["url"], **common)
    if source == "hf":
        from vllm_fleet.weights.hf import HfFetch

        return HfFetch(
            repo=params["repo"],
            endpoint=params["endpoint"],
            allow_patterns=params["allow_patterns"],
            ignore_patterns=params["ignore_patterns"],
            **common,
        )
    if source == "modelscope":
        from vllm_fleet.weights.modelscope import ModelScopeFetch

        return ModelScopeFetch(
            repo=params["repo"],
            endpoint=params["endpoint"],
            allow_patterns=params["allow_patterns"],
            ignore_patterns=params["ignore_patterns"],
            **common,
        )
    from vllm_fleet.weights.local import LocalFetch

    return LocalFetch(path=Path(params["path"]), manifest=params["manifest"], **common)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "str", "required": True},
            "source": {
                "type": "str",
                "required": True,
                "choices": ["mirror", "hf", "modelscope", "local", "cache"],
            },
            "upstream": {"type": "str", "choices": ["hf", "modelscope"]},
            "revision": {"type": "str", "required": True},
            "url": {"type": "str"},
            "repo": {"type": "str"},
            "endpoint": {"type": "str"},
            "allow_patterns": {"type": "list", "elements": "str"},
            "ignore_patterns": {"type": "list", "elements": "str"},
            "path": {"type": "path"},
            "manifest": {"type": "path"},
            "token": {"type": "str", "no_log": True},
            "manifest_sha256": {"type": "str"},
            "cache_token": {"type": "str", "no_log": True},
            "ca_cert": {"type": "path"},
            "root": {"type": "path", "default": "/srv/models"},
            "keep": {"type": "int", "default": 2},
            "engine_config_dir": {"type": "path", "default": "/etc/vllm-fleet/engines"},
            "upgrade_snapshot_dir": {
                "type": "path",
                "default": "/var/lib/vllm-fleet/upgrade/previous",
            },
            "verify": {"type": "str", "default": "stamp", "choices": ["stamp", "full"]},
            "workers": {"type": "int", "default": 4},
        },
        required_if=[
            ("source", "mirror", ["url"]),
            ("source", "hf", ["repo"]),
            ("source", "modelscope", ["repo"]),
            ("source", "local", ["path"]),
            ("source", "cache", ["url", "upstream"]),
        ],
        supports_check_mode=True,
    )
    params = module.params
    try:
        from vllm_fleet.weights.base import WeightsError
        from vllm_fleet.weights.cache import CacheFetch
    except ImportError as err:
        module.fail_json(msg=f"run this module with the vllm-fleet agent's python: {err}")
    messages: list[str] = []

    def report(message: str) -> None:
        # Also to the host's journal as it happens (journalctl -f -t
        # ansible-vllm_fleet_weights): a long fetch shows bytes, rate and ETA while it runs.
        messages.append(message)
        module.log(message)

    common = {
        "name": params["name"],
        "revision": params["revision"],
        "root": Path(params["root"]),
        "keep": params["keep"],
        "engine_config_dir": Path(params["engine_config_dir"]),
        "upgrade_snapshot_dir": Path(params["upgrade_snapshot_dir"]),
        "full_verify": params["verify"] == "full",
        "workers": params["workers"],
        "report": report,
    }
    source = params["source"]
    upstream = params["upstream"] if source == "cache" else source
    # The token reaches the client through its own environment variable, never argv.
    if params["token"] and upstream in TOKEN_ENV:
        os.environ[TOKEN_ENV[upstream]] = params["token"]
    try:
        fetch = upstream_fetch(upstream, params, common)
        if source == "cache":
            fetch = CacheFetch(
                base_url=params["url"],
                upstream=fetch.wanted(),
                manifest_sha256=params["manifest_sha256"] or "",
                token=params["cache_token"] or "",
                ca_cert=params["ca_cert"] or "",
                **common,
            )
    except WeightsError as err:
        module.fail_json(msg=str(err))
    if module.check_mode:
        module.exit_json(changed=fetch.needs_change(), path=str(fetch.target))
    if source == "cache" and not params["manifest_sha256"]:
        module.fail_json(
            msg=f"model {params['name']}: no manifest_sha256 for the cache host's copy: "
            "model_weights reads it on the cache host (is the cache play done?)"
        )
    try:
        result = fetch.run()
    except WeightsError as err:
        module.fail_json(msg=str(err), progress=messages)
    if result.prune.refused:
        module.warn(result.prune.refused)
    module.exit_json(
        changed=result.changed,
        path=result.path,
        revision=result.revision,
        files=result.files,
        bytes=result.bytes,
        actions=result.actions,
        prune=asdict(result.prune),
        progress=messages,
    )


if __name__ == "__main__":
    main()
