"""engine_runtime's pip origin: the wheelhouse (no index) or package indexes."""

from __future__ import annotations

import pytest

from vllm_fleet.ansible import engine_runtime as filters


def test_wheelhouse_means_no_index_at_all():
    args = filters.pip_source_args("wheelhouse", "s1", "http://router01:8088/wheels/")
    assert args == [
        "--no-index",
        "--trusted-host=router01",
        "--find-links",
        "http://router01:8088/wheels/s1/",
    ]
    assert filters.pip_source_args("wheelhouse", "s1", "file:///srv/w")[1] == (
        "--trusted-host=localhost"
    )


def test_index_lists_the_main_index_then_each_extra_once():
    args = filters.pip_source_args(
        "index",
        "ascend-vllm-0.23.0",
        "http://unused",
        "https://pypi.internal/simple",
        [
            "https://download.pytorch.org/whl/cpu",
            "",
            "https://pypi.internal/simple",
            "https://ascend.internal/pypi",
        ],
    )
    assert args == [
        "--index-url", "https://pypi.internal/simple",
        "--extra-index-url", "https://download.pytorch.org/whl/cpu",
        "--extra-index-url", "https://ascend.internal/pypi",
    ]  # fmt: skip
    assert "--no-index" not in args


@pytest.mark.parametrize(
    ("source", "index", "message"),
    [
        ("index", "", "needs engine_runtime_index_url"),
        ("pypi", "https://x", "engine_runtime_source='pypi': use one of wheelhouse, index"),
    ],
)
def test_bad_settings_are_named(source, index, message):
    with pytest.raises(ValueError, match=message):
        filters.pip_source_args(source, "s", "http://w", index)
