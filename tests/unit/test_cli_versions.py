"""`sless versions` and `sless traffic` tables, and the shape check of `--split VERSION=WEIGHT`."""

from __future__ import annotations

import pytest

from sless_api.cli.client import CliError
from sless_api.cli.versions import parse_split, same_deploy, split_rows, version_rows

ITEMS = [
    {"version": 12, "code_hash": "ab" * 32, "runtime": "python3.11", "env_vars": {},
     "deployed_at": "2026-12-01T10:00:02Z", "current": True},
    {"version": 11, "code_hash": "cd" * 32, "runtime": "python3.11", "env_vars": {},
     "deployed_at": "2026-12-01T09:00:01Z", "current": False},
    {"version": 3, "code_hash": "ab" * 32, "runtime": "python3.11", "env_vars": {"A": "1"},
     "deployed_at": "2026-11-30T08:00:00Z", "current": False},
]


def test_split_pairs_become_the_apis_entries_in_order() -> None:
    assert parse_split(["3=90", "4=10"]) == [{"version": 3, "weight": 90}, {"version": 4, "weight": 10}]
    assert parse_split([]) == []
    # only the shape is checked here: ranges, sums and versions are the API's to refuse
    assert parse_split(["0=500", "7=0"]) == [{"version": 0, "weight": 500}, {"version": 7, "weight": 0}]


@pytest.mark.parametrize("bad", ["3=abc", "abc", "3", "=10", "3=", "3=-5", "-3=5", "3=1.5", "3=10%", "3==10",
                                 "v3=10", "3=\uff11\uff10", "3=90,4=10"])
def test_a_pair_that_is_not_version_equals_weight_is_named(bad: str) -> None:
    with pytest.raises(CliError, match="VERSION=WEIGHT") as caught:
        parse_split(["1=50", bad])
    assert repr(bad) in str(caught.value)


def test_versions_table_marks_the_current_one_and_traffic_shares() -> None:
    split = [{"version": 12, "weight": 90}, {"version": 3, "weight": 10}]
    header, *lines = version_rows(ITEMS, split).splitlines()
    assert header.split() == ["VERSION", "CODE", "DEPLOYED", "CURRENT", "TRAFFIC"]
    assert [line.split() for line in lines] == [
        ["v12", "ab" * 6, "2026-12-01T10:00:02Z", "current", "90%"],
        ["v11", "cd" * 6, "2026-12-01T09:00:01Z", "-", "-"],
        ["v3", "ab" * 6, "2026-11-30T08:00:00Z", "-", "10%"],
    ]
    assert len({line.index("ab" * 6) for line in (lines[0], lines[2])}) == 1  # aligned columns
    assert [line.split()[-1] for line in version_rows(ITEMS, None).splitlines()[1:]] == ["-", "-", "-"]
    assert version_rows([], None) == ""


def test_split_table_and_no_split() -> None:
    assert split_rows("f", None, 4) == "f: no split (every call goes to the current version)"
    assert [r.split() for r in split_rows("f", [{"version": 4, "weight": 50}, {"version": 2, "weight": 50}],
                                          4).splitlines()] == [["VERSION", "WEIGHT", "CURRENT"],
                                                               ["v4", "50%", "current"], ["v2", "50%", "-"]]


def test_same_deploy_compares_code_and_configuration_only() -> None:
    assert same_deploy(ITEMS[0], {**ITEMS[0], "version": 99, "deployed_at": "x", "current": False})
    assert not same_deploy(ITEMS[0], ITEMS[1])  # other code
    assert not same_deploy(ITEMS[0], ITEMS[2])  # same code, other configuration
