"""``vllm-fleet watchdog``: probes an engine host's groups, restarts hung ones, and keeps
their router registrations in step with their health (routers forget workers on restart).

Modules: ``config`` (settings), ``groups`` (per-group facts from the engine configs),
``state`` (the pure per-group state machine), ``probe`` (a real completion), ``units``
(systemctl), ``metrics`` (Prometheus), ``journal`` (events), ``service`` (the loop).
"""
