"""The model cache's read token and TLS, checked before any host changes.

The cache host (group model_cache) serves the hf and modelscope models it fetched, gated ones
included, only to readers that present fleet_model_cache_token: the cache host needs it to
guard its files, and every engine host that fetches a model from it needs it to read. It
serves them over HTTPS with a certificate from the fleet CA (fleet_ca_dir, role host_tls),
which those engine hosts trust; plain HTTP only where fleet_model_cache_plain_http says so.
"""

from __future__ import annotations

from vllm_fleet.preflight.checks import REDACTED, Finding, HostInput
from vllm_fleet.weights.pins import UPSTREAM, cache_token_problem

KEY = "fleet_model_cache_token"
CA = "fleet_ca_dir"
PLAIN = "fleet_model_cache_plain_http"
FIX = (
    "generate one with `openssl rand -base64 32` and keep it in Ansible Vault "
    "(ansible-vault encrypt_string --name fleet_model_cache_token), in group_vars/all"
)


def models_from_cache(host: HostInput) -> list[str]:
    """The models this host's engine groups fetch through the cache (hf and modelscope)."""
    groups = host.variables.get("fleet_engine_groups")
    models = host.variables.get("fleet_models")
    if not isinstance(groups, list) or not isinstance(models, dict):
        return []
    names = {g.get("model") for g in groups if isinstance(g, dict)}
    return sorted(
        str(name)
        for name in names
        if isinstance(models.get(name), dict) and models[name].get("source") in UPSTREAM
    )


def check_model_cache(hosts: list[HostInput], cache_hosts: list[str]) -> list[Finding]:
    if not cache_hosts:
        return []
    findings = []
    for host in hosts:
        wanted = models_from_cache(host)
        if host.name in cache_hosts:
            why = "this host is the model cache, which serves only readers holding it"
        elif wanted:
            why = (
                f"this host fetches {', '.join(wanted)} from the model cache {cache_hosts[0]}, "
                "which serves only readers holding it"
            )
        else:
            continue
        problem = cache_token_problem(host.variables.get(KEY))
        if problem:
            findings.append(Finding(host.name, KEY, REDACTED, f"{problem}: {why}", FIX))
        findings.extend(_tls_findings(host, cache_hosts))
    return findings


def _tls_findings(host: HostInput, cache_hosts: list[str]) -> list[Finding]:
    plain = host.variables.get(PLAIN, False)
    if not isinstance(plain, bool):
        return [Finding(host.name, PLAIN, plain, "must be true or false", "leave it out (TLS)")]
    ca_dir = host.variables.get(CA)
    if plain or (isinstance(ca_dir, str) and ca_dir):
        return []
    role = "serves" if host.name in cache_hosts else "reads"
    return [
        Finding(
            host.name,
            CA,
            ca_dir,
            f"is not set, and this host {role} the model cache, which speaks HTTPS with a "
            "certificate from the fleet CA",
            "create the fleet CA on the controller with `vllm-fleet ca init DIR` (or put your "
            f"own ca.crt and ca.key there) and set {CA}: DIR; in a lab without one, "
            f"{PLAIN}: true",
        )
    ]
