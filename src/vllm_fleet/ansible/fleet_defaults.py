"""Filters of the fleet_defaults role, which every role depends on: what all roles share."""

from __future__ import annotations

from vllm_fleet.ansible.addresses import bind_address


def apt_missing(packages: list[str], dpkg_query: str) -> list[str]:
    """The packages ``dpkg-query --show --showformat='${Package} ${db:Status-Abbrev}\\n'``
    does not report installed (status ``?i``: ``ii``, ``hi``), in the order asked. A package
    dpkg has never seen is not in its output at all; one removed keeps its ``rc`` line."""
    installed = set()
    for line in dpkg_query.splitlines():
        name, _, status = line.strip().partition(" ")
        if len(status) >= 2 and status[1] == "i":
            installed.add(name.split(":")[0])
    return [package for package in packages if package.split(":")[0] not in installed]


FILTERS = {
    "fleet_defaults_bind_address": bind_address,
    "fleet_defaults_apt_missing": apt_missing,
}
