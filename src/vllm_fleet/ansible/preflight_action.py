"""The preflight role's action: validate every host of the play on the controller with
vllm_fleet.preflight (loaded by roles/preflight/action_plugins/vllm_fleet_preflight.py).

Runs once, reads each host's inventory variables and probed (or fixture) facts, and fails
with every finding at once, before any role changes a host. Writes the plan and the
findings under the report directory.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

import yaml
from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase

from vllm_fleet.ansible.addresses import fleet_address
from vllm_fleet.preflight import HostInput, PreflightResult, validate
from vllm_fleet.preflight.change_safety import check_fleet_change
from vllm_fleet.preflight.engine_tls import check_engine_tls
from vllm_fleet.preflight.facts import HostFacts, from_fixture, from_probe, read_model_info
from vllm_fleet.preflight.firewall_peers import check_firewall_peers
from vllm_fleet.preflight.key_rotation import check_fleet_keys
from vllm_fleet.preflight.model_cache import check_model_cache
from vllm_fleet.preflight.report import render_markdown
from vllm_fleet.preflight.router_tls import check_router_tls, check_scheme_change
from vllm_fleet.preflight.router_trust import check_open_control_planes

# What preflight's own tasks register or read as facts. Every inventory variable, the fleet's
# (roles/fleet_defaults) and each role's, is learnt from the roles' argument specs.
PREFLIGHT_FACTS = {
    "preflight_kv_plan", "preflight_memory_plan",
    "preflight_facts", "preflight_probe", "preflight_nvidia_smi", "preflight_npu_smi",
    "preflight_ascend_driver", "preflight_cann_files", "preflight_cann", "preflight_model_info",
    "preflight_agent", "preflight_engine_files", "preflight_engine_settings",
    "preflight_key_files_now",
    "preflight_result",
}  # fmt: skip
READ = (
    "fleet_accelerator", "fleet_engine_stack", "fleet_engine_groups", "fleet_models",
    # The host's address when fleet_address is not set (vllm_fleet.ansible.addresses).
    "ansible_host",
)  # fmt: skip
PREFIXES = {"fleet", "vllm", "model", "engine", "preflight"}
# What decides whether the routers' client port speaks HTTPS (vllm_fleet.preflight.router_tls).
TLS_KEYS = ("fleet_router", "fleet_ca_dir", "fleet_engine_plain_http")


def role_variables(roles_dir: Path) -> set[str]:
    """Every option of every entry point of the roles' argument specs."""
    names: set[str] = set()
    for spec_file in roles_dir.glob("*/meta/argument_specs.yml"):
        specs = yaml.safe_load(spec_file.read_text())["argument_specs"]
        for entry in specs.values():
            names.update(entry.get("options", {}))
    return names


def router_default_vrid(roles_dir: Path) -> int:
    """The VRRP id the router role gives a VIP that sets none (its defaults)."""
    defaults = yaml.safe_load((roles_dir / "router/defaults/main.yml").read_text())
    return int(defaults["router_vip_defaults"]["vrid"])


def known_variables(roles_dir: Path) -> set[str]:
    return PREFLIGHT_FACTS | role_variables(roles_dir)


def raw(hostvars: Mapping[str, object], key: str) -> object:
    """A host variable as Ansible renders it; a template that fails becomes a value preflight names."""
    try:
        return hostvars[key]
    except AnsibleError as err:
        return f"<cannot be rendered: {err.message}>"


def host_input(
    name: str, hostvars: Mapping[str, object], play_level: Mapping[str, object]
) -> HostInput:
    """What preflight validates of one host: its fleet variables (play-level ones win) and facts."""
    variables = {key: raw(hostvars, key) for key in READ if key in hostvars}
    for key in hostvars:
        if key not in variables and key.split("_", 1)[0] in PREFIXES:
            variables[key] = raw(hostvars, key)
    variables.update(play_level)
    facts, models = facts_of(hostvars)
    return HostInput(
        name,
        variables,
        facts,
        models,
        hostvars.get("preflight_engine_settings"),
        hostvars.get("preflight_key_files_now"),
    )


def summarize(outcome: PreflightResult, hosts: list[str]) -> dict[str, object]:
    """The task's result: the plan, each host's KV sizes, and the refusal or the plan table."""
    kv_plan: dict[str, dict[str, int]] = {name: {} for name in hosts}
    for row in outcome.plan:
        kv_plan[row.host][row.group] = row.kv_cache_bytes
    result: dict[str, object] = {
        "plan": [asdict(row) for row in outcome.plan],
        # The KV size each engine group gets, for groups that leave it to the plan.
        "kv_plan": kv_plan,
        # Each engine group's MemoryMax= (set or planned); a group left out gets no bound.
        "memory_plan": {name: outcome.memory_plan.get(name, {}) for name in hosts},
        "warnings_found": [str(w) for w in outcome.warnings],
        "changed": False,
    }
    if outcome.errors:
        result["failed"] = True
        result["msg"] = (
            f"preflight refused the inventory ({len(outcome.errors)} problems); no host was changed:\n"
            + "\n".join(f"- {e}" for e in outcome.errors)
        )
    else:
        result["msg"] = render_markdown(outcome)
    return result


def report_json(outcome: PreflightResult) -> str:
    data = {
        "errors": [asdict(e) for e in outcome.errors],
        "warnings": [asdict(w) for w in outcome.warnings],
        "plan": [asdict(row) for row in outcome.plan],
        "memory_plan": outcome.memory_plan,
    }
    return json.dumps(data, indent=2, default=str) + "\n"


def facts_of(hostvars: Mapping[str, object]) -> tuple[HostFacts, dict[str, dict[str, object]]]:
    """The host's facts: from a preflight_facts fixture, else from the read-only probes."""
    if "preflight_facts" in hostvars:
        return from_fixture(hostvars["preflight_facts"])
    facts = from_probe(hostvars.get("preflight_probe"))
    return facts, read_model_info(hostvars.get("preflight_model_info"), facts)


class PreflightAction(ActionBase):
    """The action; the role's plugin file sets ``roles_dir`` (where the argument specs are)."""

    roles_dir: Path
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp: str | None = None, task_vars: dict | None = None) -> dict:
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        args = self._task.args
        all_hostvars = task_vars["hostvars"]
        known = known_variables(self.roles_dir)
        # Variables set at play, role or task level (vars:, vars_files:, include vars) apply to
        # every host of the play: task_vars has them, hostvars does not.
        this_host = all_hostvars[task_vars["inventory_hostname"]]
        play_level = {}
        for key, value in task_vars.items():
            if key.split("_", 1)[0] not in PREFIXES:
                continue
            rendered = self._render(value)
            if key not in this_host or (key in READ and raw(this_host, key) != rendered):
                play_level[key] = rendered
        hosts = [host_input(name, all_hostvars[name], play_level) for name in args["hosts"]]
        outcome = validate(hosts, task_vars["fleet_stacks"], known)
        # Fleet-wide: what every engine host of the inventory will serve, not only this play's.
        engine_hosts = {
            name: {"fleet_engine_groups": raw(all_hostvars[name], "fleet_engine_groups")}
            for name in task_vars["groups"].get("engines", [])
            if "fleet_engine_groups" in all_hostvars[name]
        }
        routers = task_vars["groups"].get("routers", [])
        releases = self._render(task_vars.get("fleet_router_releases", {}))
        releases = releases if isinstance(releases, dict) else {}
        single_name = single_name_routers(routers, all_hostvars, releases)
        check_fleet_change(hosts, engine_hosts, outcome, single_name)
        outcome.errors.extend(
            check_open_control_planes(router_settings(routers, all_hostvars), releases)
        )
        outcome.errors.extend(check_fleet_keys(hosts, router_default_vrid(self.roles_dir)))
        peers = task_vars["groups"].get("routers", []) + task_vars["groups"].get("monitoring", [])
        outcome.errors.extend(
            check_firewall_peers(hosts, peers, lambda name: fleet_address(name, all_hostvars))
        )
        outcome.errors.extend(check_model_cache(hosts, task_vars["groups"].get("model_cache", [])))
        # Fleet-wide too (a --limit run included): every router and engine host must agree
        # on the routers' scheme.
        engines = task_vars["groups"].get("engines", [])
        outcome.errors.extend(
            check_router_tls(
                tls_settings(routers, all_hostvars, play_level),
                tls_settings(engines, all_hostvars, play_level),
                releases,
            )
        )
        outcome.errors.extend(check_scheme_change(hosts, routers))
        outcome.errors.extend(
            check_engine_tls(
                tls_settings(engines, all_hostvars, play_level),
                tls_settings(routers, all_hostvars, play_level),
            )
        )
        report = self._write_report(outcome, Path(args["report_dir"]))
        result.update(summarize(outcome, args["hosts"]))
        result["report"] = str(report)
        return result

    def _render(self, value: object) -> object:
        try:
            return self._templar.template(value)
        except AnsibleError as err:
            return f"<cannot be rendered: {err.message}>"

    @staticmethod
    def _write_report(outcome: PreflightResult, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%S")
        base = directory / f"preflight-{stamp}"
        base.with_suffix(".json").write_text(report_json(outcome))
        base.with_suffix(".md").write_text(render_markdown(outcome))
        return base.with_suffix(".md")


def router_settings(
    routers: list[str], all_hostvars: Mapping[str, Mapping[str, object]]
) -> dict[str, object]:
    """Router host -> its fleet_router settings as the inventory gives them."""
    return {
        name: raw(all_hostvars[name], "fleet_router")
        if "fleet_router" in all_hostvars[name]
        else {}
        for name in routers
    }


def tls_settings(
    names: list[str],
    all_hostvars: Mapping[str, Mapping[str, object]],
    play_level: Mapping[str, object],
) -> dict[str, dict[str, object]]:
    """Host -> what decides its routers' and engines' schemes (fleet_router, fleet_ca_dir,
    fleet_engine_plain_http), as Ansible renders it; play-level values win, as for every other
    check."""
    settings = {}
    for name in names:
        own = {key: raw(all_hostvars[name], key) for key in TLS_KEYS if key in all_hostvars[name]}
        own.update({key: play_level[key] for key in TLS_KEYS if key in play_level})
        settings[name] = own
    return settings


def single_name_routers(
    routers: list[str], all_hostvars: Mapping[str, Mapping[str, object]], releases: object
) -> dict[str, str]:
    """Router host -> implementation, for the routers whose release cannot route by model
    (``multi_model: false`` in catalog/routers.yml; an unknown one is the router role's to
    refuse)."""
    releases = releases if isinstance(releases, dict) else {}
    out = {}
    for name in routers:
        hostvars = all_hostvars[name]
        settings = raw(hostvars, "fleet_router") if "fleet_router" in hostvars else {}
        impl = str(settings.get("impl", "sglang")) if isinstance(settings, dict) else "sglang"
        release = releases.get(impl)
        if isinstance(release, dict) and not release.get("multi_model", False):
            out[name] = impl
    return out
