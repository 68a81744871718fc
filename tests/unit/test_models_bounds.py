"""Bounds of the resource model: every bad value is a ValidationError naming its field, never a crash."""

from __future__ import annotations

from typing import Any

import pytest

from sless_core.errors import ValidationError
from sless_core.models import (
    ENV_MAX_TOTAL_BYTES,
    ENV_MAX_VALUE,
    MAX_RUN_ID,
    FunctionSpec,
    JobSpec,
    validate_run_id,
)


def function(**fields: Any) -> FunctionSpec:
    return FunctionSpec.from_user({"name": "f", "runtime": "python3.11", **fields}, 900)


def job(**fields: Any) -> JobSpec:
    return JobSpec.from_user({"name": "j", "function": "f", **fields})


@pytest.mark.parametrize("run_id", [0, 1, MAX_RUN_ID])
def test_run_id_within_bounds(run_id: int) -> None:
    assert job(run_id=run_id).run_id == run_id
    assert validate_run_id(run_id) == run_id


@pytest.mark.parametrize("run_id", [-1, MAX_RUN_ID + 1, 2**63, 10**400, True, 1.0, "1", None, [1]])
def test_run_id_out_of_bounds_names_the_field(run_id: object) -> None:
    with pytest.raises(ValidationError) as post:
        job(run_id=run_id)
    assert post.value.field == "run_id"
    # The same rule for PATCH {"run_id": n}: one function, one message.
    with pytest.raises(ValidationError) as patch:
        validate_run_id(run_id)
    assert patch.value.field == "run_id"
    assert str(patch.value) == str(post.value)


@pytest.mark.parametrize("value", ["a\x00b", "\x00", "trailing\x00"])
def test_nul_in_an_env_value_is_refused(value: str) -> None:
    with pytest.raises(ValidationError, match="NUL") as err:
        function(env_vars={"TOKEN": value})
    assert err.value.field == "env_vars"
    assert "TOKEN" in str(err.value)


def test_env_values_keep_newlines_and_unicode() -> None:
    assert function(env_vars={"PEM": "line1\nline2", "NAME": "é✓"}).env_vars == {"NAME": "é✓", "PEM": "line1\nline2"}


def test_env_total_size_is_bounded() -> None:
    value = "x" * ENV_MAX_VALUE
    count = ENV_MAX_TOTAL_BYTES // ENV_MAX_VALUE
    assert len(function(env_vars={f"V{i}": value for i in range(count - 1)}).env_vars) == count - 1
    with pytest.raises(ValidationError, match="in all") as err:
        function(env_vars={f"V{i}": value for i in range(count + 1)})
    assert err.value.field == "env_vars"


@pytest.mark.parametrize("env", [5, None, True, ["A"], {"A": 1}, 1.5])
def test_secret_reference_env_must_be_a_string(env: object) -> None:
    with pytest.raises(ValidationError) as err:
        function(secrets=[{"name": "db", "key": "PASSWORD", "env": env}])
    assert err.value.field == "secrets"


@pytest.mark.parametrize("env", ["", "1A", "A-B", "A\n", "PORT", "SLESS_TOKEN", "PATH", "HOME"])
def test_secret_reference_env_must_be_a_usable_name(env: str) -> None:
    with pytest.raises(ValidationError) as err:
        function(secrets=[{"name": "db", "key": "PASSWORD", "env": env}])
    assert err.value.field == "secrets"


def test_secret_reference_accepted() -> None:
    spec = function(secrets=[{"name": "db", "key": "PASSWORD", "env": "DB_PASSWORD"}])
    assert [(s.name, s.key, s.env) for s in spec.secrets] == [("db", "PASSWORD", "DB_PASSWORD")]
