"""vllm-fleet: the logic behind the Ansible bundle (planning, weights, engines, checks)."""

__version__ = "0.1.0"
