"""fleet_defaults' apt_packages: which packages dpkg does not report installed."""

from __future__ import annotations

from vllm_fleet.ansible.fleet_defaults import apt_missing

# dpkg-query --show --showformat='${Package} ${db:Status-Abbrev}\n' nftables curl nginx ...
QUERY = "nftables ii \ncurl rc \nlibc6 ii \nkeepalived hi \npython3-venv iU \n"


def test_installed_and_held_packages_are_not_missing():
    assert apt_missing(["nftables", "keepalived"], QUERY) == []


def test_removed_half_installed_and_unknown_packages_are_missing_in_the_order_asked():
    # curl: removed, its configuration kept (rc); python3-venv: unpacked, not configured (iU);
    # polkitd: dpkg has never seen it (no line at all).
    asked = ["polkitd", "curl", "nftables", "python3-venv"]
    assert apt_missing(asked, QUERY) == ["polkitd", "curl", "python3-venv"]


def test_an_architecture_qualified_name_matches_dpkgs_plain_name():
    assert apt_missing(["libc6:amd64", "libc6"], QUERY) == []


def test_nothing_reported_means_everything_is_missing():
    assert apt_missing(["nftables"], "") == ["nftables"]
