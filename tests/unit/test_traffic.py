"""Traffic split rules (sless_core.traffic) and the deterministic round robin that shares calls."""

from __future__ import annotations

from collections import Counter

import pytest

from sless_core import naming, traffic
from sless_core.errors import ValidationError
from sless_core.traffic import (
    SplitEntry,
    SplitRefused,
    TrafficSplit,
    WeightedRoundRobin,
    check_versions,
    parse_request,
)


def split(*pairs: tuple[int, int]) -> TrafficSplit:
    return TrafficSplit(tuple(SplitEntry(v, w) for v, w in pairs))


def picks(weights: list[tuple[int, int]], count: int) -> list[int]:
    robin = WeightedRoundRobin(weights)
    return [robin.pick() for _ in range(count)]


@pytest.mark.parametrize("a", [0, 1, 10, 33, 50, 77, 99, 100])
def test_every_100_consecutive_picks_give_each_version_exactly_its_weight(a: int) -> None:
    weights = [(4, a), (3, 100 - a)]
    sequence = picks(weights, 1000)
    for start in (0, 100, 137, 900):
        window = Counter(sequence[start:start + 100])
        assert window[4] == a and window[3] == 100 - a


def test_picks_interleave_evenly_and_start_with_the_first_entry() -> None:
    assert picks([(2, 50), (1, 50)], 6) == [2, 1, 2, 1, 2, 1]
    ten = picks([(2, 90), (1, 10)], 100)
    assert [i for i, v in enumerate(ten) if v == 1] == [5, 15, 25, 35, 45, 55, 65, 75, 85, 95]  # evenly spaced
    with pytest.raises(ValueError):
        WeightedRoundRobin([(1, 0)])


def test_a_request_parses_to_its_entries_in_order() -> None:
    body = {"split": [{"version": 4, "weight": 10}, {"version": 3, "weight": 90}]}
    assert parse_request(body) == split((4, 10), (3, 90))
    assert parse_request({"split": [{"version": 3, "weight": 100}]}).to_list() == [{"version": 3, "weight": 100}]


@pytest.mark.parametrize(("body", "field"), [
    ({"split": [{"version": 1, "weight": 50}, {"version": 2, "weight": 40}]}, "split"),
    ({"split": [{"version": 1, "weight": 50}, {"version": 2, "weight": 25}, {"version": 3, "weight": 25}]}, "split"),
    ({"split": [{"version": 1, "weight": -1}, {"version": 2, "weight": 101}]}, "split[0].weight"),
    ({"split": [{"version": 1, "weight": 50.0}, {"version": 2, "weight": 50}]}, "split[0].weight"),
    ({"split": [{"version": 1, "weight": False}, {"version": 2, "weight": 100}]}, "split[0].weight"),
    ({"split": [{"version": 0, "weight": 100}]}, "split[0].version"),
    ({"split": [{"version": 2**31, "weight": 100}]}, "split[0].version"),
    ({"split": [{"version": 1, "weight": 50}, {"version": 1, "weight": 50}]}, "split"),
    ({"split": [{"version": 1, "weight": 100, "x": 1}]}, "split[0].x"),
    ({"split": [{"weight": 100}]}, "split[0]"),
    ({"split": ["1"]}, "split[0]"),
    ({"split": {"version": 1, "weight": 100}}, "split"),
    ({"split": []}, "split"),
    ({"other": 1}, "other"),
    ({}, "split"),
])
def test_bad_requests_name_the_field(body: object, field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_request(body)
    assert caught.value.field == field


def test_a_body_that_is_not_an_object_is_refused() -> None:
    for body in ([], "x", 1, None):
        with pytest.raises(ValidationError):
            parse_request(body)


def test_versions_must_be_kept_and_include_the_current_one() -> None:
    assert check_versions(split((3, 90), (2, 10)), [1, 2, 3], "f") == 3
    assert check_versions(split((3, 100)), [3], "f") == 3
    for given, kept, status, words in [
        (split((3, 50), (9, 50)), [1, 2, 3], 404, "no version 9 (kept: 1, 2, 3)"),
        (split((2, 100)), [1, 2, 3], 409, "current version 3"),
        (split((1, 50), (2, 50)), [1, 2, 3], 409, "current version 3"),
        (split((1, 100)), [], 409, "no deployed version"),
    ]:
        with pytest.raises(SplitRefused) as caught:
            check_versions(given, kept, "f")
        assert caught.value.status == status and words in caught.value.message


def test_the_function_codec_reads_and_writes_spec_traffic() -> None:
    from sless_core.crcodec import FunctionResource, InvalidResource

    obj = {"metadata": {"name": "a", "namespace": "sless-0123456789abcdef"},
           "spec": {"runtime": "python3.11", "traffic": [{"version": 2, "weight": 90}, {"version": 1, "weight": 10}]}}
    fn = FunctionResource.from_cr(obj)
    assert fn.traffic == split((2, 90), (1, 10))
    assert fn.spec_to_cr()["traffic"] == obj["spec"]["traffic"]
    assert "traffic" not in FunctionResource.from_cr({**obj, "spec": {"runtime": "python3.11"}}).spec_to_cr()
    for bad in ([{"version": 2, "weight": 90}], [{"version": 2, "weight": 50}] * 2, "x"):
        with pytest.raises(InvalidResource) as caught:
            FunctionResource.from_cr({**obj, "spec": {"runtime": "python3.11", "traffic": bad}})
        assert str(caught.value.field).startswith("spec.traffic")


def test_the_other_versions_objects_never_take_a_function_name() -> None:
    """`<f>-split` would be function `<f>-split`'s own name (its Deployment, Service and pods' label)."""
    for length in range(1, naming.NAME_MAX + 1):
        function = "f" * length
        name = traffic.other_version_name(function)
        assert not naming.is_function_name(name) and naming.DNS1123_LABEL.fullmatch(name)
        assert name.startswith(f"{function}-split-") and len(name) <= 55
    assert traffic.other_version_name("image") != traffic.other_version_name("image-split")
