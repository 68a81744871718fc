"""The resource model (Function, Trigger, FunctionJob) and its validation.

Parsing is the validation: ``*.from_user(dict)`` either returns a well-formed spec or raises
``ValidationError`` naming the field, so no half-checked dict travels further into the platform.
"""

from __future__ import annotations

import functools
import re
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from croniter import croniter

from sless_core.errors import ValidationError
from sless_core.httproutes import validate_cors, validate_methods, validate_path
from sless_core.naming import validate_name

RUNTIMES = ("python3.11", "nodejs20", "go1.23")
DEFAULT_ENTRYPOINT = {"python3.11": "handler.handle", "nodejs20": "handler.handle", "go1.23": "Handle"}
MEMORY_MIN_MB, MEMORY_MAX_MB, MEMORY_DEFAULT_MB = 64, 8192, 128
#: The largest per-function concurrency limit (calls in flight through one API process).
MAX_CONCURRENCY = 1000
#: Demand-driven scaling (``FunctionSpec.scale``): replicas between ``min`` and ``max``, ``target`` calls in flight
#: per replica, back to ``min`` after ``idle_sec`` without calls. The bounds keep one function from claiming a
#: cluster (``max``, as the CRD's fixed ``replicas``) or flapping (``idle_sec`` at least a few seconds).
SCALE_MAX_REPLICAS = 100
SCALE_DEFAULTS = {"min": 0, "max": 10, "target": 10, "idle_sec": 300}
SCALE_IDLE_MIN_SEC, SCALE_IDLE_MAX_SEC = 5, 86400
#: The stronger sandboxes a function may require (its pods then run under the matching RuntimeClass on
#: Kubernetes: gVisor's runsc, a kernel of its own between the code and the node's). Empty: the platform's default.
SANDBOXES = ("gvisor",)
TIMEOUT_DEFAULT_SEC = 30
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
ENV_MAX_VARS, ENV_MAX_VALUE = 100, 32 * 1024
# All names and values together (UTF-8): they share the exec's argument space (ARG_MAX, about 2 MiB)
# with the platform's own variables and a job's event, which 100 values of 32 KiB would overflow.
ENV_MAX_TOTAL_BYTES = 256 * 1024
# The platform sets these in every function's environment; a user value would silently break the runtime.
RESERVED_ENV = ("PORT", "SLESS_", "HOME", "PATH")
#: Variables that steer a build tool, not the function: the Go toolchain's (GOFLAGS=-toolexec runs a program
#: of the tenant's choosing inside the compiler, GOPROXY/GONOSUMDB change where modules come from and whether
#: they are checked), cgo's, pip's and npm's. A function's variables must never reach its build, so they are
#: refused by name on both backends (case-insensitively: npm reads npm_config_* in any case). The Go runtime's
#: own knobs (GOGC, GOMAXPROCS, GOMEMLIMIT, GODEBUG, GOTRACEBACK) are not build settings and stay allowed.
TOOLCHAIN_ENV = re.compile(
    r"^(?:GO(?:FLAGS|ENV|ROOT|PATH|BIN|PROXY|NOPROXY|PRIVATE|NOSUMDB|NOSUMCHECK|SUMDB|INSECURE|TOOLCHAIN|CACHE"
    r"|CACHEPROG|MODCACHE|WORK|EXPERIMENT|OS|ARCH|AMD64|ARM|ARM64|386|TMPDIR|VCS|AUTH|111MODULE|TELEMETRY)"
    r"|CGO_\w*|CC|CXX|PIP_\w*|NPM_CONFIG_\w*)\Z",
    re.IGNORECASE,
)
#: Dynamic-loader variables that act by being set at all, whatever their value: the sandbox launch empties
#: the loader's variables before bwrap (which starts outside the sandbox) sees them, which neutralises the
#: ones that name a file (LD_PRELOAD, LD_DEBUG_OUTPUT) but not these, so they are refused by name.
LOADER_FLAG_ENV = frozenset({"LD_SHOW_AUXV", "LD_DYNAMIC_WEAK", "LD_TRACE_LOADED_OBJECTS", "LD_TRACE_PRELINKING",
                             "LD_BIND_NOW", "LD_BIND_NOT", "LD_POINTER_GUARD", "LD_WARN", "LD_VERBOSE"})
PY_ENTRY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+\Z")
GO_ENTRY = re.compile(r"^[A-Z][A-Za-z0-9_]*\Z")
# A job runs again when its run_id grows; 32-bit so every store and the custom resources hold it.
MAX_RUN_ID = 2**31 - 1
QUEUE_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,200}\Z")
# A job event reaches the runner as one environment string; Linux caps one at 128 KiB (MAX_ARG_STRLEN).
MAX_EVENT_BYTES = 100 * 1024


class Phase(StrEnum):
    PENDING = "Pending"
    BUILDING = "Building"
    READY = "Ready"
    FAILED = "Failed"


class JobPhase(StrEnum):
    RECORDED = "Recorded"
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class Delivery(StrEnum):
    """How an event trigger treats a call a crash interrupted (its outcome unknown)."""

    AT_MOST_ONCE = "at_most_once"  # dead-lettered as `interrupted`: the function never runs twice for it
    AT_LEAST_ONCE = "at_least_once"  # called again: it may run twice, so the handler must be idempotent


class TriggerType(StrEnum):
    HTTP = "http"
    CRON = "cron"
    EVENT = "event"


def _require_dict(body: object) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ValidationError("the request body must be a JSON object")
    return body


def _reject_unknown(body: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise ValidationError(f"unknown field(s): {', '.join(unknown)}", field=unknown[0])


def _int_in(body: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"{key} must be an integer", field=key)
    if not low <= value <= high:
        raise ValidationError(f"{key} must be between {low} and {high}", field=key)
    return value


def _bool(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise ValidationError(f"{key} must be true or false", field=key)
    return value


def validate_env_vars(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValidationError("env_vars must be an object of strings", field="env_vars")
    if len(value) > ENV_MAX_VARS:
        raise ValidationError(f"at most {ENV_MAX_VARS} env_vars", field="env_vars")
    total = 0
    for key, val in value.items():
        validate_env_name(key, "env_vars")
        if not isinstance(val, str) or len(val) > ENV_MAX_VALUE:
            raise ValidationError(f"env_vars[{key}] must be a string of at most {ENV_MAX_VALUE} characters",
                                  field="env_vars")
        if "\x00" in val:  # exec refuses it: the function would fail to start, far from the cause
            raise ValidationError(f"env_vars[{key}] must not contain a NUL character", field="env_vars")
        total += len(key) + len(val.encode("utf-8", "surrogatepass")) + 2
        if total > ENV_MAX_TOTAL_BYTES:
            raise ValidationError(f"env_vars must be at most {ENV_MAX_TOTAL_BYTES} bytes in all", field="env_vars")
    return {k: value[k] for k in sorted(value)}


def validate_env_name(key: object, field: str) -> str:
    """An environment variable name a user may set: a string, an identifier, none of the platform's."""
    if not isinstance(key, str) or not ENV_NAME.match(key):
        shown = repr(key) if isinstance(key, str) else f"of type {type(key).__name__}"
        raise ValidationError(f"invalid environment variable name {shown[:80]}", field=field)
    if key == "PORT" or any(key.startswith(p) for p in RESERVED_ENV[1:]):
        raise ValidationError(f"environment variable {key!r} is reserved by the platform", field=field)
    if key in LOADER_FLAG_ENV:
        raise ValidationError(f"environment variable {key!r} changes how the platform's own processes load, "
                              "and functions never see it", field=field)
    if TOOLCHAIN_ENV.match(key):
        raise ValidationError(f"environment variable {key!r} configures the build toolchain, which a function's "
                              "variables never reach: the platform sets it", field=field)
    return key


def validate_run_id(value: object, field: str = "run_id") -> int:
    """A job's run counter: an integer 0..MAX_RUN_ID (0 records the job without running it)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"{field} must be an integer", field=field)
    if not 0 <= value <= MAX_RUN_ID:
        raise ValidationError(f"{field} must be between 0 and {MAX_RUN_ID}", field=field)
    return value


def validate_entrypoint(runtime: str, value: object) -> str:
    if value is None:
        return DEFAULT_ENTRYPOINT[runtime]
    pattern = GO_ENTRY if runtime == "go1.23" else PY_ENTRY
    if not isinstance(value, str) or not pattern.match(value):
        expected = "an exported Go function name, e.g. Handle" if runtime == "go1.23" else "module.function"
        raise ValidationError(f"entrypoint must be {expected}", field="entrypoint")
    return value


#: A secret's key, and the file name a reference may deliver it as: no "/", never "." or ".." (the file
#: lands in the function's secrets folder), a subset of what Kubernetes accepts as a Secret's key.
SECRET_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}\Z")
MAX_SECRET_REFS = 50


@dataclass(frozen=True)
class SecretRef:
    """A reference to one key of a tenant secret, delivered either as an environment variable (``env``)
    or as a read-only file named ``file`` in the folder ``$SLESS_SECRETS_DIR`` (exactly one of the two)."""

    name: str
    key: str
    env: str | None = None
    file: str | None = None

    def to_dict(self) -> dict[str, str]:
        out = {"name": self.name, "key": self.key}
        if self.env is not None:
            out["env"] = self.env
        if self.file is not None:
            out["file"] = self.file
        return out


def validate_sandbox(value: object) -> str:
    """A sandbox the platform knows, or "" (absent, null or empty: none asked for).

    An unknown name is refused rather than ignored: a tenant who asks for isolation must never get less.
    """
    if value is None or value == "":
        return ""
    if value not in SANDBOXES:
        raise ValidationError(f"sandbox must be one of {', '.join(SANDBOXES)} (or empty for the platform's "
                              f"default), got {value!r}", field="sandbox")
    return str(value)


def validate_secret_key(value: object, field: str = "key") -> str:
    if not isinstance(value, str) or not SECRET_KEY.match(value):
        raise ValidationError(f"{field} must be 1-63 of [A-Za-z0-9_.-], not starting with '.' or '-'", field=field)
    return value


def validate_secret_refs(value: object) -> list[SecretRef]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValidationError("secrets must be a list of {name, key, env} or {name, key, file}", field="secrets")
    if len(value) > MAX_SECRET_REFS:
        raise ValidationError(f"at most {MAX_SECRET_REFS} secret references", field="secrets")
    refs: list[SecretRef] = []
    targets: set[tuple[str, str]] = set()
    for item in value:
        if not isinstance(item, dict):
            raise ValidationError("each secret reference is {name, key, env} or {name, key, file}", field="secrets")
        given = {k for k, v in item.items() if v is not None}
        if not {"name", "key"} <= given or given - {"name", "key", "env", "file"} or len(given & {"env", "file"}) != 1:
            raise ValidationError("each secret reference is {name, key, env} or {name, key, file}", field="secrets")
        validate_name(item["name"], "secrets.name")
        validate_secret_key(item["key"], "secrets.key")
        env = validate_env_name(item["env"], "secrets") if "env" in given else None
        file = validate_secret_key(item["file"], "secrets.file") if "file" in given else None
        target = ("env", env) if env is not None else ("file", str(file))
        if target in targets:
            raise ValidationError(f"two secret references deliver to the same {target[0]} {target[1]!r}",
                                  field="secrets")
        targets.add(target)
        refs.append(SecretRef(item["name"], item["key"], env, file))
    return refs


@dataclass(frozen=True)
class ScaleSpec:
    """How a function scales with demand: ``min``..``max`` replicas, ``target`` calls in flight per replica.

    ``min`` 0 lets an idle function cost nothing: the first call waits while a replica starts. ``idle_sec`` is how
    long a function goes without calls before it goes back to ``min``.
    """

    min: int = SCALE_DEFAULTS["min"]
    max: int = SCALE_DEFAULTS["max"]
    target: int = SCALE_DEFAULTS["target"]
    idle_sec: int = SCALE_DEFAULTS["idle_sec"]

    FIELDS = frozenset(SCALE_DEFAULTS)

    @classmethod
    def from_user(cls, value: object) -> ScaleSpec | None:
        """None for an absent or null ``scale`` (fixed replicas); every field is optional, with its default."""
        if value is None:
            return None
        if not isinstance(value, dict):
            raise ValidationError("scale must be an object {min, max, target, idle_sec}", field="scale")
        unknown = sorted(set(value) - cls.FIELDS)
        if unknown:
            raise ValidationError(f"unknown field(s) in scale: {', '.join(map(str, unknown))} "
                                  f"(known: min, max, target, idle_sec)", field="scale")
        try:
            low = _int_in(value, "min", cls.min, 0, SCALE_MAX_REPLICAS)
            high = _int_in(value, "max", cls.max, 1, SCALE_MAX_REPLICAS)
            target = _int_in(value, "target", cls.target, 1, MAX_CONCURRENCY)
            idle = _int_in(value, "idle_sec", cls.idle_sec, SCALE_IDLE_MIN_SEC, SCALE_IDLE_MAX_SEC)
        except ValidationError as exc:
            raise ValidationError(f"scale.{exc.message}", field=f"scale.{exc.field}") from None
        if low > high:
            raise ValidationError(f"scale.min ({low}) must not exceed scale.max ({high})", field="scale.min")
        return cls(low, high, target, idle)

    def to_dict(self) -> dict[str, int]:
        return {"min": self.min, "max": self.max, "target": self.target, "idle_sec": self.idle_sec}


@dataclass
class FunctionSpec:
    """What a tenant asks for; status fields live beside it in the backend's record."""

    name: str
    runtime: str
    entrypoint: str
    memory_mb: int = MEMORY_DEFAULT_MB
    timeout_sec: int = TIMEOUT_DEFAULT_SEC
    env_vars: dict[str, str] = field(default_factory=dict)
    secrets: list[SecretRef] = field(default_factory=list)
    max_concurrency: int = 0  # calls in flight through /fn at once; 0: no limit of its own
    sandbox: str = ""  # one of SANDBOXES, or "": the platform's default runtime
    scale: ScaleSpec | None = None  # demand-driven replicas; None: the backend's fixed replicas

    FIELDS = frozenset({"name", "runtime", "entrypoint", "memory_mb", "timeout_sec", "env_vars", "secrets",
                        "max_concurrency", "sandbox", "scale"})

    @classmethod
    def from_user(cls, body: object, max_timeout: int, name: str | None = None) -> FunctionSpec:
        data = _require_dict(body)
        _reject_unknown(data, set(cls.FIELDS))
        if name is not None and data.get("name", name) != name:
            raise ValidationError("name in the body differs from the name in the path", field="name")
        runtime = data.get("runtime")
        if runtime not in RUNTIMES:
            raise ValidationError(f"runtime must be one of {', '.join(RUNTIMES)}", field="runtime")
        return cls(
            name=validate_name(data.get("name", name)),
            runtime=runtime,
            entrypoint=validate_entrypoint(runtime, data.get("entrypoint")),
            memory_mb=_int_in(data, "memory_mb", MEMORY_DEFAULT_MB, MEMORY_MIN_MB, MEMORY_MAX_MB),
            timeout_sec=_int_in(data, "timeout_sec", TIMEOUT_DEFAULT_SEC, 1, max_timeout),
            env_vars=validate_env_vars(data.get("env_vars")),
            secrets=validate_secret_refs(data.get("secrets")),
            max_concurrency=_int_in(data, "max_concurrency", 0, 0, MAX_CONCURRENCY),
            sandbox=validate_sandbox(data.get("sandbox")),
            scale=ScaleSpec.from_user(data.get("scale")),
        )

    def updated(self, patch: object, max_timeout: int) -> FunctionSpec:
        """The spec with ``patch`` applied; a changed runtime resets a default entrypoint. ``scale`` merges as
        JSON Merge Patch does: ``{"scale": {"max": 5}}`` changes only ``max``, ``{"scale": null}`` removes it."""
        data = _require_dict(patch)
        merged = self.to_dict()
        if "runtime" in data and "entrypoint" not in data and self.entrypoint == DEFAULT_ENTRYPOINT[self.runtime]:
            merged.pop("entrypoint")
        if isinstance(data.get("scale"), dict) and self.scale is not None:
            data = {**data, "scale": {**self.scale.to_dict(), **data["scale"]}}
        merged.update(data)
        return FunctionSpec.from_user(merged, max_timeout, name=self.name)

    def to_dict(self) -> dict[str, Any]:
        body = asdict(self)
        body["secrets"] = [ref.to_dict() for ref in self.secrets]
        body["scale"] = self.scale.to_dict() if self.scale is not None else None
        return body

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FunctionSpec:
        """Trusting constructor for records we stored ourselves."""
        values = dict(data)
        values["secrets"] = [SecretRef(**s) for s in values.get("secrets", [])]
        values["scale"] = ScaleSpec(**values["scale"]) if values.get("scale") else None
        return cls(**{k: v for k, v in values.items() if k in cls.FIELDS})


def validate_cron(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValidationError("schedule is required for cron triggers", field="schedule")
    schedule = " ".join(value.split())
    if len(schedule.split(" ")) != 5 or not _valid_cron(schedule):
        raise ValidationError(
            f"schedule {value!r} is not a valid 5-field cron expression (minute hour day month weekday)",
            field="schedule",
        )
    return schedule


@functools.lru_cache(maxsize=1024)
def _valid_cron(schedule: str) -> bool:
    """croniter's parse (about 0.3 ms), remembered: every watch event of a cron Trigger validates its schedule."""
    return bool(croniter.is_valid(schedule))


@dataclass
class TriggerSpec:
    name: str
    type: str
    function: str
    enabled: bool = True
    schedule: str | None = None
    queue: str | None = None
    auth: str = "public"
    delivery: str | None = None  # event triggers: a Delivery; None reads as at_most_once
    methods: list[str] | None = None  # http triggers: the methods that reach the function; None: all
    cors: dict[str, Any] | None = None  # http triggers: CORS settings (sless_core.httproutes), answered by the proxy
    #: http triggers: the path pattern below the function's URL it serves (``/users/{id}``); None: every path that
    #: no pattern of the function serves
    path: str | None = None

    FIELDS = frozenset({"name", "type", "function", "enabled", "schedule", "queue", "auth", "delivery", "methods",
                        "cors", "path"})

    @classmethod
    def from_user(cls, body: object) -> TriggerSpec:
        data = _require_dict(body)
        _reject_unknown(data, set(cls.FIELDS))
        kind = data.get("type")
        if kind not in tuple(TriggerType):
            raise ValidationError("type must be one of http, cron, event", field="type")
        auth = data.get("auth", "public")
        if auth not in ("public", "token"):
            raise ValidationError("auth must be public or token", field="auth")
        schedule = validate_cron(data.get("schedule")) if kind == TriggerType.CRON else None
        queue = None
        if kind == TriggerType.EVENT:
            queue = data.get("queue")
            if not isinstance(queue, str) or not QUEUE_NAME.match(queue):
                raise ValidationError("queue is required for event triggers: 1-200 of [A-Za-z0-9_.:-]",
                                      field="queue")
        delivery = data.get("delivery")
        if delivery is not None and delivery not in tuple(Delivery):
            raise ValidationError("delivery must be at_most_once or at_least_once", field="delivery")
        methods = validate_methods(data["methods"]) if data.get("methods") is not None else None
        cors = validate_cors(data["cors"]) if data.get("cors") is not None else None
        path = validate_path(data["path"]) if data.get("path") is not None else None
        for key, kinds in (("schedule", (TriggerType.CRON,)), ("queue", (TriggerType.EVENT,)),
                           ("delivery", (TriggerType.EVENT,)), ("methods", (TriggerType.HTTP,)),
                           ("cors", (TriggerType.HTTP,)), ("path", (TriggerType.HTTP,))):
            if data.get(key) is not None and kind not in kinds:
                raise ValidationError(f"{key} applies only to {kinds[0].value} triggers", field=key)
        return cls(
            name=validate_name(data.get("name")),
            type=kind,
            function=validate_name(data.get("function"), "function"),
            enabled=_bool(data, "enabled", True),
            schedule=schedule,
            queue=queue,
            auth=auth,
            delivery=delivery,
            methods=methods,
            cors=cors,
            path=path,
        )

    def patched(self, patch: object) -> TriggerSpec:
        data = _require_dict(patch)
        for fixed in ("name", "type"):
            if fixed in data and data[fixed] != getattr(self, fixed):
                raise ValidationError(f"{fixed} cannot be changed; delete and re-create the trigger", field=fixed)
        merged = self.to_dict()
        merged.update(data)
        return TriggerSpec.from_user({k: v for k, v in merged.items() if v is not None})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TriggerSpec:
        return cls(**{k: v for k, v in data.items() if k in cls.FIELDS})


@dataclass
class JobSpec:
    name: str
    function: str
    event: dict[str, Any]
    run_id: int = 1

    FIELDS = frozenset({"name", "function", "event", "run_id"})

    @classmethod
    def from_user(cls, body: object) -> JobSpec:
        import json

        data = _require_dict(body)
        _reject_unknown(data, set(cls.FIELDS))
        event = data.get("event", {})
        if not isinstance(event, dict):
            raise ValidationError("event must be a JSON object", field="event")
        if len(json.dumps(event)) > MAX_EVENT_BYTES:
            raise ValidationError(f"event must be at most {MAX_EVENT_BYTES} bytes of JSON", field="event")
        return cls(
            name=validate_name(data.get("name")),
            function=validate_name(data.get("function"), "function"),
            event=event,
            run_id=validate_run_id(data.get("run_id", 1)),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
