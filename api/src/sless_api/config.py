"""The API's one typed configuration, read from the environment (every variable is in the README's table)."""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sless_api.asynccalls.callback import CallbackPolicy

MIB = 1024 * 1024
# Function responses get an opaque origin: a function's page cannot read the console's storage or call the
# API with the console's token, though both are served from the same host.
DEFAULT_FUNCTION_CSP = "sandbox allow-scripts allow-forms allow-popups allow-downloads"


def _int(env: Mapping[str, str], key: str, default: int) -> int:
    raw = env.get(key)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ValueError(f"{key} must be an integer, got {raw!r}") from exc


def _float(env: Mapping[str, str], key: str, default: float) -> float:
    raw = env.get(key)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise ValueError(f"{key} must be a number, got {raw!r}") from exc


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
        settings = cls(
            workers=_int(env, "SLESS_ASYNC_WORKERS", cls.workers),
            max_retries=_int(env, "SLESS_ASYNC_MAX_RETRIES", cls.max_retries),
            backoff_sec=_float(env, "SLESS_ASYNC_RETRY_BACKOFF_SEC", cls.backoff_sec),
            backoff_max_sec=_float(env, "SLESS_ASYNC_RETRY_BACKOFF_MAX_SEC", cls.backoff_max_sec),
            result_max_bytes=_int(env, "SLESS_ASYNC_RESULT_MAX_BYTES", cls.result_max_bytes),
            retention_sec=_float(env, "SLESS_ASYNC_RETENTION_SEC", cls.retention_sec),
            callback_policy=CallbackPolicy(
                allowed_nets=CallbackPolicy.parse_nets(env.get("SLESS_CALLBACK_ALLOWED_NETS", "")),
                timeout_sec=_float(env, "SLESS_CALLBACK_TIMEOUT_SEC", CallbackPolicy.timeout_sec),
                attempts=_int(env, "SLESS_CALLBACK_ATTEMPTS", CallbackPolicy.attempts)),
        )
        if not (0 < settings.callback_policy.timeout_sec <= 300 and 1 <= settings.callback_policy.attempts <= 10):
            raise ValueError("SLESS_CALLBACK_*: timeout 0..300 s, attempts 1..10")
        if not (1 <= settings.workers <= 1000 and 0 <= settings.max_retries <= 100 and settings.backoff_sec > 0
                and settings.backoff_max_sec >= settings.backoff_sec and settings.result_max_bytes >= 0
                and settings.retention_sec > 0):
            raise ValueError("SLESS_ASYNC_*: workers 1..1000, retries 0..100, backoff > 0 and <= its maximum, "
                             "result size >= 0, retention > 0")
        return settings

    def backoff(self, attempts: int) -> float:
        """Delay before the next attempt: doubling from backoff_sec, capped, ±20 % so retries spread."""
        delay = min(self.backoff_max_sec, self.backoff_sec * 2 ** max(0, attempts - 1))
        return float(delay * random.uniform(0.8, 1.2))


@dataclass(frozen=True)
class ApiConfig:
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
    function_csp: str = DEFAULT_FUNCTION_CSP
    metrics_token: str = ""  # empty: /metrics answers 404
    async_calls: AsyncSettings = AsyncSettings()
    tenant_max_concurrency: int = 0  # 0: no tenant-wide limit
    concurrency_queue_max: int = 100
    concurrency_queue_wait_sec: float = 10.0
    stream_max_sec: float = 3600.0  # a streamed /fn response is cut after this long, however busy

    def __post_init__(self) -> None:
        if not self.stream_max_sec > 0:
            raise ValueError("SLESS_PROXY_STREAM_MAX_SEC must be a positive number of seconds")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, data_dir: Path | None = None) -> ApiConfig:
        env = os.environ if env is None else env
        data = data_dir or Path(env.get("SLESS_DATA_DIR") or Path.home() / ".local/share/sless")
        return cls(
            backend=env.get("SLESS_BACKEND", "standalone"),
            data_dir=data,
            database_url=env.get("SLESS_DATABASE_URL") or f"sqlite:///{data / 'invocations.db'}",
            max_upload_bytes=_int(env, "SLESS_MAX_UPLOAD_BYTES", 32 * MIB),
            max_timeout_sec=_int(env, "SLESS_MAX_TIMEOUT_SEC", 900),
            max_body_bytes=_int(env, "SLESS_MAX_BODY_BYTES", 6 * MIB),
            proxy_timeout_margin_sec=_float(env, "SLESS_PROXY_TIMEOUT_MARGIN_SEC", 5.0),
            idle_timeout_sec=_float(env, "SLESS_IDLE_TIMEOUT_SEC", 300.0),
            rabbitmq_url=env.get("SLESS_RABBITMQ_URL") or None,
            public_url=env.get("SLESS_PUBLIC_URL", ""),
            function_csp=env.get("SLESS_FUNCTION_CSP", DEFAULT_FUNCTION_CSP).strip(),
            metrics_token=env.get("SLESS_METRICS_TOKEN", "").strip(),
            async_calls=AsyncSettings.from_env(env),
            tenant_max_concurrency=_int(env, "SLESS_TENANT_MAX_CONCURRENCY", 0),
            concurrency_queue_max=_int(env, "SLESS_CONCURRENCY_QUEUE_MAX", 100),
            concurrency_queue_wait_sec=_float(env, "SLESS_CONCURRENCY_QUEUE_WAIT_SEC", 10.0),
            stream_max_sec=_float(env, "SLESS_PROXY_STREAM_MAX_SEC", 3600.0),
        )


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
            raise ValueError("SLESS_HEADER_TIMEOUT_SEC must be a positive number of seconds")
        if self.max_connections < 1:
            raise ValueError("SLESS_MAX_CONNECTIONS must be at least 1")
        if self.max_header_bytes < 1024:
            raise ValueError("SLESS_MAX_HEADER_BYTES must be at least 1024")
        if self.keep_alive_sec < 1:
            raise ValueError("SLESS_KEEPALIVE_SEC must be at least 1")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, keep_alive_default: int = 5) -> ServerLimits:
        env = os.environ if env is None else env
        return cls(
            header_timeout_sec=_float(env, "SLESS_HEADER_TIMEOUT_SEC", 10.0),
            max_connections=_int(env, "SLESS_MAX_CONNECTIONS", 1000),
            max_header_bytes=_int(env, "SLESS_MAX_HEADER_BYTES", 64 * 1024),
            keep_alive_sec=_int(env, "SLESS_KEEPALIVE_SEC", keep_alive_default),
        )
