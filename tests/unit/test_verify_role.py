"""fleet_verify renders the router's deadline and admission limit into verify.json.

Cross-talk sizes its load by them, so they must be the values the router actually runs with:
the inventory's fleet_router, else the router role's own defaults.
"""

import json
import re

import jinja2
import jinja2.nativetypes
import pytest
import yaml

from tests.support.paths import ROOT
from vllm_fleet.ansible.fleet_verify import FILTERS
from vllm_fleet.verify.config import VerifyConfig

ROLE = ROOT / "roles/fleet_verify"
ROUTER_DEFAULTS = yaml.safe_load((ROOT / "roles/router/defaults/main.yml").read_text())
VERIFY_DEFAULTS = yaml.safe_load((ROLE / "defaults/main.yml").read_text())
# The role settings the verifier reads -> the router role setting each mirrors.
MIRRORED = {
    "fleet_verify_router_request_timeout": "request_timeout_seconds",
    "fleet_verify_router_admission_factor": "admission_factor",
}


def environment():
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["to_nice_json"] = lambda value, **kw: json.dumps(value, indent=4, **kw)
    return env


def role_value(name, fleet_router):
    """A role default, templated the way Ansible would for this inventory's fleet_router."""
    return environment().from_string(VERIFY_DEFAULTS[name]).render(fleet_verify_router=fleet_router)


def router_address_values(fleet_router, hosts, tls=False):
    """fleet_verify_router_port/_address/_members/_url/_ca_file and fleet_verify_ca_file as
    Ansible would template them."""
    env = jinja2.nativetypes.NativeEnvironment(undefined=jinja2.StrictUndefined)
    env.filters["regex_replace"] = lambda value, pattern, repl: re.sub(pattern, repl, value)
    env.filters["bool"] = bool
    env.filters.update(FILTERS)
    values = {
        "fleet_verify_router": fleet_router,
        "fleet_verify_router_hosts": hosts,
        "fleet_router_tls": tls,
        "fleet_tls_ca_cert": "/etc/vllm-fleet/tls/ca.crt",
        "fleet_ca_dir": "/srv/vllm-fleet/ca" if tls else "",
    }
    for name in (
        "fleet_verify_router_port",
        "fleet_verify_router_address",
        "fleet_verify_router_members",
        "fleet_verify_router_url",
        "fleet_verify_router_ca_file",
        "fleet_verify_ca_file",
    ):
        values[name] = env.from_string(VERIFY_DEFAULTS[name]).render(values)
    return values


def render_verify_json(fleet_router, hosts=("router01",), tls=False):
    context = {name: role_value(name, fleet_router) for name in MIRRORED}
    context |= router_address_values(fleet_router, list(hosts), tls)
    context |= {
        "fleet_verify_models": {"smollm2-135m": {"served_name": "smollm2"}},
        "fleet_verify_engines": [
            {
                "host": "engine01",
                "group": "g0",
                "url": "http://engine01:8100",
                "stack": "cpu",
                "model": "smollm2-135m",
                "served_name": "smollm2",
                "revision": "r",
                "devices": [0],
                "max_num_seqs": 16,
            }
        ],
        "fleet_verify_crosstalk": VERIFY_DEFAULTS["fleet_verify_crosstalk"],
        "fleet_verify_prefix_tokens": 600,
        "fleet_verify_timeout": 120,
    }
    template = environment().from_string((ROLE / "templates/verify.json.j2").read_text())
    return VerifyConfig.model_validate(json.loads(template.render(context)))


@pytest.mark.parametrize(("name", "setting"), MIRRORED.items())
def test_without_fleet_router_settings_verify_sees_the_router_roles_defaults(name, setting):
    assert int(role_value(name, {})) == ROUTER_DEFAULTS["router_setting_defaults"][setting]


def test_verify_json_carries_the_routers_deadline_and_admission_factor():
    lab = render_verify_json({"impl": "sglang", "request_timeout_seconds": 20})
    assert lab.router is not None
    assert (lab.router.request_timeout_seconds, lab.router.admission_factor) == (20, 2)
    default = render_verify_json({})
    assert default.router is not None
    assert default.router.request_timeout_seconds == 300


def test_behind_a_vip_clients_use_it_and_every_router_is_checked_at_its_own_address():
    alone = render_verify_json({"port": 30000})
    assert (alone.router.url, alone.router.members) == ("http://router01:30000", [])
    vip = render_verify_json({"vip": {"address": "10.89.0.100"}}, hosts=("router01", "router02"))
    assert vip.router.url == "http://10.89.0.100:30000"
    assert vip.router.members == ["http://router01:30000", "http://router02:30000"]
    assert vip.router.ca_file is None


def test_routers_that_speak_tls_are_verified_over_https_trusting_the_fleet_ca():
    vip = render_verify_json(
        {"vip": {"address": "fd00::100"}}, hosts=("router01", "fd00::11"), tls=True
    )
    assert vip.router.url == "https://[fd00::100]:30000"
    assert vip.router.members == ["https://router01:30000", "https://[fd00::11]:30000"]
    assert vip.router.ca_file == "/etc/vllm-fleet/tls/ca.crt"


def test_argument_specs_document_the_mirrored_settings():
    specs = yaml.safe_load((ROLE / "meta/argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"]["options"]
    for name, setting in MIRRORED.items():
        assert options[name]["type"] == "int"
        assert options[name]["default"] == ROUTER_DEFAULTS["router_setting_defaults"][setting]
