"""Requests a router is working on now, from its own Prometheus gauge (catalog/routers.yml
``inflight_metric``): a planned router restart waits for it to reach 0 after the VIP moved."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def inflight(metrics_text: str, *metrics: str) -> int:
    """The sum of every sample of each of ``metrics`` (one per engine); 0 when the router has
    none yet. Each router names its gauge differently: given every release's, the count is
    right whichever router runs (an implementation change restarts one into the other)."""
    total = 0.0
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name in metrics:
                total += sample.value
    return round(total)


def router_inflight(metrics_url: str, metrics: list[str], timeout: float = 5.0) -> int:
    response = httpx.get(metrics_url, timeout=timeout)
    response.raise_for_status()
    return inflight(response.text, *metrics)
