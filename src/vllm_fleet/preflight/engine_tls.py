"""The engines' ports speak HTTPS whenever the fleet has a CA; plain HTTP only where the
inventory says so.

A router sends each client's prompt, and the engine key, to an engine's port; the host's own
probes, Prometheus and verify call it too. With a fleet CA (``fleet_ca_dir``) every engine
host serves its engines with their own certificate from it (role host_tls, run a second time
for a key that systemd hands the engine units) and every caller trusts the CA alone: the
routers through SSL_CERT_FILE in their unit, the rest through vllm_fleet.tls.trust. A fleet
with engines and no CA is refused unless ``fleet_engine_plain_http`` is true (a lab, or a
network that alone keeps prompts and the engine key private). Every router must then hold
the fleet CA too, or it could not verify the engines' certificates.
"""

from __future__ import annotations

from collections.abc import Mapping

from vllm_fleet.preflight.checks import Finding

CA = "fleet_ca_dir"
PLAIN = "fleet_engine_plain_http"
KEYS = (CA, PLAIN)
FIX_CA = (
    "create the fleet CA on the controller with `vllm-fleet ca init DIR` (or put your own "
    f"ca.crt and ca.key there) and set {CA}: DIR in group_vars/all; in a lab, or where the "
    f"network alone keeps prompts and the engine key private, set {PLAIN}: true"
)


def engine_tls(variables: Mapping[str, object]) -> bool | None:
    """Whether this host's engines speak TLS (fleet_engine_tls); None: the setting is no bool."""
    plain = variables.get(PLAIN, False)
    if not isinstance(plain, bool):
        return None
    ca_dir = variables.get(CA)
    return isinstance(ca_dir, str) and bool(ca_dir) and not plain


def check_engine_tls(
    engines: Mapping[str, Mapping[str, object]], routers: Mapping[str, Mapping[str, object]]
) -> list[Finding]:
    """``engines`` and ``routers``: host -> its variables (fleet_ca_dir,
    fleet_engine_plain_http), for every engine host and router of the inventory."""
    findings: list[Finding] = []
    serving_tls: list[str] = []
    for host, variables in engines.items():
        tls = engine_tls(variables)
        if tls is None:
            findings.append(
                Finding(
                    host, PLAIN, variables.get(PLAIN), "must be true or false", "leave it out (TLS)"
                )
            )
        elif tls:
            serving_tls.append(host)
        elif variables.get(PLAIN) is not True:
            findings.append(
                Finding(
                    host,
                    CA,
                    variables.get(CA),
                    "is not set, and this host serves engines, whose ports carry every client's "
                    "prompt and the engine key: they speak HTTPS with certificates from the "
                    "fleet CA",
                    FIX_CA,
                )
            )
    if not serving_tls:
        return findings
    shown = ", ".join(serving_tls[:3]) + (" ..." if len(serving_tls) > 3 else "")
    for host, variables in routers.items():
        ca_dir = variables.get(CA)
        if not (isinstance(ca_dir, str) and ca_dir):
            findings.append(
                Finding(
                    host,
                    CA,
                    ca_dir,
                    f"is not set on this router, and engines serve HTTPS with certificates from "
                    f"the fleet CA ({shown}): the router could not verify them",
                    f"set {CA} for the routers as for the engine hosts (group_vars/all)",
                )
            )
    return findings
