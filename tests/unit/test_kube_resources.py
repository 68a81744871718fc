"""Custom resources <-> API records: what the Kubernetes backend writes and how it reads status back."""

from __future__ import annotations

from typing import Any

import pytest

from sless_api.backends.kube import resources
from sless_api.domain.errors import Conflict
from sless_core import crd
from sless_core.models import FunctionSpec, JobSpec, TriggerSpec

NS = "sless-0123456789abcdef"


def _fn_obj(spec: dict[str, Any], status: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": crd.API_VERSION, "kind": "Function",
        "metadata": {"name": "hello", "namespace": NS, "uid": "u-1", "generation": 1,
                     "creationTimestamp": "2026-01-02T03:04:05Z", **meta},
        "spec": spec,
    }
    if status is not None:
        obj["status"] = status
    return obj


def test_function_manifest_round_trips_through_the_record() -> None:
    spec = FunctionSpec.from_user({"name": "hello", "runtime": "nodejs20", "memory_mb": 256, "timeout_sec": 60,
                                   "env_vars": {"B": "2", "A": "1"},
                                   "secrets": [{"name": "db", "key": "PASSWORD", "env": "DB_PASSWORD"}]}, 900)
    body = resources.function_manifest(NS, spec)
    assert body["metadata"] == {"name": "hello", "namespace": NS,
                                "labels": {crd.LABEL_MANAGED: crd.MANAGED_BY}}
    assert body["spec"]["memoryMb"] == 256 and body["spec"]["timeoutSec"] == 60
    assert list(body["spec"]["envVars"]) == ["A", "B"]  # sorted: no needless rollouts
    record = resources.function_record(_fn_obj(body["spec"]))
    assert record.spec == spec
    assert record.namespace == NS
    assert record.created_at == 1767323045.0


def test_function_without_status_is_pending_and_says_what_it_waits_for() -> None:
    assert resources.function_record(_fn_obj({"runtime": "python3.11"})).message == resources.WAITING_FOR_CODE
    queued = resources.function_record(_fn_obj({"runtime": "python3.11", "codeHash": "a" * 64}))
    assert (queued.phase, queued.message, queued.code_hash) == ("Building", resources.WAITING_FOR_OPERATOR, "a" * 64)


def test_defaults_fill_fields_omitted_by_a_kubectl_user() -> None:
    record = resources.function_record(_fn_obj({"runtime": "go1.23"}))
    assert record.spec.entrypoint == "Handle"
    assert (record.spec.memory_mb, record.spec.timeout_sec, record.spec.env_vars) == (128, 30, {})


def test_status_fields_are_reported() -> None:
    status = {"phase": "Ready", "message": "ready", "image": "reg/x:1", "codeHash": "a" * 64,
              "lastBuiltAt": "2026-01-02T03:05:00.5Z"}
    record = resources.function_record(_fn_obj({"runtime": "python3.11", "codeHash": "a" * 64}, status))
    assert (record.phase, record.message, record.image) == ("Ready", "ready", "reg/x:1")
    assert record.last_built_at == 1767323100.5
    assert record.to_api()["last_built_at"] == "2026-01-02T03:05:00Z"


def test_a_status_about_older_code_is_not_shown_as_current() -> None:
    status = {"phase": "Ready", "message": "", "image": "reg/x:1", "codeHash": "a" * 64, "observedGeneration": 1}
    new_code = {"runtime": "python3.11", "codeHash": "b" * 64}
    record = resources.function_record(_fn_obj(new_code, status, generation=2))
    assert (record.phase, record.message) == ("Building", resources.NEW_CODE)
    assert record.image == "reg/x:1"  # the deployed version is still the old image
    # the operator has seen the new code and its build failed: Failed, though the old code still serves
    seen = {**status, "phase": "Failed", "message": "build failed: boom", "observedGeneration": 2}
    failed = resources.function_record(_fn_obj(new_code, seen, generation=2))
    assert (failed.phase, failed.message) == ("Failed", "build failed: boom")
    # a stale status about the same code (an env change) is shown as it is
    same = resources.function_record(_fn_obj({"runtime": "python3.11", "codeHash": "a" * 64}, status, generation=2))
    assert same.phase == "Ready"
    # a status without observedGeneration cannot be judged stale
    unknown = resources.function_record(_fn_obj(new_code, {"phase": "Ready", "codeHash": "a" * 64}, generation=2))
    assert unknown.phase == "Ready"


def test_unknown_phase_falls_back_to_pending() -> None:
    record = resources.function_record(_fn_obj({"runtime": "python3.11"}, {"phase": "Exploded"}))
    assert record.phase == "Pending"


def test_update_keeps_fields_the_api_does_not_model() -> None:
    spec = FunctionSpec.from_user({"name": "hello", "runtime": "python3.11", "env_vars": {"X": "1"}}, 900)
    old = {"runtime": "python3.11", "envVars": {"OLD": "1"}, "codeHash": "c" * 64, "contextKey": "k", "replicas": 2}
    new = resources.function_cr_spec(spec, old)
    assert new["envVars"] == {"X": "1"}  # replaced, not merged
    assert (new["codeHash"], new["contextKey"], new["replicas"]) == ("c" * 64, "k", 2)


def test_trigger_manifest_owned_by_its_function() -> None:
    spec = TriggerSpec.from_user({"name": "nightly", "type": "cron", "function": "hello", "schedule": "0  3 * * *"})
    body = resources.trigger_manifest(NS, spec, _fn_obj({"runtime": "python3.11"}))
    assert body["spec"] == {"type": "cron", "function": "hello", "enabled": True, "schedule": "0 3 * * *",
                            "auth": "public"}
    assert body["metadata"]["labels"][crd.LABEL_FUNCTION] == "hello"
    assert body["metadata"]["ownerReferences"] == [
        {"apiVersion": crd.API_VERSION, "kind": "Function", "name": "hello", "uid": "u-1"}]
    obj = {**body, "metadata": {**body["metadata"], "creationTimestamp": "2026-01-02T03:04:05Z"},
           "status": {"lastFiredAt": "2026-01-02T04:00:00Z", "message": "fired"}}
    record = resources.trigger_record(obj)
    assert record.spec == spec
    assert (record.message, record.last_fired_at) == ("fired", 1767326400.0)


def _job_obj(run_id: int, status: dict[str, Any] | None = None) -> dict[str, Any]:
    body = resources.job_manifest(NS, JobSpec.from_user({"name": "j", "function": "hello", "event": {"a": 1},
                                                         "run_id": run_id}), None)
    if status is not None:
        body["status"] = status
    return body


def test_job_phases_follow_run_id() -> None:
    assert "ownerReferences" not in _job_obj(1)["metadata"]
    assert _job_obj(1)["spec"] == {"function": "hello", "runId": 1, "event": {"a": 1}}
    recorded = resources.job_record(_job_obj(0))
    assert (recorded.phase, recorded.message) == ("Recorded", resources.RECORDED)
    assert resources.job_record(_job_obj(1)).phase == "Pending"
    done = {"phase": "Succeeded", "message": "42", "runId": 1, "startTime": "2026-01-02T03:04:05Z",
            "completionTime": "2026-01-02T03:04:06Z"}
    record = resources.job_record(_job_obj(1, done))
    assert (record.phase, record.message, record.started_at, record.completed_at) == (
        "Succeeded", "42", 1767323045.0, 1767323046.0)
    rerun = resources.job_record(_job_obj(2, done))  # the status still describes run 1
    assert (rerun.phase, rerun.message, rerun.started_at, rerun.completed_at) == ("Pending", "", None, None)


def test_setting_a_limit_back_to_none_drops_it_from_the_spec() -> None:
    spec = FunctionSpec.from_user({"name": "hello", "runtime": "python3.11", "max_concurrency": 0}, 900)
    assert "maxConcurrency" not in resources.function_cr_spec(spec, {"runtime": "python3.11", "maxConcurrency": 5})


def test_an_object_the_codec_refuses_is_a_conflict_when_read_and_left_out_of_lists() -> None:
    bad = _fn_obj({"runtime": "go1.23", "entrypoint": "handler.handle"})  # kubectl let it through; Go needs Handle
    with pytest.raises(Conflict) as err:
        resources.function_record(bad)
    assert "'hello' is invalid as stored" in err.value.message and "spec.entrypoint" in err.value.message
    assert err.value.details == {"field": "spec.entrypoint"}
    good = _fn_obj({"runtime": "go1.23"}, name="fine")
    assert [r.spec.name for r in resources.function_records([bad, good])] == ["fine"]
    trigger = {"metadata": {"name": "t", "namespace": NS}, "spec": {"type": "cron", "function": "hello"}}
    with pytest.raises(Conflict, match=r"spec\.schedule"):
        resources.trigger_record(trigger)
    assert resources.trigger_records([trigger]) == []
    job = {"metadata": {"name": "j", "namespace": NS}, "spec": {"function": "hello", "runId": -1}}
    with pytest.raises(Conflict, match=r"spec\.runId"):
        resources.job_record(job)
    assert resources.job_records([job]) == []
