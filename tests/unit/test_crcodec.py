"""The custom resources' one codec: round trips, defaults, and every malformed shape as a clear error."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from sless_core import crd
from sless_core.crcodec import (
    FunctionCode,
    FunctionResource,
    InvalidResource,
    JobResource,
    Meta,
    TriggerResource,
    function_spec_to_cr,
    job_spec_to_cr,
    key_of,
    manifest,
    parse_time,
    trigger_spec_to_cr,
)
from sless_core.models import FunctionSpec, JobPhase, JobSpec, Phase, SecretRef, TriggerSpec

NS = "sless-0123456789abcdef"
HASH = "a" * 64


def obj(kind: str, spec: object, status: object = None, name: str = "hello", **meta: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": crd.API_VERSION, "kind": kind,
                            "metadata": {"name": name, "namespace": NS, "uid": "u-1", "generation": 3,
                                         "creationTimestamp": "2026-01-02T03:04:05Z", **meta},
                            "spec": spec}  # fmt: skip
    if status is not None:
        body["status"] = status
    return body


def fn(spec: object, status: object = None, **meta: Any) -> dict[str, Any]:
    return obj("Function", spec, status, **meta)


# -- Function --------------------------------------------------------------------------------------


def test_a_function_round_trips_with_the_wire_format_unchanged() -> None:
    spec = FunctionSpec.from_user({"name": "hello", "runtime": "nodejs20", "memory_mb": 256, "timeout_sec": 60,
                                   "env_vars": {"B": "2", "A": "1"}, "max_concurrency": 4,
                                   "secrets": [{"name": "db", "key": "PASSWORD", "env": "DB_PASSWORD"},
                                               {"name": "tls", "key": "tls.key", "file": "key.pem"}]}, 900)
    wire = function_spec_to_cr(spec)
    assert wire == {"runtime": "nodejs20", "entrypoint": "handler.handle", "memoryMb": 256, "timeoutSec": 60,
                    "envVars": {"A": "1", "B": "2"}, "maxConcurrency": 4,
                    "secrets": [{"name": "db", "key": "PASSWORD", "env": "DB_PASSWORD"},
                                {"name": "tls", "key": "tls.key", "file": "key.pem"}]}  # fmt: skip
    assert list(wire["envVars"]) == ["A", "B"]  # sorted: no needless rollouts
    code = FunctionCode(code_hash=HASH, code_key=f"code/{NS}/hello/1.tar.gz", code_sha256="b" * 64,
                        context_key=f"contexts/{NS}/hello/1.tar.gz", context_sha256="c" * 64, deps_hash="d" * 64)
    full = wire | code.to_cr() | {crd.SECRETS_VERSION: "e" * 64, "replicas": 3}
    decoded = FunctionResource.from_cr(fn(full))
    assert decoded.spec == spec and decoded.code == code
    assert (decoded.secrets_version, decoded.replicas) == ("e" * 64, 3)
    assert decoded.meta == Meta(NS, "hello", "u-1", 3, 1767323045.0)
    assert decoded.spec_to_cr() == full


def test_function_defaults_are_applied_once() -> None:
    decoded = FunctionResource.from_cr(fn({"runtime": "go1.23"}))
    assert decoded.spec == FunctionSpec("hello", "go1.23", "Handle", 128, 30, {}, [], 0)
    assert (decoded.code, decoded.secrets_version, decoded.replicas) == (FunctionCode(), "", 1)
    assert decoded.status.phase is None and decoded.status.versions == ()
    # what the API writes for it: every user field, no code, the default replica count left to the CRD
    assert decoded.spec_to_cr() == {"runtime": "go1.23", "entrypoint": "Handle", "memoryMb": 128, "timeoutSec": 30,
                                    "envVars": {}, "secrets": []}
    # a JSON null is a field left out
    nulls = FunctionResource.from_cr(fn({"runtime": "python3.11", "entrypoint": None, "codeHash": None}))
    assert (nulls.spec.entrypoint, nulls.code.code_hash) == ("handler.handle", "")


def test_function_status_is_read_defensively() -> None:
    status = {"phase": "Ready", "message": "ready", "image": "reg/x:1", "codeHash": HASH,
              "lastBuiltAt": "2026-01-02T03:05:00.5Z", "observedGeneration": 2}
    decoded = FunctionResource.from_cr(fn({"runtime": "python3.11"}, status)).status
    assert (decoded.phase, decoded.message, decoded.image, decoded.code_hash) == (Phase.READY, "ready", "reg/x:1", HASH)
    assert (decoded.last_built_at, decoded.observed_generation) == (1767323100.5, 2)
    odd = {"phase": "Exploded", "message": 5, "image": ["x"], "lastBuiltAt": "yesterday", "observedGeneration": "2",
           "versions": "many"}
    decoded = FunctionResource.from_cr(fn({"runtime": "python3.11"}, odd)).status
    assert (decoded.phase, decoded.message, decoded.image, decoded.last_built_at) == (None, "", "", None)
    assert (decoded.observed_generation, decoded.versions) == (None, ())
    assert FunctionResource.from_cr(fn({"runtime": "python3.11"}, "broken")).status.phase is None
    assert FunctionResource.from_cr(fn({"runtime": "python3.11"}, {"phase": ["Ready"]})).status.phase is None


def test_function_versions_decode_oldest_first_and_skip_what_could_not_be_deployed() -> None:
    one = {"version": 1, "codeHash": HASH, "deployedAt": "2026-01-02T03:04:05Z",
           "spec": {"runtime": "python3.11", "envVars": {"A": "1"}, "codeKey": f"code/{NS}/hello/1.tar.gz",
                    "codeSha256": "b" * 64}}
    two = {"version": 2, "codeHash": "f" * 64, "spec": {"runtime": "go1.23"}}
    bad = [{"version": "3", "spec": {"runtime": "go1.23"}}, {"version": 4, "spec": {"runtime": "cobol"}},
           {"version": 5}, {"version": 6, "spec": {"runtime": "go1.23", "codeKey": "code/other/x/1.tar.gz"}}, "x"]
    versions = FunctionResource.from_cr(fn({"runtime": "python3.11"}, {"versions": [two, *bad, one]})).status.versions
    assert [v.version for v in versions] == [1, 2]
    assert versions[0].spec.env_vars == {"A": "1"} and versions[0].code.code_key == f"code/{NS}/hello/1.tar.gz"
    assert (versions[0].code_hash, versions[0].deployed_at, versions[1].deployed_at) == (HASH, 1767323045.0, None)


@pytest.mark.parametrize(("body", "path", "words"), [
    ({"metadata": {"name": "x", "namespace": NS}}, "spec", "spec must be an object"),
    (fn(None), "spec", "spec must be an object"),
    (fn(["runtime"]), "spec", "spec must be an object"),
    (fn({}), "spec.runtime", "spec.runtime must be one of"),
    (fn({"runtime": "cobol"}), "spec.runtime", "spec.runtime must be one of"),
    (fn({"runtime": 3}), "spec.runtime", "must be one of"),
    (fn({"runtime": "python3.11", "memoryMb": "128"}), "spec.memoryMb", "spec.memoryMb must be an integer"),
    (fn({"runtime": "python3.11", "memoryMb": True}), "spec.memoryMb", "must be an integer"),
    (fn({"runtime": "python3.11", "memoryMb": 9000}), "spec.memoryMb", "between 64 and 8192"),
    (fn({"runtime": "python3.11", "timeoutSec": 3601}), "spec.timeoutSec", "between 1 and 3600"),
    (fn({"runtime": "python3.11", "maxConcurrency": -1}), "spec.maxConcurrency", "between 0 and 1000"),
    (fn({"runtime": "python3.11", "envVars": ["A"]}), "spec.envVars", "must be an object"),
    (fn({"runtime": "python3.11", "envVars": {"PORT": "1"}}), "spec.envVars", "spec.envVars: environment variable"),
    (fn({"runtime": "python3.11", "envVars": {"A": 1}}), "spec.envVars", "spec.envVars[A] must be a string"),
    (fn({"runtime": "go1.23", "entrypoint": "handler.handle"}), "spec.entrypoint", "Go function name"),
    (fn({"runtime": "python3.11", "entrypoint": 5}), "spec.entrypoint", "module.function"),
    (fn({"runtime": "python3.11", "secrets": {"name": "db"}}), "spec.secrets", "must be a list"),
    (fn({"runtime": "python3.11", "secrets": [{"name": "db", "key": "K"}]}), "spec.secrets", "{name, key, env}"),
    (fn({"runtime": "python3.11", "secrets": [{"name": "DB", "key": "K", "env": "X"}]}), "spec.secrets",
     "DNS-1123"),
    (fn({"runtime": "python3.11", "replicas": 101}), "spec.replicas", "between 0 and 100"),
    (fn({"runtime": "python3.11", "replicas": "2"}), "spec.replicas", "integer"),
    (fn({"runtime": "python3.11", "codeHash": "XYZ"}), "spec.codeHash", "64 lowercase hex"),
    (fn({"runtime": "python3.11", "codeHash": 7}), "spec.codeHash", "must be a string"),
    (fn({"runtime": "python3.11", "depsHash": "A" * 64}), "spec.depsHash", "64 lowercase hex"),
    (fn({"runtime": "python3.11", "contextKey": "k" * 1025}), "spec.contextKey", "at most 1024"),
    (fn({"runtime": "python3.11", "contextKey": f"contexts/sless-{'f' * 16}/hello/1.tar.gz"}), "spec.contextKey",
     "its own build context"),
    (fn({"runtime": "python3.11", "codeKey": f"code/{NS}/other/1.tar.gz", "codeSha256": HASH}), "spec.codeKey",
     "its own code"),
    (fn({"runtime": "python3.11", "codeKey": f"code/{NS}/hello/1.tar.gz"}), "spec.codeSha256", "codeSha256"),
    (fn({"runtime": "python3.11", crd.SECRETS_VERSION: "nothex"}), "spec.secretsVersion", "hex"),
    (fn({"runtime": "python3.11"}, name="a.b"), "metadata.name", "metadata.name must be a DNS-1123 label"),
    (fn({"runtime": "python3.11"}, name="a" * 41), "metadata.name", "at most 40"),
    (fn({"runtime": "python3.11"}, name=5), "metadata.name", "metadata.name is required"),
    (fn({"runtime": "python3.11"}, namespace=None), "metadata.namespace", "required"),
    ({"spec": {"runtime": "python3.11"}}, "metadata", "metadata must be an object"),
    ("not an object", "the object", "must be an object"),
])  # fmt: skip
def test_a_malformed_function_is_a_clear_error(body: object, path: str, words: str) -> None:
    with pytest.raises(InvalidResource) as err:
        FunctionResource.from_cr(body)
    assert err.value.field == path
    assert words in err.value.message


# -- Trigger ---------------------------------------------------------------------------------------


def test_a_trigger_round_trips_with_defaults_applied() -> None:
    spec = TriggerSpec.from_user({"name": "nightly", "type": "cron", "function": "hello", "schedule": "0  3 * * *"})
    wire = trigger_spec_to_cr(spec)
    assert wire == {"type": "cron", "function": "hello", "enabled": True, "schedule": "0 3 * * *", "auth": "public"}
    body = obj("Trigger", wire, {"message": "fired", "lastFiredAt": "2026-01-02T04:00:00Z"}, name="nightly")
    decoded = TriggerResource.from_cr(body)
    assert decoded.spec == spec and decoded.spec_to_cr() == wire
    assert (decoded.status.message, decoded.status.last_fired_at) == ("fired", 1767326400.0)
    # what kubectl users leave out
    minimal = TriggerResource.from_cr(obj("Trigger", {"type": "http", "function": "hello"}, name="web"))
    assert (minimal.spec.enabled, minimal.spec.auth, minimal.spec.schedule) == (True, "public", None)
    event = TriggerResource.from_cr(obj("Trigger", {"type": "event", "function": "hello", "queue": "q.1",
                                                    "enabled": False}, name="ev"))  # fmt: skip
    assert (event.spec.queue, event.spec.enabled, event.spec.delivery) == ("q.1", False, None)
    redone = TriggerResource.from_cr(obj("Trigger", {"type": "event", "function": "hello", "queue": "q.1",
                                                     "delivery": "at_least_once"}, name="ev"))  # fmt: skip
    assert redone.spec.delivery == "at_least_once" and redone.spec_to_cr()["delivery"] == "at_least_once"


@pytest.mark.parametrize(("spec", "path", "words"), [
    (None, "spec", "must be an object"),
    ({"function": "hello"}, "spec.type", "spec.type must be one of"),
    ({"type": "smtp", "function": "hello"}, "spec.type", "must be one of"),
    ({"type": "http"}, "spec.function", "spec.function is required"),
    ({"type": "http", "function": "Hello"}, "spec.function", "DNS-1123"),
    ({"type": "http", "function": "hello", "enabled": "yes"}, "spec.enabled", "true or false"),
    ({"type": "http", "function": "hello", "auth": "basic"}, "spec.auth", "public or token"),
    ({"type": "cron", "function": "hello"}, "spec.schedule", "spec.schedule is required"),
    ({"type": "cron", "function": "hello", "schedule": "every day"}, "spec.schedule", "5-field cron"),
    ({"type": "event", "function": "hello"}, "spec.queue", "spec.queue is required"),
    ({"type": "event", "function": "hello", "queue": "a b"}, "spec.queue", "[A-Za-z0-9_.:-]"),
    ({"type": "http", "function": "hello", "queue": "q"}, "spec.queue", "only to event triggers"),
    ({"type": "event", "function": "hello", "queue": "q", "delivery": "exactly_once"}, "spec.delivery",
     "at_most_once or at_least_once"),
    ({"type": "http", "function": "hello", "delivery": "at_least_once"}, "spec.delivery", "only to event triggers"),
])  # fmt: skip
def test_a_malformed_trigger_is_a_clear_error(spec: object, path: str, words: str) -> None:
    with pytest.raises(InvalidResource) as err:
        TriggerResource.from_cr(obj("Trigger", spec, name="web"))
    assert err.value.field == path
    assert words in err.value.message


# -- FunctionJob -----------------------------------------------------------------------------------


def test_a_job_round_trips_with_defaults_applied() -> None:
    spec = JobSpec.from_user({"name": "j", "function": "hello", "event": {"a": 1}, "run_id": 0})
    wire = job_spec_to_cr(spec)
    assert wire == {"function": "hello", "runId": 0, "event": {"a": 1}}
    done = {"phase": "Succeeded", "message": "42", "runId": 0, "startTime": "2026-01-02T03:04:05Z",
            "completionTime": "2026-01-02T03:04:06Z"}
    decoded = JobResource.from_cr(obj("FunctionJob", wire, done, name="j"))
    assert decoded.spec == spec and decoded.spec_to_cr() == wire
    assert (decoded.status.phase, decoded.status.message, decoded.status.run_id) == (JobPhase.SUCCEEDED, "42", 0)
    assert (decoded.status.started_at, decoded.status.completed_at) == (1767323045.0, 1767323046.0)
    minimal = JobResource.from_cr(obj("FunctionJob", {"function": "hello", "event": None}, {"phase": "Done"}))
    assert (minimal.spec.run_id, minimal.spec.event, minimal.status.phase) == (1, {}, None)
    odd = JobResource.from_cr(obj("FunctionJob", {"function": "hello"}, {"phase": {"x": 1}, "runId": True}))
    assert (odd.status.phase, odd.status.run_id) == (None, None)


@pytest.mark.parametrize(("spec", "path", "words"), [
    (None, "spec", "must be an object"),
    ({}, "spec.function", "spec.function is required"),
    ({"function": "hello", "runId": -1}, "spec.runId", "spec.runId must be between 0"),
    ({"function": "hello", "runId": 2**31}, "spec.runId", "between 0 and"),
    ({"function": "hello", "runId": "1"}, "spec.runId", "must be an integer"),
    ({"function": "hello", "event": [1]}, "spec.event", "spec.event must be a JSON object"),
    ({"function": "hello", "event": {"x": "y" * 110_000}}, "spec.event", "at most"),
])  # fmt: skip
def test_a_malformed_job_is_a_clear_error(spec: object, path: str, words: str) -> None:
    with pytest.raises(InvalidResource) as err:
        JobResource.from_cr(obj("FunctionJob", spec, name="j"))
    assert err.value.field == path
    assert words in err.value.message


# -- shared pieces ---------------------------------------------------------------------------------


def test_decoding_never_changes_the_object() -> None:
    body = fn({"runtime": "python3.11", "envVars": {"B": "1", "A": "2"}, "secrets": [
        {"name": "db", "key": "K", "env": "X"}]}, {"versions": [{"version": 1, "spec": {"runtime": "go1.23"}}]})
    before = copy.deepcopy(body)
    decoded = FunctionResource.from_cr(body)
    assert body == before
    assert decoded.spec.secrets == [SecretRef("db", "K", "X")]


def test_manifest_and_identity() -> None:
    spec = JobSpec.from_user({"name": "j", "function": "hello"})
    owner = {"apiVersion": crd.API_VERSION, "kind": "Function", "name": "hello", "uid": "u"}
    body = manifest("FunctionJob", NS, "j", job_spec_to_cr(spec), {"a": "b"}, [owner])
    assert body == {"apiVersion": crd.API_VERSION, "kind": "FunctionJob",
                    "metadata": {"name": "j", "namespace": NS, "labels": {"a": "b"}, "ownerReferences": [owner]},
                    "spec": {"function": "hello", "runId": 1, "event": {}}}  # fmt: skip
    assert "labels" not in manifest("FunctionJob", NS, "j", {})["metadata"]
    assert key_of(body) == (NS, "j")
    for nameless in ({"metadata": {}}, {"metadata": "x"}, {}, [], {"metadata": {"name": "j", "namespace": 1}}):
        assert key_of(nameless) is None


def test_parse_time_is_lenient() -> None:
    assert parse_time(None) is None
    assert parse_time("yesterday") is None
    assert parse_time("2026-01-02T03:04:05+00:00") == 1767323045.0


ODD_VALUES: list[object] = [None, 0, -1, 2**40, True, 1.5, "", "x" * 2000, "Ready", [], [1], ["a"], {}, {"a": []},
                            {"name": 1, "key": None}, [{"name": "db"}], [{}], [None]]
FULL = {
    "Function": {"runtime": "python3.11", "entrypoint": "main.run", "memoryMb": 256, "timeoutSec": 60,
                 "maxConcurrency": 2, "envVars": {"A": "1"}, "secrets": [{"name": "db", "key": "K", "env": "X"}],
                 crd.SECRETS_VERSION: "e" * 64, "codeHash": HASH, "contextKey": f"contexts/{NS}/hello/1.tar.gz",
                 "contextSha256": HASH, "codeKey": f"code/{NS}/hello/1.tar.gz", "codeSha256": HASH, "depsHash": HASH,
                 "replicas": 2},
    "Trigger": {"type": "cron", "function": "hello", "enabled": True, "auth": "token", "schedule": "0 3 * * *"},
    "FunctionJob": {"function": "hello", "runId": 2, "event": {"a": 1}},
}  # fmt: skip
STATUS = {"phase": "Ready", "message": "m", "image": "i", "codeHash": HASH, "lastBuiltAt": "2026-01-02T03:04:05Z",
          "observedGeneration": 1, "runId": 1, "startTime": "2026-01-02T03:04:05Z", "lastFiredAt": "x",
          "versions": [{"version": 1, "codeHash": HASH, "spec": {"runtime": "go1.23"}}]}  # fmt: skip
DECODERS = {"Function": FunctionResource.from_cr, "Trigger": TriggerResource.from_cr,
            "FunctionJob": JobResource.from_cr}


def _variants(kind: str) -> list[dict[str, Any]]:
    """Every field of a full object (spec, status, metadata, the versions' specs) replaced by each odd value."""
    base = obj(kind, dict(FULL[kind]), dict(STATUS))
    out = []
    for value in ODD_VALUES:
        for key in [*FULL[kind], "envVars.A", "secrets.0"]:
            body = copy.deepcopy(base)
            if key in ("envVars.A", "secrets.0"):
                if kind != "Function":
                    continue
                outer, inner = key.split(".")
                body["spec"][outer][int(inner) if inner.isdigit() else inner] = value
            else:
                body["spec"][key] = value
            out.append(body)
        for section in ("status", "metadata"):
            for key in [*base[section], "versions"] if section == "status" else list(base[section]):
                body = copy.deepcopy(base)
                body[section][key] = value
                out.append(body)
        for top in ("spec", "status", "metadata"):
            body = copy.deepcopy(base)
            body[top] = value
            out.append(body)
        body = copy.deepcopy(base)
        body["status"]["versions"] = [{"version": 1, "spec": {**FULL["Function"], "runtime": value}}, value]
        out.append(body)
    return out


@pytest.mark.parametrize("kind", sorted(FULL))
def test_no_shape_crashes_the_codec(kind: str) -> None:
    """Each odd value in each place: decoded, or refused with InvalidResource; never another exception."""
    decode = DECODERS[kind]
    assert decode(obj(kind, FULL[kind], STATUS)) is not None  # the full object itself is valid
    refused = 0
    for body in _variants(kind):
        try:
            decode(body)
        except InvalidResource as exc:
            refused += 1
            assert exc.field and exc.message
    assert refused > 50


# -- versions side by side -------------------------------------------------------------------------


def test_fields_a_newer_version_wrote_are_ignored_not_refused() -> None:
    """A rolling upgrade or a rollback runs versions side by side: an older reader skips what it does not know
    (top-level fields, keys of spec.scale) and reads the rest as it would without them."""
    base = {"runtime": "python3.11", "memoryMb": 256, "scale": {"min": 0, "max": 4}}
    plain = FunctionResource.from_cr(fn(base))
    newer = FunctionResource.from_cr(fn({**base, "futureField": {"x": 1}, "scale": {"min": 0, "max": 4,
                                                                                    "burst": 9}}))  # fmt: skip
    assert newer.spec == plain.spec and newer.spec_to_cr() == plain.spec_to_cr()
    assert "futureField" not in newer.spec_to_cr()
    trigger = {"type": "http", "function": "hello"}
    assert (TriggerResource.from_cr(obj("Trigger", {**trigger, "rateLimit": 5}, name="web")).spec
            == TriggerResource.from_cr(obj("Trigger", trigger, name="web")).spec)
    job = {"function": "hello", "runId": 2}
    assert (JobResource.from_cr(obj("FunctionJob", {**job, "priority": "high"}, name="j")).spec
            == JobResource.from_cr(obj("FunctionJob", job, name="j")).spec)
