"""The versions rule both backends share: what is recorded, what a rollback picks, what it accepts."""

from __future__ import annotations

import pytest

from sless_api.domain.errors import Conflict, NotFound
from sless_api.domain.versions import KEEP, Version, append, choose, listing, requested_version
from sless_core.errors import ValidationError
from sless_operator import history

CONFIG = {"runtime": "python3.11", "entrypoint": "handler.handle", "memory_mb": 128, "timeout_sec": 30,
          "env_vars": {}, "secrets": []}  # fmt: skip


def test_each_new_deploy_is_a_new_number_and_a_repeat_is_none() -> None:
    one = append([], "a" * 64, CONFIG, 1.0)
    assert one is not None and [v.version for v in one] == [1]
    assert append(one, "a" * 64, dict(CONFIG), 2.0) is None  # same code and configuration
    two = append(one, "a" * 64, {**CONFIG, "memory_mb": 256}, 3.0)  # configuration only: a version too
    assert two is not None and [v.version for v in two] == [1, 2]
    many: list[Version] = []
    for n in range(KEEP + 3):
        many = append(many, f"{n:064x}", CONFIG, float(n)) or many
    assert [v.version for v in many] == list(range(4, KEEP + 4))  # numbers never reused


def test_rollback_picks_the_previous_or_the_asked_version() -> None:
    kept = append(append([], "a" * 64, CONFIG, 1.0) or [], "b" * 64, CONFIG, 2.0) or []
    kept = append(kept, "c" * 64, CONFIG, 3.0) or []
    assert choose(kept, None, "fn").code_hash == "b" * 64
    assert choose(kept, 1, "fn").code_hash == "a" * 64
    with pytest.raises(Conflict, match="is the one deployed"):
        choose(kept, 3, "fn")
    with pytest.raises(NotFound, match="no version 9 \\(kept: 1, 2, 3\\)"):
        choose(kept, 9, "fn")
    with pytest.raises(Conflict, match="no earlier version"):
        choose(kept[:1], None, "fn")
    with pytest.raises(Conflict, match="no deployed version"):
        choose([], None, "fn")
    shown = listing(kept)["items"]
    assert [(v["version"], v["current"]) for v in shown] == [(3, True), (2, False), (1, False)]
    assert shown[0]["memory_mb"] == 128 and shown[0]["deployed_at"] == "1970-01-01T00:00:03Z"


@pytest.mark.parametrize("body", [[], "2", {"version": "2"}, {"version": 0}, {"version": -1}, {"version": True},
                                  {"version": 2**31}, {"version": 1.5}, {"version": 2, "force": True}])
def test_bad_rollback_bodies_are_refused(body: object) -> None:
    with pytest.raises(ValidationError):
        requested_version(body)


def test_good_rollback_bodies() -> None:
    assert requested_version(None) is None and requested_version({}) is None
    assert requested_version({"version": None}) is None and requested_version({"version": 7}) == 7


def test_the_operator_records_a_ready_deploy_once_without_replicas() -> None:
    spec = {"runtime": "python3.11", "codeHash": "a" * 64, "codeKey": "code/ns/fn/1.tar.gz", "replicas": 1}
    first = history.recorded({}, spec, "a" * 64, "2026-01-01T00:00:00Z")
    assert first == [{"version": 1, "codeHash": "a" * 64, "deployedAt": "2026-01-01T00:00:00Z",
                      "spec": {"codeKey": "code/ns/fn/1.tar.gz", "runtime": "python3.11"}}]  # fmt: skip
    assert history.recorded({"versions": first}, {**spec, "replicas": 3}, "a" * 64, "later") is None
    second = history.recorded({"versions": first}, {**spec, "codeKey": "code/ns/fn/2.tar.gz"}, "b" * 64, "t")
    assert second is not None and [v["version"] for v in second] == [1, 2]
