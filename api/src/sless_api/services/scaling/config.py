"""``sless-scaler``'s typed configuration, read once from the environment (the table is in sless_api.main.scaler)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sless_core.envconfig import ConfigError, EnvReader

#: A token shorter than this is refused: it guards the load that scales every tenant's functions.
MIN_TOKEN_CHARS = 16


def read_token(reader: EnvReader) -> str:
    """The report token, for the scaler and its reporters alike: ``SLESS_SCALER_TOKEN_FILE``'s content (the file
    wins), else ``SLESS_SCALER_TOKEN``; "" when neither is set."""
    token_file = reader.optional("SLESS_SCALER_TOKEN_FILE")
    if not token_file:
        return (reader.optional("SLESS_SCALER_TOKEN") or "").strip()
    try:
        return Path(token_file).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"SLESS_SCALER_TOKEN_FILE: cannot read {token_file}: {exc.strerror}") from None


@dataclass(frozen=True)
class ScalerConfig:
    """Every knob of the scaler."""

    #: The bearer token report senders must present (``authorization: Bearer <token>``).
    token: str = field(repr=False)
    #: ``host:port`` the gRPC server listens on (KEDA's calls, the reports, the health service).
    listen: str = "0.0.0.0:9090"
    #: The ttl of a report that names none (``ttl_ms`` 0).
    report_ttl_sec: float = 5.0
    #: The longest ttl a report may ask for (a longer one is cut to this).
    max_ttl_sec: float = 60.0
    #: Live reporters kept at most (API and event processes); a new one past it is refused.
    max_reporters: int = 1000
    #: Functions in one report at most.
    max_functions: int = 5000
    #: ``StreamIsActive`` streams open at once at most (KEDA keeps one per scaled function); more: RESOURCE_EXHAUSTED.
    max_streams: int = 10_000
    #: ``StreamIsActive`` resends the current state this often even without a change (keep-alive).
    keepalive_sec: float = 5.0
    #: On SIGTERM, how long calls in progress may finish.
    grace_sec: float = 5.0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ScalerConfig:
        reader = EnvReader(env)
        token = read_token(reader)
        if not reader.optional("SLESS_SCALER_TOKEN_FILE"):
            token = reader.text("SLESS_SCALER_TOKEN", "", required=True)
        if len(token) < MIN_TOKEN_CHARS:
            raise ConfigError(f"the scaler's token (SLESS_SCALER_TOKEN_FILE or SLESS_SCALER_TOKEN) must have at "
                              f"least {MIN_TOKEN_CHARS} characters")
        listen = reader.text("SLESS_SCALER_LISTEN", cls.listen)
        host, sep, port = listen.rpartition(":")
        if not sep or not host or not port.isdigit() or int(port) > 65535:  # 0: any free port
            raise ConfigError(f"SLESS_SCALER_LISTEN must be host:port, got {listen!r}")
        max_ttl = reader.number("SLESS_SCALER_MAX_TTL_SEC", cls.max_ttl_sec, low=1, high=3600)
        return cls(
            token=token,
            listen=listen,
            report_ttl_sec=reader.number("SLESS_SCALER_REPORT_TTL_SEC", cls.report_ttl_sec, low=0.1, high=max_ttl),
            max_ttl_sec=max_ttl,
            max_reporters=reader.integer("SLESS_SCALER_MAX_REPORTERS", cls.max_reporters, low=1, high=100_000),
            max_functions=reader.integer("SLESS_SCALER_MAX_FUNCTIONS", cls.max_functions, low=1, high=100_000),
            max_streams=reader.integer("SLESS_SCALER_MAX_STREAMS", cls.max_streams, low=1, high=1_000_000),
            keepalive_sec=reader.number("SLESS_SCALER_KEEPALIVE_SEC", cls.keepalive_sec, low=0.05, high=300),
            grace_sec=reader.number("SLESS_SCALER_GRACE_SEC", cls.grace_sec, low=0, high=300),
        )
