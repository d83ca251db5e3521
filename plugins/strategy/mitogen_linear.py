"""Mitogen's linear strategy (the ``mitogen`` package, pinned in pyproject.toml), found here
so that ansible.cfg names a folder of this repository rather than a path into the
controller's venv.

Under it each host keeps one Python interpreter for the whole run, reached once through the
play's connection (ssh on real hosts, podman in the lab and Molecule, local for the
controller), and every module runs in it: a task no longer starts a new interpreter on the
host, which was most of a converged run's time (bench/connection_bench.py).
"""

from __future__ import annotations

import ansible_mitogen.affinity
from ansible_mitogen.plugins.strategy.mitogen_linear import StrategyModule

# Mitogen pins its multiplexer to CPU 0, and Ansible's processes with everything they start
# (podman exec or ssh, and through them the host-side interpreter and every module's
# children) to the other CPUs: on a 2-core controller, one core for all of it. A lab or
# Molecule host's pip install or verification then ran on one core. Its base policy pins
# nothing.
ansible_mitogen.affinity.policy = ansible_mitogen.affinity.Policy()

__all__ = ["StrategyModule"]
