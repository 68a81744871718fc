"""The shared resource model: what the API accepts and what the operator builds from."""

from __future__ import annotations

import pytest

from sless_core.errors import ValidationError
from sless_core.models import FunctionSpec, JobSpec, TriggerSpec, validate_cron
from sless_core.naming import tenant_namespace, validate_name


def test_tenant_namespace_vector() -> None:
    assert tenant_namespace("019cc268-6c6a-781e-8613-4bed4ec7cd20") == "sless-ffd1f598c169b0ae"


@pytest.mark.parametrize("name", ["a", "hello-world", "x1", "a" * 40])
def test_valid_names(name: str) -> None:
    assert validate_name(name) == name


@pytest.mark.parametrize("name", ["", "A", "-a", "a-", "a_b", "a.b", "a" * 41, None, 5, "é"])
def test_invalid_names(name: object) -> None:
    with pytest.raises(ValidationError):
        validate_name(name)


def test_function_defaults_and_sorted_env() -> None:
    spec = FunctionSpec.from_user({"name": "f", "runtime": "go1.23", "env_vars": {"B": "2", "A": "1"}}, 900)
    assert (spec.entrypoint, spec.memory_mb, spec.timeout_sec) == ("Handle", 128, 30)
    assert list(spec.env_vars) == ["A", "B"]


def test_timeout_bound_follows_configuration() -> None:
    FunctionSpec.from_user({"name": "f", "runtime": "nodejs20", "timeout_sec": 900}, 900)
    with pytest.raises(ValidationError) as err:
        FunctionSpec.from_user({"name": "f", "runtime": "nodejs20", "timeout_sec": 120}, 60)
    assert err.value.field == "timeout_sec"


@pytest.mark.parametrize("env", [{"SLESS_X": "1"}, {"PORT": "1"}, {"PATH": "/x"}, {"A-B": "1"}, {"A": 1}])
def test_reserved_or_bad_env_vars(env: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        FunctionSpec.from_user({"name": "f", "runtime": "python3.11", "env_vars": env}, 900)


@pytest.mark.parametrize("name", ["GOFLAGS", "goflags", "GOPROXY", "GONOSUMDB", "GOTOOLCHAIN", "GOENV", "GOCACHEPROG",
                                  "CGO_ENABLED", "CGO_LDFLAGS", "CC", "PIP_INDEX_URL", "pip_extra_index_url",
                                  "npm_config_registry", "NPM_CONFIG_SCRIPT_SHELL", "Npm_Config_Ignore_Scripts"])
def test_toolchain_env_vars_are_refused_by_name(name: str) -> None:
    """A function's variables are the tenant's input too: none may name a build tool's setting (GOFLAGS could
    carry -toolexec=<program>), in any spelling."""
    with pytest.raises(ValidationError, match="configures the build toolchain") as err:
        FunctionSpec.from_user({"name": "f", "runtime": "go1.23", "env_vars": {name: "-toolexec=/bin/sh"}}, 900)
    assert err.value.field == "env_vars"


@pytest.mark.parametrize("name", ["LD_SHOW_AUXV", "LD_DYNAMIC_WEAK", "LD_TRACE_LOADED_OBJECTS", "LD_BIND_NOW"])
def test_loader_flags_are_refused_by_name(name: str) -> None:
    """Set at all, these change what bwrap (outside the sandbox) does: emptying them, as the launch does with the
    loader's other variables, would not help."""
    with pytest.raises(ValidationError, match="changes how the platform's own processes load"):
        FunctionSpec.from_user({"name": "f", "runtime": "python3.11", "env_vars": {name: ""}}, 900)


@pytest.mark.parametrize("name", ["GOGC", "GOMAXPROCS", "GOMEMLIMIT", "GODEBUG", "GOTRACEBACK", "GOOGLE_KEY", "GOAL",
                                  "PIPELINE", "NPM_TOKEN_NAME", "CCACHE"])
def test_runtime_and_lookalike_env_vars_stay_allowed(name: str) -> None:
    spec = FunctionSpec.from_user({"name": "f", "runtime": "go1.23", "env_vars": {name: "1"}}, 900)
    assert spec.env_vars == {name: "1"}


def test_update_resets_default_entrypoint_when_runtime_changes() -> None:
    spec = FunctionSpec.from_user({"name": "f", "runtime": "python3.11"}, 900)
    assert spec.updated({"runtime": "go1.23"}, 900).entrypoint == "Handle"
    custom = FunctionSpec.from_user({"name": "f", "runtime": "python3.11", "entrypoint": "main.run"}, 900)
    with pytest.raises(ValidationError):
        custom.updated({"runtime": "go1.23"}, 900)  # main.run is no Go function name
    with pytest.raises(ValidationError):
        spec.updated({"name": "other"}, 900)


@pytest.mark.parametrize("schedule", ["* * * * *", "*/5 0-6 * * 1-5", "0 12 1 jan mon", "  0   3 * * *  "])
def test_valid_cron(schedule: str) -> None:
    assert validate_cron(schedule) == " ".join(schedule.split())


@pytest.mark.parametrize("schedule", ["", "* * * *", "* * * * * *", "61 * * * *", "@every 5s", "a b c d e", 5])
def test_invalid_cron(schedule: object) -> None:
    with pytest.raises(ValidationError) as err:
        validate_cron(schedule)
    assert err.value.field == "schedule"


def test_trigger_patch_keeps_identity() -> None:
    trig = TriggerSpec.from_user({"name": "t", "type": "cron", "function": "f", "schedule": "* * * * *"})
    assert trig.patched({"enabled": False}).enabled is False
    with pytest.raises(ValidationError):
        trig.patched({"type": "http"})
    with pytest.raises(ValidationError):
        TriggerSpec.from_user({"name": "t", "type": "http", "function": "f", "schedule": "* * * * *"})


def test_job_event_limits() -> None:
    assert JobSpec.from_user({"name": "j", "function": "f"}).run_id == 1
    with pytest.raises(ValidationError):
        JobSpec.from_user({"name": "j", "function": "f", "event": {"x": "y" * 200_000}})
    with pytest.raises(ValidationError):
        JobSpec.from_user({"name": "j", "function": "f", "run_id": True})
