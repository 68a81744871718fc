"""The API's one typed configuration, read from the environment (every variable is in the README's table)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

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
