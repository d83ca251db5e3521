"""The fleet's interface and shared paths are declared once, in roles/fleet_defaults."""

from __future__ import annotations

import pytest
import yaml

from tests.support.paths import ROOT
from vllm_fleet.ansible import preflight_action as PLUGIN

SPEC = yaml.safe_load((ROOT / "roles/fleet_defaults/meta/argument_specs.yml").read_text())
DEFAULTS = yaml.safe_load((ROOT / "roles/fleet_defaults/defaults/main.yml").read_text())
SHARED_PATHS = ("/opt/vllm-fleet", "/etc/vllm-fleet/engines", "/srv/models")
ROLES = sorted(p.parent.parent.name for p in ROOT.glob("roles/*/meta/main.yml"))


def test_every_shared_path_default_is_declared_in_its_spec():
    assert set(DEFAULTS) == set(SPEC["argument_specs"]["main"]["options"])


@pytest.mark.parametrize("role", [r for r in ROLES if r != "fleet_defaults"])
def test_every_role_depends_on_fleet_defaults_and_repeats_no_shared_path(role):
    meta = yaml.safe_load((ROOT / f"roles/{role}/meta/main.yml").read_text())
    assert "fleet_defaults" in meta["dependencies"]
    defaults = ROOT / f"roles/{role}/defaults/main.yml"
    if defaults.exists():
        for line in defaults.read_text().splitlines():
            value = line.partition(":")[2].strip().strip("\"'")
            assert not value.startswith(SHARED_PATHS), f"{defaults}: {line} (use fleet_*)"


def test_preflight_knows_the_interface_from_the_spec_and_keeps_no_list_of_its_own():
    interface = set(SPEC["argument_specs"]["interface"]["options"])
    assert {"fleet_engine_groups", "fleet_models", "fleet_retired_served_names"} <= interface
    assert interface | set(DEFAULTS) <= PLUGIN.known_variables(ROOT / "roles")
    # Its own set holds only what its tasks register, never an inventory variable.
    assert all(name.startswith("preflight_") for name in PLUGIN.PREFLIGHT_FACTS)
