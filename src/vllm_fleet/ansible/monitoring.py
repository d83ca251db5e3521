"""Filters of the monitoring role: the inventory as Prometheus scrape jobs and rules."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

import yaml

from vllm_fleet.ansible.addresses import fleet_address, url_host
from vllm_fleet.engine.config import engine_url
from vllm_fleet.preflight.engine_tls import engine_tls

ENGINE_JOB = "vllm-engine"
ROUTER_JOB = "vllm-fleet-router"
WATCHDOG_JOB = "vllm-fleet-watchdog"


def _engine_groups(hosts: list[str], hostvars: Mapping[str, Any]) -> list[dict[str, Any]]:
    found = []
    for host in hosts:
        address = str(
            hostvars[host].get("vllm_engine_advertise_host", fleet_address(host, hostvars))
        )
        tls = engine_tls(hostvars[host]) is True
        for group in hostvars[host].get("fleet_engine_groups", []):
            found.append(
                {
                    "host": host,
                    "advertise": url_host(address),
                    "address": address,
                    "tls": tls,
                    **group,
                }
            )
    return found


def _served_name(models: Mapping[str, Any], model: str) -> str:
    return str(models.get(model, {}).get("served_name", model))


def _address(hostvars: Mapping[str, Any], host: str) -> str:
    """How Prometheus reaches a host: the address every fleet host reaches it on."""
    return url_host(fleet_address(host, hostvars))


def _static(target: str, labels: Mapping[str, str]) -> dict[str, Any]:
    return {"targets": [target], "labels": dict(labels)}


def scrape_configs(
    settings: Mapping[str, Any],
    *,
    engine_hosts: list[str],
    router_hosts: list[str],
    hostvars: Mapping[str, Any],
    models: Mapping[str, Any],
    router_metrics_port: int,
    watchdog_metrics_port: int,
    groups: Mapping[str, list[str]],
    ca_file: str | None = None,
) -> list[dict[str, Any]]:
    """One job per kind of target, every target labelled with its inventory host.

    Engines keep their own model_name label (honor_labels): the target label carries the
    same served name, so `up` of a down engine still says which model lost capacity. An
    engine on HTTPS (fleet_engine_tls) is scraped over it, trusting ``ca_file`` (the fleet
    CA on the Prometheus host) alone; a fleet part-way through moving to HTTPS has both.
    """
    found = _engine_groups(engine_hosts, hostvars)
    engines = [
        _static(
            f"{g['advertise']}:{int(g['port'])}",
            {
                "fleet_host": g["host"],
                "fleet_group": str(g["name"]),
                "model_name": _served_name(models, g["model"]),
                **({"__scheme__": "https"} if g["tls"] else {}),
            },
        )
        for g in found
    ]
    engine_job: dict[str, Any] = {
        "job_name": ENGINE_JOB,
        "honor_labels": True,
        "static_configs": engines,
    }
    if any(g["tls"] for g in found):
        if not ca_file:
            raise ValueError(
                "engines serve HTTPS (fleet_engine_tls) and Prometheus has no fleet CA to trust "
                "(monitoring_tls_ca_file)"
            )
        engine_job["tls_config"] = {"ca_file": ca_file}
    jobs: list[dict[str, Any]] = [
        engine_job,
        {
            "job_name": ROUTER_JOB,
            "static_configs": [
                _static(f"{_address(hostvars, h)}:{int(router_metrics_port)}", {"fleet_host": h})
                for h in router_hosts
            ],
        },
        {
            "job_name": WATCHDOG_JOB,
            "static_configs": [
                _static(
                    f"{url_host(hostvars[h].get('vllm_engine_advertise_host', fleet_address(h, hostvars)))}"
                    f":{int(watchdog_metrics_port)}",
                    {"fleet_host": h},
                )
                for h in engine_hosts
                if hostvars[h].get("fleet_engine_groups")
            ],
        },
    ]
    for exporter in settings.get("exporters") or []:
        hosts = exporter["hosts"]
        members = list(groups.get(hosts, [])) if isinstance(hosts, str) else list(hosts)
        jobs.append(
            {
                "job_name": str(exporter["job"]),
                "metrics_path": str(exporter.get("path", "/metrics")),
                "static_configs": [
                    _static(f"{_address(hostvars, h)}:{int(exporter['port'])}", {"fleet_host": h})
                    for h in members
                ],
            }
        )
    return [job for job in jobs if job["static_configs"]]


def inventory_rules(
    settings: Mapping[str, Any],
    engine_hosts: list[str],
    hostvars: Mapping[str, Any],
    models: Mapping[str, Any],
) -> dict[str, Any]:
    """Recording rules that carry inventory facts the alerts join against.

    vllm_fleet:ttft_p99_threshold_seconds{model_name}: the per-model TTFT p99 target.
    vllm_fleet:router_worker_info{worker,...}: which engine group (and model) a router
    worker URL is, so a router's per-worker health can be summed per model.
    """
    groups = _engine_groups(engine_hosts, hostvars)
    rules: list[dict[str, Any]] = []
    served = sorted({g["model"] for g in groups})
    for model in served:
        threshold = models.get(model, {}).get(
            "ttft_p99_threshold_seconds", settings["ttft_p99_threshold_seconds"]
        )
        rules.append(
            {
                "record": "vllm_fleet:ttft_p99_threshold_seconds",
                "expr": f"vector({float(threshold)})",
                "labels": {"model_name": _served_name(models, model)},
            }
        )
    for g in groups:
        rules.append(
            {
                "record": "vllm_fleet:router_worker_info",
                "expr": "vector(1)",
                "labels": {
                    "worker": engine_url(g["address"], int(g["port"]), tls=g["tls"]),
                    "model_name": _served_name(models, g["model"]),
                    "fleet_host": g["host"],
                    "fleet_group": str(g["name"]),
                },
            }
        )
    return {"groups": [{"name": "vllm-fleet-inventory", "rules": rules}]}


def targets(scrape: list[Mapping[str, Any]]) -> list[str]:
    """'job target' for every target of scrape configs, sorted."""
    return sorted(
        f"{job.get('job_name')} {target}"
        for job in scrape
        for static in job.get("static_configs") or []
        for target in static.get("targets") or []
    )


def loaded_targets(config_yaml: str) -> list[str]:
    """The targets of the configuration Prometheus has loaded (/api/v1/status/config)."""
    config = yaml.safe_load(config_yaml) or {}
    return targets(config.get("scrape_configs") or [])


def down_targets(active: list[Mapping[str, Any]]) -> list[str]:
    """'job instance: error' for every active target whose last scrape failed."""
    return [
        f"{t.get('labels', {}).get('job')} {t.get('labels', {}).get('instance')}: "
        f"{t.get('health')}, {t.get('lastError') or 'not scraped yet'}"
        for t in active
        if t.get("health") != "up"
    ]


def is_ip(value: object) -> bool:
    try:
        ipaddress.ip_address(str(value))
    except ValueError:
        return False
    return True


FILTERS = {
    "monitoring_scrape_configs": scrape_configs,
    "monitoring_inventory_rules": inventory_rules,
    "monitoring_is_ip": is_ip,
    "monitoring_targets": targets,
    "monitoring_loaded_targets": loaded_targets,
    "monitoring_down_targets": down_targets,
}
