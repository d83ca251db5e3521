#!/usr/bin/python
"""Ansible module: install one model revision from a mirror, verified (runs on the host's agent python)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_fleet_weights
short_description: Fetch a model revision from a mirror into <root>/<name>/<revision>, sha256-verified
description:
  - Runs with the vllm-fleet agent's Python (it imports vllm_fleet).
  - Staging directory, per-file sha256 against the manifest, atomic rename, then the
    C(current) link. A failure installs nothing and leaves every other revision in place.
  - In check mode it only reports whether anything would change.
options:
  name: {description: Model name (key of fleet_models)., type: str, required: true}
  revision: {description: Pinned revision (the mirror manifest's sha256)., type: str, required: true}
  url: {description: Mirror base URL of this model., type: str, required: true}
  root: {description: Models root on the host., type: path, default: /srv/models}
  keep: {description: Revisions kept per model (for rollback)., type: int, default: 2}
  verify: {description: "stamp: trust unchanged files' verified stamp; full: re-hash all.", type: str, default: stamp, choices: [stamp, full]}
  workers: {description: Parallel downloads and hashes., type: int, default: 4}
"""

from ansible.module_utils.basic import AnsibleModule


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "str", "required": True},
            "revision": {"type": "str", "required": True},
            "url": {"type": "str", "required": True},
            "root": {"type": "path", "default": "/srv/models"},
            "keep": {"type": "int", "default": 2},
            "verify": {"type": "str", "default": "stamp", "choices": ["stamp", "full"]},
            "workers": {"type": "int", "default": 4},
        },
        supports_check_mode=True,
    )
    try:
        from pathlib import Path

        from vllm_fleet.weights import MirrorFetch, WeightsError
    except ImportError as err:
        module.fail_json(msg=f"run this module with the vllm-fleet agent's python: {err}")
    messages: list[str] = []
    fetch = MirrorFetch(
        name=module.params["name"],
        revision=module.params["revision"],
        base_url=module.params["url"],
        root=Path(module.params["root"]),
        keep=module.params["keep"],
        full_verify=module.params["verify"] == "full",
        workers=module.params["workers"],
        report=messages.append,
    )
    if module.check_mode:
        module.exit_json(changed=fetch.needs_change(), path=str(fetch.target))
    try:
        result = fetch.run()
    except WeightsError as err:
        module.fail_json(msg=str(err), progress=messages)
    module.exit_json(
        changed=result.changed,
        path=result.path,
        revision=result.revision,
        files=result.files,
        bytes=result.bytes,
        actions=result.actions,
        progress=messages,
    )


if __name__ == "__main__":
    main()
