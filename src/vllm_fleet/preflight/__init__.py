"""Preflight: validate a whole inventory on the controller, before any host changes."""

from vllm_fleet.preflight.checks import Finding, HostInput, PreflightResult, validate

__all__ = ["Finding", "HostInput", "PreflightResult", "validate"]
