"""The custom resources (Function, Trigger, FunctionJob) as typed values: their one codec.

The API (records, the invoke proxy's route table), the event dispatcher and the operator all read
these objects; each decoding them its own way let a rule (a default, a bound, which fields exist)
drift between what one component shows and what another builds. Here a resource is decoded once:

- ``spec`` is validated by the platform's own rules (``sless_core.models``: the same
  ``*.from_user`` the API applies to a request), with the defaults applied, plus the fields only
  the custom resources carry (code keys and digests, replicas). Anything malformed (no spec, a wrong
  type, an unknown runtime, a bad name) raises :class:`InvalidResource` naming the field by
  its path in the object (``spec.memoryMb``): never a ``KeyError`` or ``TypeError``. The CRD schema
  catches most of it at the API server; the rest (reserved environment names, entrypoints per
  runtime, names too long for our child objects, code keys outside the function's own prefix) can
  only be caught here, and such a spec could never work. A field this version does not know is ignored, not
  refused: a newer version may have written it during a rolling upgrade or before a rollback (``_known_only``).
- ``status`` is written by the operator and read defensively: a field of the wrong type, or a phase
  this version does not know, reads as absent, since an older or newer operator may have written it.

``to_cr`` writes the wire format the CRDs define (``charts/sless/crds``), unchanged: camelCase keys,
environment variables sorted (no needless rollouts), optional fields only when set.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, TypeVar

from sless_core import crd
from sless_core.errors import ValidationError
from sless_core.models import FunctionSpec, JobPhase, JobSpec, Phase, ScaleSpec, TriggerSpec
from sless_core.traffic import TrafficSplit, parse_entries

#: The CRD's bound on ``timeoutSec``; the API applies the installation's own (lower) maximum to requests.
MAX_TIMEOUT_SEC = 3600
MAX_REPLICAS = 100
MAX_KEY_LENGTH = 1024
HEX64 = re.compile(r"[0-9a-f]{64}")
#: the Function's spec key of a traffic split (``sless_core.traffic``)
TRAFFIC = "traffic"
SECRETS_VERSION = re.compile(r"[0-9a-f]{0,64}")


Choice = TypeVar("Choice", bound=StrEnum)


class InvalidResource(ValidationError):
    """A custom resource the platform cannot use as written; ``field`` is the path in the object."""


# -- shared pieces ---------------------------------------------------------------------------------


def parse_time(value: object) -> float | None:
    """Seconds since the epoch of an RFC 3339 timestamp (``...Z``, fractions allowed); None if absent or bad."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _object(value: object, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidResource(f"{path} must be an object", field=path)
    return value


def _section(obj: dict[str, Any], key: str) -> dict[str, Any]:
    """A part read defensively (status): not an object reads as empty."""
    value = obj.get(key)
    return value if isinstance(value, dict) else {}


def _str(section: dict[str, Any], key: str) -> str:
    value = section.get(key)
    return value if isinstance(value, str) else ""


def _int(section: dict[str, Any], key: str) -> int | None:
    value = section.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _enum(kind: type[Choice], value: object) -> Choice | None:
    """VALUE as a member of KIND; None for anything else (a phase another version writes, a wrong type)."""
    return kind._value2member_map_.get(value) if isinstance(value, str) else None  # type: ignore[return-value]


def _given(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec's fields that are set: a JSON null is the field left out (as ``kubectl apply`` reads it)."""
    return {k: v for k, v in spec.items() if v is not None}


def _known_only(spec: dict[str, Any], known: frozenset[str]) -> dict[str, Any]:
    """The spec without the fields this version does not know. Forward compatible: a newer API or CRD may write a
    field an older operator or API still running beside it (a rolling upgrade, a rollback) has never heard of;
    reading the rest keeps the resource working there instead of failing it. A request's unknown field is still a
    400 (``models``: the API checks what users send), and the CRD's schema prunes what no version declares."""
    return {k: v for k, v in spec.items() if k in known}


def _reworded(exc: ValidationError, paths: dict[str, str]) -> InvalidResource:
    """A model's error about a snake_case field, reworded to name the field as the custom resource does."""
    name = (exc.field or "").split(".")[0]
    path = paths.get(name, f"spec.{exc.field}" if exc.field else "spec")
    message = exc.message
    if name and message.startswith(name):
        message = path + message[len(name):]
    elif not message.startswith(path):
        message = f"{path}: {message}"
    return InvalidResource(message, field=path)


@dataclass(frozen=True)
class Meta:
    """The metadata every component uses: identity, generation, creation time."""

    namespace: str
    name: str
    uid: str = ""
    generation: int = 0
    created_at: float | None = None
    resource_version: str = ""

    @classmethod
    def from_cr(cls, obj: object) -> Meta:
        meta = _object(_object(obj, "the object").get("metadata"), "metadata")
        for key in ("namespace", "name"):
            if not isinstance(meta.get(key), str) or not meta[key]:
                raise InvalidResource(f"metadata.{key} is required and must be a string", field=f"metadata.{key}")
        return cls(namespace=meta["namespace"], name=meta["name"], uid=_str(meta, "uid"),
                   generation=_int(meta, "generation") or 0, created_at=parse_time(meta.get("creationTimestamp")),
                   resource_version=_str(meta, "resourceVersion"))  # fmt: skip


def key_of(obj: object) -> tuple[str, str] | None:
    """(namespace, name) of any object, or None when it has no identity (nothing else is checked)."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return None
    ns, name = meta.get("namespace"), meta.get("name")
    return (ns, name) if isinstance(ns, str) and isinstance(name, str) else None


def manifest(kind: str, namespace: str, name: str, spec: dict[str, Any], labels: dict[str, str] | None = None,
             owners: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A new custom resource of KIND (``Function``, ``Trigger``, ``FunctionJob``) with SPEC (from ``spec_to_cr``)."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels is not None:
        metadata["labels"] = dict(labels)
    if owners:
        metadata["ownerReferences"] = list(owners)
    return {"apiVersion": crd.API_VERSION, "kind": kind, "metadata": metadata, "spec": spec}


# -- Function --------------------------------------------------------------------------------------

#: The Function spec's fields the user sets (``FunctionSpec``): CR key -> model field.
FUNCTION_USER_FIELDS = {"runtime": "runtime", "entrypoint": "entrypoint", "memoryMb": "memory_mb",
                        "timeoutSec": "timeout_sec", "envVars": "env_vars", "secrets": "secrets",
                        "maxConcurrency": "max_concurrency", "sandbox": "sandbox", "scale": "scale"}  # fmt: skip
_FUNCTION_PATHS = {model: f"spec.{cr}" for cr, model in FUNCTION_USER_FIELDS.items()} | {"name": "metadata.name"}


def own_context_key(namespace: str, name: str, key: str) -> bool:
    """Whether KEY lies under the Function's own prefix (the API's layout, ``contexts/<ns>/<fn>/<file>``):
    a Function can never have another tenant's (or another function's) code built."""
    prefix = f"contexts/{namespace}/{name}/"
    rest = key.removeprefix(prefix)
    return (key.startswith(prefix) and bool(rest) and "/" not in rest and "\\" not in rest
            and not rest.startswith(".") and rest.isprintable())  # fmt: skip


def own_code_key(namespace: str, name: str, key: str) -> bool:
    """Whether KEY is one of the Function's own code archives (``code/<ns>/<fn>/<file>``)."""
    return own_context_key(namespace, name, "contexts/" + key.removeprefix("code/")) and key.startswith("code/")


@dataclass(frozen=True)
class FunctionCode:
    """Where a Function's code is and what it must hash to: set by the API, read by the operator.

    ``code_hash`` names the uploaded code; ``context_key`` the build context in S3 (a Dockerfile
    build); ``code_key`` the archive pods fetch at start (then ``code_sha256`` is required);
    ``deps_hash`` the dependency image's key (``sless_core.rebuild``). Empty: not set.
    """

    code_hash: str = ""
    context_key: str = ""
    context_sha256: str = ""
    code_key: str = ""
    code_sha256: str = ""
    deps_hash: str = ""

    #: CR key -> field, in the order they are written
    CR_KEYS = {"codeHash": "code_hash", "contextKey": "context_key", "contextSha256": "context_sha256",
               "codeKey": "code_key", "codeSha256": "code_sha256", "depsHash": "deps_hash"}  # fmt: skip
    DIGESTS = frozenset({"codeHash", "contextSha256", "codeSha256", "depsHash"})

    @classmethod
    def from_cr_spec(cls, meta: Meta, spec: dict[str, Any]) -> FunctionCode:
        values: dict[str, str] = {}
        for key, attr in cls.CR_KEYS.items():
            value = spec.get(key, "")
            if not isinstance(value, str):
                raise InvalidResource(f"spec.{key} must be a string", field=f"spec.{key}")
            if key in cls.DIGESTS and value and not HEX64.fullmatch(value):
                raise InvalidResource(f"spec.{key} must be 64 lowercase hex digits", field=f"spec.{key}")
            if len(value) > MAX_KEY_LENGTH:
                raise InvalidResource(f"spec.{key} must be at most {MAX_KEY_LENGTH} characters", field=f"spec.{key}")
            values[attr] = value
        code = cls(**values)
        ns, name = meta.namespace, meta.name
        if code.context_key and not own_context_key(ns, name, code.context_key):
            raise InvalidResource(f"spec.contextKey must be contexts/{ns}/{name}/<file>: "
                                  "a Function builds only its own build context", field="spec.contextKey")
        if code.code_key and not own_code_key(ns, name, code.code_key):
            raise InvalidResource(f"spec.codeKey must be code/{ns}/{name}/<file>: "
                                  "a Function fetches only its own code", field="spec.codeKey")
        if code.code_key and not code.code_sha256:
            raise InvalidResource("spec.codeKey is set but spec.codeSha256 (what the fetched archive must hash "
                                  "to) is not", field="spec.codeSha256")  # fmt: skip
        return code

    def to_cr(self) -> dict[str, str]:
        return {key: getattr(self, attr) for key, attr in self.CR_KEYS.items() if getattr(self, attr)}


def function_spec_to_cr(spec: FunctionSpec) -> dict[str, Any]:
    """SPEC's part of a Function's ``spec`` (the name goes to metadata)."""
    body: dict[str, Any] = {
        "runtime": spec.runtime,
        "entrypoint": spec.entrypoint,
        "memoryMb": spec.memory_mb,
        "timeoutSec": spec.timeout_sec,
        "envVars": dict(sorted(spec.env_vars.items())),
        "secrets": [ref.to_dict() for ref in spec.secrets],
    }
    if spec.max_concurrency:
        body["maxConcurrency"] = spec.max_concurrency
    if spec.sandbox:
        body["sandbox"] = spec.sandbox
    if spec.scale is not None:
        body["scale"] = scale_to_cr(spec.scale)
    return body


#: ``spec.scale``'s keys: CR key -> model key (``ScaleSpec``)
SCALE_CR_KEYS = {"min": "min", "max": "max", "target": "target", "idleSec": "idle_sec"}


def scale_to_cr(scale: ScaleSpec) -> dict[str, int]:
    return {cr: getattr(scale, model) for cr, model in SCALE_CR_KEYS.items()}


def _scale_from_cr(value: object) -> object:
    """The CR's ``spec.scale`` in the model's spelling, without keys this version does not know (forward
    compatible, as ``_known_only``)."""
    if not isinstance(value, dict):
        return value
    return {SCALE_CR_KEYS[key]: item for key, item in value.items() if key in SCALE_CR_KEYS}


def _function_spec(meta: Meta, spec: dict[str, Any]) -> FunctionSpec:
    body = {model: spec[cr] for cr, model in FUNCTION_USER_FIELDS.items() if cr in spec}
    if "scale" in body:
        body["scale"] = _scale_from_cr(body["scale"])
    try:
        return FunctionSpec.from_user(body, MAX_TIMEOUT_SEC, name=meta.name)
    except ValidationError as exc:
        raise _reworded(exc, _FUNCTION_PATHS) from exc


@dataclass(frozen=True)
class FunctionVersion:
    """One entry of ``status.versions``: a deploy that became Ready, with the spec it ran with."""

    version: int
    code_hash: str
    spec: FunctionSpec
    code: FunctionCode
    deployed_at: float | None


@dataclass(frozen=True)
class FunctionStatus:
    """What the operator reports; a phase this version does not know reads as None (not reported)."""

    phase: Phase | None = None
    message: str = ""
    image: str = ""
    code_hash: str = ""
    last_built_at: float | None = None
    observed_generation: int | None = None
    versions: tuple[FunctionVersion, ...] = ()

    @classmethod
    def from_cr(cls, meta: Meta, status: dict[str, Any]) -> FunctionStatus:
        return cls(phase=_enum(Phase, status.get("phase")),
                   message=_str(status, "message"), image=_str(status, "image"), code_hash=_str(status, "codeHash"),
                   last_built_at=parse_time(status.get("lastBuiltAt")),
                   observed_generation=_int(status, "observedGeneration"),
                   versions=_versions(meta, status.get("versions")))  # fmt: skip


def _versions(meta: Meta, entries: object) -> tuple[FunctionVersion, ...]:
    """The versions whose spec still decodes, oldest first (one that does not could never be deployed again)."""
    found = []
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or _int(entry, "version") is None or not isinstance(entry.get("spec"), dict):
            continue
        try:
            spec = _function_spec(meta, _given(entry["spec"]))
            code = FunctionCode.from_cr_spec(meta, _given(entry["spec"]))
        except InvalidResource:
            continue
        found.append(FunctionVersion(entry["version"], _str(entry, "codeHash"), spec, code,
                                     parse_time(entry.get("deployedAt"))))
    return tuple(sorted(found, key=lambda v: v.version))


@dataclass(frozen=True)
class FunctionResource:
    """A Function custom resource, decoded."""

    meta: Meta
    spec: FunctionSpec
    code: FunctionCode = field(default_factory=FunctionCode)
    #: hash of the referenced secrets' revisions (set by the API): on the pod template, so a written
    #: secret rolls the pods
    secrets_version: str = ""
    replicas: int = 1
    status: FunctionStatus = field(default_factory=FunctionStatus)
    #: ``spec.traffic``: http calls shared between the current version and one other (set by the API)
    traffic: TrafficSplit | None = None

    FIELDS = frozenset({*FUNCTION_USER_FIELDS, *FunctionCode.CR_KEYS, crd.SECRETS_VERSION, "replicas", TRAFFIC})

    @classmethod
    def from_cr(cls, obj: object) -> FunctionResource:
        """OBJ decoded and validated; raises :class:`InvalidResource`."""
        meta = Meta.from_cr(obj)
        assert isinstance(obj, dict)
        spec = _known_only(_given(_object(obj.get("spec"), "spec")), cls.FIELDS)
        secrets_version = spec.get(crd.SECRETS_VERSION, "")
        if not isinstance(secrets_version, str) or not SECRETS_VERSION.fullmatch(secrets_version):
            raise InvalidResource(f"spec.{crd.SECRETS_VERSION} must be up to 64 lowercase hex digits",
                                  field=f"spec.{crd.SECRETS_VERSION}")
        replicas = spec.get("replicas", 1)
        if isinstance(replicas, bool) or not isinstance(replicas, int) or not 0 <= replicas <= MAX_REPLICAS:
            raise InvalidResource(f"spec.replicas must be an integer between 0 and {MAX_REPLICAS}",
                                  field="spec.replicas")
        traffic = None
        if spec.get(TRAFFIC) is not None:
            try:
                traffic = parse_entries(spec[TRAFFIC], field=f"spec.{TRAFFIC}")
            except ValidationError as exc:
                raise InvalidResource(exc.message, field=exc.field) from exc
        return cls(meta=meta, spec=_function_spec(meta, spec), code=FunctionCode.from_cr_spec(meta, spec),
                   secrets_version=secrets_version, replicas=replicas,
                   status=FunctionStatus.from_cr(meta, _section(obj, "status")), traffic=traffic)  # fmt: skip

    def version(self, number: int) -> FunctionVersion | None:
        """The kept version NUMBER of ``status.versions``, if it is there."""
        return next((v for v in self.status.versions if v.version == number), None)

    @property
    def current_version(self) -> int | None:
        """The newest recorded version (what the Deployment serves once Ready)."""
        return self.status.versions[-1].version if self.status.versions else None

    def spec_to_cr(self) -> dict[str, Any]:
        """The whole ``spec`` (the default replica count left to the CRD's default)."""
        body = function_spec_to_cr(self.spec) | self.code.to_cr()
        if self.secrets_version:
            body[crd.SECRETS_VERSION] = self.secrets_version
        if self.replicas != 1:
            body["replicas"] = self.replicas
        if self.traffic is not None:
            body[TRAFFIC] = self.traffic.to_list()
        return body


# -- Trigger ---------------------------------------------------------------------------------------

_TRIGGER_PATHS = {f: f"spec.{f}" for f in TriggerSpec.FIELDS} | {"name": "metadata.name"}


def trigger_spec_to_cr(spec: TriggerSpec) -> dict[str, Any]:
    """SPEC as a Trigger's ``spec``: what is set, without the name (metadata)."""
    return {k: v for k, v in spec.to_dict().items() if k != "name" and v is not None}


@dataclass(frozen=True)
class TriggerStatus:
    message: str = ""
    last_fired_at: float | None = None


@dataclass(frozen=True)
class TriggerResource:
    """A Trigger custom resource, decoded."""

    meta: Meta
    spec: TriggerSpec
    status: TriggerStatus = field(default_factory=TriggerStatus)

    @classmethod
    def from_cr(cls, obj: object) -> TriggerResource:
        """OBJ decoded and validated; raises :class:`InvalidResource`."""
        meta = Meta.from_cr(obj)
        assert isinstance(obj, dict)
        spec = _known_only(_given(_object(obj.get("spec"), "spec")), TriggerSpec.FIELDS - {"name"})
        try:
            decoded = TriggerSpec.from_user({**spec, "name": meta.name})
        except ValidationError as exc:
            raise _reworded(exc, _TRIGGER_PATHS) from exc
        status = _section(obj, "status")
        return cls(meta, decoded, TriggerStatus(_str(status, "message"), parse_time(status.get("lastFiredAt"))))

    def spec_to_cr(self) -> dict[str, Any]:
        return trigger_spec_to_cr(self.spec)


# -- FunctionJob -----------------------------------------------------------------------------------

JOB_FIELDS = {"function": "function", "runId": "run_id", "event": "event"}
_JOB_PATHS = {model: f"spec.{cr}" for cr, model in JOB_FIELDS.items()} | {"name": "metadata.name"}


def job_spec_to_cr(spec: JobSpec) -> dict[str, Any]:
    return {"function": spec.function, "runId": spec.run_id, "event": spec.event}


@dataclass(frozen=True)
class JobStatus:
    """The operator's report; ``run_id`` says which run the phase describes (None: not said)."""

    phase: JobPhase | None = None
    message: str = ""
    run_id: int | None = None
    started_at: float | None = None
    completed_at: float | None = None


@dataclass(frozen=True)
class JobResource:
    """A FunctionJob custom resource, decoded."""

    meta: Meta
    spec: JobSpec
    status: JobStatus = field(default_factory=JobStatus)

    @classmethod
    def from_cr(cls, obj: object) -> JobResource:
        """OBJ decoded and validated; raises :class:`InvalidResource`."""
        meta = Meta.from_cr(obj)
        assert isinstance(obj, dict)
        spec = _known_only(_given(_object(obj.get("spec"), "spec")), frozenset(JOB_FIELDS))
        try:
            decoded = JobSpec.from_user({"name": meta.name, **{JOB_FIELDS[k]: v for k, v in spec.items()}})
        except ValidationError as exc:
            raise _reworded(exc, _JOB_PATHS) from exc
        status = _section(obj, "status")
        return cls(meta, decoded, JobStatus(
            phase=_enum(JobPhase, status.get("phase")), message=_str(status, "message"),
            run_id=_int(status, "runId"), started_at=parse_time(status.get("startTime")),
            completed_at=parse_time(status.get("completionTime"))))  # fmt: skip

    def spec_to_cr(self) -> dict[str, Any]:
        return job_spec_to_cr(self.spec)
