"""What one server process allows its HTTP clients (connections, header size and time, keep-alive)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sless_core.envconfig import ConfigError, EnvReader


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
