"""With an engine host's firewall on, every router and monitoring host needs an IP address."""

from vllm_fleet.preflight.checks import HostInput
from vllm_fleet.preflight.facts import HostFacts
from vllm_fleet.preflight.firewall_peers import check_firewall_peers

ADDRESSES = {"router01": "10.0.0.10", "router02": "router02", "prom01": "prom01.example"}


def engine(firewall: object = None) -> HostInput:
    variables: dict[str, object] = {"fleet_engine_groups": []}
    if firewall is not None:
        variables["fleet_engine_firewall"] = firewall
    return HostInput("engine01", variables, HostFacts.from_dict({}))


def test_each_router_or_monitoring_host_known_only_by_name_is_refused_by_name():
    findings = check_firewall_peers(
        [engine()], ["router01", "router02", "prom01", "router02"], ADDRESSES.__getitem__
    )
    assert [(f.host, f.key, f.value) for f in findings] == [
        ("router02", "fleet_address", "router02"),
        ("prom01", "fleet_address", "prom01.example"),
    ]
    assert "the engine firewall on engine01" in findings[0].message
    assert "set fleet_address to its private IP address" in findings[0].fix


def test_nothing_to_check_when_no_engine_host_of_the_run_has_its_firewall_on():
    assert check_firewall_peers([engine(False)], ["router02"], ADDRESSES.__getitem__) == []
    router_only = HostInput("router02", {}, HostFacts.from_dict({}))
    assert check_firewall_peers([router_only], ["router02"], ADDRESSES.__getitem__) == []
