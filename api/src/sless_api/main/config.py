"""The one configuration of the API's processes (``sless up``, ``sless-api``, ``sless-events``).

:meth:`ApiConfig.from_env` is the only reader of the environment: each entry point calls it once at
start-up and passes the object (or the sub-config a module needs) down; no other module reads
``os.environ``. Every variable is in the README's configuration table, and every bad value stops the
start with one line naming the variable (:class:`sless_core.envconfig.ConfigError`).

The sub-configs live beside the code they configure (auth, storage, secrets, kube, events, sandbox,
retention, logging); this module composes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sless_api.auth import AuthConfig, load_public_key
from sless_api.backends.settings import KubeSettings, PlatformSettings, RetentionPolicy, SandboxSettings, TenantLimits
from sless_api.gateway.limits import ServerLimits
from sless_api.logsetup import LogSettings
from sless_api.services.asynccalls.settings import AsyncSettings
from sless_api.services.events.config import EventsConfig
from sless_api.stores.code.factory import StorageSettings
from sless_api.stores.secrets.settings import SecretsSettings
from sless_core.envconfig import ConfigError, EnvReader

BACKENDS = ("standalone", "kubernetes")

MIB = 1024 * 1024
# Function responses get an opaque origin: a function's page cannot read the console's storage or call the
# API with the console's token, though both are served from the same host.
DEFAULT_FUNCTION_CSP = "sandbox allow-scripts allow-forms allow-popups allow-downloads"


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
    tenant_limits: TenantLimits = field(default_factory=TenantLimits)
    async_calls: AsyncSettings = field(default_factory=AsyncSettings)
    tenant_max_concurrency: int = 0  # 0: no tenant-wide limit
    concurrency_queue_max: int = 100
    concurrency_queue_wait_sec: float = 10.0
    stream_max_sec: float = 3600.0  # a streamed /fn response is cut after this long, however busy
    warm_spares: int = 1  # standalone: pre-started Python runtime processes per tenant (0: none)

    @property
    def drain_sec(self) -> float:
        """How long a call through this API may last at most: a function's longest timeout plus the proxy's
        margin, or a stream's longest life, whichever is longer. A stopping server waits that long for its
        calls in flight (the chart's ``sless.api.drainSec`` is the same sum)."""
        return max(self.max_timeout_sec + self.proxy_timeout_margin_sec, self.stream_max_sec)

    def platform_settings(self) -> PlatformSettings:
        """The part of this config a backend is told (``backends.settings.PlatformSettings``)."""
        return PlatformSettings(
            data_dir=self.data_dir, max_timeout_sec=self.max_timeout_sec, max_body_bytes=self.max_body_bytes,
            proxy_timeout_margin_sec=self.proxy_timeout_margin_sec, idle_timeout_sec=self.idle_timeout_sec,
            rabbitmq_url=self.rabbitmq_url, secrets=self.secrets, kube=self.kube, events=self.events,
            sandbox=self.sandbox, retention=self.retention, warm_spares=self.warm_spares,
            tenant_limits=self.tenant_limits)

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
                tenant_limits=TenantLimits.from_env(source),
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
