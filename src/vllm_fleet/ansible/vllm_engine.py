"""Filters of the vllm_engine role."""

from __future__ import annotations

from vllm_fleet.ansible.addresses import fleet_address, fleet_addresses, router_targets, url_host
from vllm_fleet.deploy.rollout import restart_plan
from vllm_fleet.router.control_keys import host_control_key


def router_engine_args(router: dict[str, object]) -> list[str]:
    """Engine flags the chosen router needs.

    vllm-router's cache_aware policy renders prompts through the engines' /v1/*/render
    endpoints, which vLLM refuses (403) unless it runs with --enable-scale-out.
    """
    impl = router.get("impl", "sglang")
    policy = router.get("policy", "cache_aware")
    return ["--enable-scale-out"] if impl == "vllm" and policy == "cache_aware" else []


FILTERS = {
    "vllm_engine_control_key": host_control_key,
    "vllm_engine_address": fleet_address,
    "vllm_engine_addresses": fleet_addresses,
    "vllm_engine_url_host": url_host,
    "vllm_engine_router_targets": router_targets,
    "vllm_engine_router_args": router_engine_args,
    "vllm_engine_restart_plan": restart_plan,
}
