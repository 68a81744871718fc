"""The one configuration of the API's processes (``sless up``, ``sless-api``, ``sless-events``).

:meth:`ApiConfig.from_env` is the only reader of the environment: each entry point calls it once at
start-up and passes the object (or the sub-config a module needs) down; no other module reads
``os.environ``. Every variable is in the README's configuration table, and every bad value stops the
start with one line naming the variable (:class:`sless_core.envconfig.ConfigError`).

The sub-configs live beside the code they configure (auth, storage, secrets, kube, events, sandbox,
retention, logging); this module composes them.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sless_api.asynccalls.callback import CallbackPolicy
from sless_api.auth import AuthConfig, load_public_key
from sless_api.backendconfig import KubeSettings, RetentionPolicy, SandboxSettings
from sless_api.events.config import EventsConfig
from sless_api.logsetup import LogSettings
from sless_api.secrets.settings import SecretsSettings
from sless_api.storage.factory import StorageSettings
from sless_core.envconfig import ConfigError, EnvReader

BACKENDS = ("standalone", "kubernetes")

MIB = 1024 * 1024
# Function responses get an opaque origin: a function's page cannot read the console's storage or call the
# API with the console's token, though both are served from the same host.
DEFAULT_FUNCTION_CSP = "sandbox allow-scripts allow-forms allow-popups allow-downloads"


@dataclass(frozen=True)
class AsyncSettings:
    workers: int = 8  # calls in flight per process
    max_retries: int = 3
    backoff_sec: float = 1.0
    backoff_max_sec: float = 60.0
    result_max_bytes: int = 256 * 1024
    retention_sec: float = 7 * 86400.0
    lease_sec: float = 960.0  # longer than any call (900 s maximum timeout + margin)
    poll_sec: float = 1.0  # how often an idle runner looks for due calls another process queued
    callback_policy: CallbackPolicy = field(default_factory=CallbackPolicy)  # where callbacks may go, how tried

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AsyncSettings:
        reader = EnvReader(env)
        settings = cls(
            workers=reader.integer("SLESS_ASYNC_WORKERS", cls.workers, 1, 1000),
            max_retries=reader.integer("SLESS_ASYNC_MAX_RETRIES", cls.max_retries, 0, 100),
            backoff_sec=reader.number("SLESS_ASYNC_RETRY_BACKOFF_SEC", cls.backoff_sec, low=0.001),
            backoff_max_sec=reader.number("SLESS_ASYNC_RETRY_BACKOFF_MAX_SEC", cls.backoff_max_sec, low=0.001),
            result_max_bytes=reader.integer("SLESS_ASYNC_RESULT_MAX_BYTES", cls.result_max_bytes, low=0),
            retention_sec=reader.number("SLESS_ASYNC_RETENTION_SEC", cls.retention_sec, low=1),
            callback_policy=CallbackPolicy(
                allowed_nets=CallbackPolicy.parse_nets(reader.text("SLESS_CALLBACK_ALLOWED_NETS", "")),
                timeout_sec=reader.number("SLESS_CALLBACK_TIMEOUT_SEC", CallbackPolicy.timeout_sec, 0.001, 300),
                attempts=reader.integer("SLESS_CALLBACK_ATTEMPTS", CallbackPolicy.attempts, 1, 10)),
        )
        if settings.backoff_max_sec < settings.backoff_sec:
            raise ConfigError(f"SLESS_ASYNC_RETRY_BACKOFF_MAX_SEC must be at least SLESS_ASYNC_RETRY_BACKOFF_SEC "
                              f"({settings.backoff_sec:g}), got {settings.backoff_max_sec:g}")
        return settings

    def backoff(self, attempts: int) -> float:
        """Delay before the next attempt: doubling from backoff_sec, capped, ±20 % so retries spread."""
        delay = min(self.backoff_max_sec, self.backoff_sec * 2 ** max(0, attempts - 1))
        return float(delay * random.uniform(0.8, 1.2))


@dataclass(frozen=True)
class ServeSettings:
    """``sless-api`` (gunicorn): where it listens and how many worker processes serve."""

    bind: str = "127.0.0.1:8090"
    workers: int = 2


@dataclass(frozen=True)
class ProbeSettings:
    """``sless-events``: where its ``/health``, ``/ready`` and ``/metrics`` listen."""

    host: str = "127.0.0.1"
    port: int = 8091


@dataclass(frozen=True)
class ApiConfig:
    """Everything the API's processes are told by their environment, parsed and checked at start-up."""

    backend: str
    data_dir: Path
    database_url: str
    max_upload_bytes: int
    max_timeout_sec: int
    max_body_bytes: int
    proxy_timeout_margin_sec: float
    idle_timeout_sec: float
    rabbitmq_url: str | None
    public_url: str
    #: Token verification; None when no key is configured (the API serves, and /v1 answers 503).
    auth: AuthConfig | None
    storage: StorageSettings
    secrets: SecretsSettings
    kube: KubeSettings
    #: The event dispatcher's knobs; None without SLESS_RABBITMQ_URL.
    events: EventsConfig | None
    sandbox: SandboxSettings
    retention: RetentionPolicy
    logging: LogSettings
    server: ServerLimits
    serve: ServeSettings = ServeSettings()
    probes: ProbeSettings = ProbeSettings()
    function_csp: str = DEFAULT_FUNCTION_CSP
    metrics_token: str = field(default="", repr=False)  # empty: /metrics answers 404
    async_calls: AsyncSettings = AsyncSettings()
    tenant_max_concurrency: int = 0  # 0: no tenant-wide limit
    concurrency_queue_max: int = 100
    concurrency_queue_wait_sec: float = 10.0
    stream_max_sec: float = 3600.0  # a streamed /fn response is cut after this long, however busy
    warm_spares: int = 1  # standalone: pre-started Python runtime processes per tenant (0: none)

    @classmethod
    def from_env(cls, env: Mapping[str, str], overrides: Mapping[str, str] | None = None,
                 keep_alive_default: int = 5) -> ApiConfig:
        """Parse ENV (with OVERRIDES, the command line's choices, on top) once, for the whole process.

        ``keep_alive_default`` is the serving process's own default of ``SLESS_KEEPALIVE_SEC``.
        """
        source = {**env, **(overrides or {})}
        reader = EnvReader(source)
        backend = reader.choice("SLESS_BACKEND", "standalone", BACKENDS)
        data = Path(reader.text("SLESS_DATA_DIR", "") or Path.home() / ".local/share/sless")
        max_timeout = reader.integer("SLESS_MAX_TIMEOUT_SEC", 900, 1, 86400)
        margin = reader.number("SLESS_PROXY_TIMEOUT_MARGIN_SEC", 5.0, 0, 3600)
        rabbitmq_url = reader.optional("SLESS_RABBITMQ_URL")
        try:
            return cls(
                backend=backend,
                data_dir=data,
                database_url=reader.text("SLESS_DATABASE_URL", f"sqlite:///{data / 'invocations.db'}"),
                max_upload_bytes=reader.integer("SLESS_MAX_UPLOAD_BYTES", 32 * MIB, low=1),
                max_timeout_sec=max_timeout,
                max_body_bytes=reader.integer("SLESS_MAX_BODY_BYTES", 6 * MIB, low=1),
                proxy_timeout_margin_sec=margin,
                idle_timeout_sec=reader.number("SLESS_IDLE_TIMEOUT_SEC", 300.0, low=0.1),
                rabbitmq_url=rabbitmq_url,
                public_url=reader.text("SLESS_PUBLIC_URL", ""),
                auth=auth_config(source),
                storage=StorageSettings.from_env(source),
                secrets=SecretsSettings.from_env(source, backend),
                kube=KubeSettings.from_env(source),
                events=(EventsConfig.from_env(rabbitmq_url, source, max_call_sec=max_timeout + margin)
                        if rabbitmq_url else None),
                sandbox=SandboxSettings.from_env(source),
                retention=RetentionPolicy.from_env(source),
                logging=LogSettings.from_env(source),
                server=ServerLimits.from_env(source, keep_alive_default),
                serve=ServeSettings(bind=reader.text("SLESS_BIND", ServeSettings.bind),
                                    workers=reader.integer("SLESS_WORKERS", ServeSettings.workers, 1, 256)),
                probes=ProbeSettings(host=reader.text("SLESS_EVENTS_HOST", ProbeSettings.host),
                                     port=reader.integer("SLESS_EVENTS_PORT", ProbeSettings.port, 1, 65535)),
                # Set but empty is a choice here: no Content-Security-Policy (functions on a host of their own).
                function_csp=source.get("SLESS_FUNCTION_CSP", DEFAULT_FUNCTION_CSP).strip(),
                metrics_token=reader.text("SLESS_METRICS_TOKEN", ""),
                async_calls=AsyncSettings.from_env(source),
                tenant_max_concurrency=reader.integer("SLESS_TENANT_MAX_CONCURRENCY", 0, 0, 1_000_000),
                concurrency_queue_max=reader.integer("SLESS_CONCURRENCY_QUEUE_MAX", 100, 0, 1_000_000),
                concurrency_queue_wait_sec=reader.number("SLESS_CONCURRENCY_QUEUE_WAIT_SEC", 10.0, 0, 3600),
                stream_max_sec=reader.number("SLESS_PROXY_STREAM_MAX_SEC", 3600.0, low=0.001),
                warm_spares=reader.integer("SLESS_WARM_SPARES", 1, 0, 16),
            )
        except ConfigError:
            raise
        except ValueError as exc:  # a sub-config's own check (a domain, an image, a key): same one line
            raise ConfigError(str(exc)) from None


def auth_config(env: Mapping[str, str]) -> AuthConfig | None:
    """The token verification ENV configures, its key checked now; None when it names no key at all."""
    if not AuthConfig.configured(env):
        return None
    config = AuthConfig.from_env(env)
    if config.public_key_pem:
        try:
            load_public_key(config.public_key_pem)
        except ValueError as exc:
            raise ConfigError(f"SLESS_JWT_PUBLIC_KEY: {exc}") from None
    return config


@dataclass(frozen=True)
class ServerLimits:
    """What one server process (``sless up``, or one ``sless-api`` worker) allows its HTTP clients.

    A client that opens connections and sends its request head slowly, or never, would otherwise hold a
    socket and a file descriptor for ever: uvicorn times out idle keep-alive connections only between
    requests, and has no deadline for the head of a request.
    """

    header_timeout_sec: float
    max_connections: int
    max_header_bytes: int
    keep_alive_sec: int

    def __post_init__(self) -> None:
        if not self.header_timeout_sec > 0:
            raise ConfigError("SLESS_HEADER_TIMEOUT_SEC must be a positive number of seconds")
        if self.max_connections < 1:
            raise ConfigError("SLESS_MAX_CONNECTIONS must be at least 1")
        if self.max_header_bytes < 1024:
            raise ConfigError("SLESS_MAX_HEADER_BYTES must be at least 1024")
        if self.keep_alive_sec < 1:
            raise ConfigError("SLESS_KEEPALIVE_SEC must be at least 1")

    @classmethod
    def from_env(cls, env: Mapping[str, str], keep_alive_default: int = 5) -> ServerLimits:
        reader = EnvReader(env)
        return cls(
            header_timeout_sec=reader.number("SLESS_HEADER_TIMEOUT_SEC", 10.0),
            max_connections=reader.integer("SLESS_MAX_CONNECTIONS", 1000),
            max_header_bytes=reader.integer("SLESS_MAX_HEADER_BYTES", 64 * 1024),
            keep_alive_sec=reader.integer("SLESS_KEEPALIVE_SEC", keep_alive_default),
        )
