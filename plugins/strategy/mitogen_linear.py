"""Mitogen's linear strategy (the ``mitogen`` package, pinned in pyproject.toml), found here
so that ansible.cfg names a folder of this repository rather than a path into the
controller's venv.

Under it each host keeps one Python interpreter for the whole run, reached once through the
play's connection (ssh on real hosts, podman in the lab and Molecule, local for the
controller), and every module runs in it: a task no longer starts a new interpreter on the
host, which was most of a converged run's time (bench/connection_bench.py).
"""

from __future__ import annotations

from ansible_mitogen.plugins.strategy.mitogen_linear import StrategyModule

__all__ = ["StrategyModule"]
