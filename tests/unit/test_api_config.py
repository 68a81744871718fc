"""The API's one configuration (sless_api.main.config.ApiConfig): defaults, overrides, and every bad value refused
with one line naming the variable, by the parser and by each entry point (sless up, sless-api, sless-events)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sless_api.backends.settings import TenantLimits
from sless_api.main.config import ApiConfig
from sless_core.envconfig import ConfigError

REPO = Path(__file__).resolve().parents[2]


def test_defaults() -> None:
    config = ApiConfig.from_env({"HOME": "/home/u"} | {}, {"SLESS_DATA_DIR": "/data"})
    assert (config.backend, config.data_dir, config.database_url) == ("standalone", Path("/data"),
                                                                      "sqlite:////data/invocations.db")
    assert (config.max_timeout_sec, config.max_body_bytes, config.max_upload_bytes) == (900, 6 << 20, 32 << 20)
    assert config.auth is None and config.events is None and config.rabbitmq_url is None
    assert (config.sandbox.mode, config.sandbox.nproc, config.sandbox.tmp_mb) == ("auto", 1280, 64)
    assert (config.secrets.backend, config.storage.endpoint, config.storage.bucket) == ("local", "", "sless")
    assert (config.logging.level, config.logging.format) == ("INFO", "auto")
    assert (config.serve.bind, config.serve.workers, config.probes.port) == ("127.0.0.1:8090", 2, 8091)
    assert config.server.keep_alive_sec == 5
    assert ApiConfig.from_env({}, keep_alive_default=75).server.keep_alive_sec == 75
    assert (config.retention.versions_kept, config.kube.service_domain) == (3, "svc.cluster.local")
    # the same defaults as the operator's tenant quota on Kubernetes
    assert config.platform_settings().tenant_limits == TenantLimits(functions=100, triggers=200, jobs=200)
    chosen = ApiConfig.from_env({"SLESS_TENANT_MAX_FUNCTIONS": "0", "SLESS_TENANT_MAX_JOBS": "7"})
    assert chosen.platform_settings().tenant_limits == TenantLimits(functions=0, triggers=200, jobs=7)


def test_values_and_overrides_reach_the_sub_configs() -> None:
    env = {"SLESS_BACKEND": "kubernetes", "SLESS_JWT_SECRET": "s" * 32, "SLESS_JWT_ISSUER": "https://idp",
           "SLESS_RABBITMQ_URL": "amqp://mq/", "SLESS_EVENT_PREFETCH": "1", "SLESS_MAX_TIMEOUT_SEC": "60",
           "SLESS_S3_ENDPOINT": "minio:9000", "SLESS_SANDBOX": "bwrap", "SLESS_LOG_LEVEL": "debug",
           "SLESS_WORKERS": "4", "SLESS_KUBE_CODE_FETCH": "no", "KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    config = ApiConfig.from_env(env, {"SLESS_SANDBOX": "off", "SLESS_DATA_DIR": "/d"})
    assert config.backend == "kubernetes" and config.secrets.backend == "kubernetes"
    assert config.auth is not None and config.auth.issuer == "https://idp"
    assert config.events is not None and config.events.prefetch == 1 and config.events.max_call_sec == 65
    assert (config.storage.endpoint, config.sandbox.mode, config.logging.level) == ("minio:9000", "off", "DEBUG")
    assert config.serve.workers == 4 and not config.kube.code_fetch and config.kube.in_cluster
    assert config.data_dir == Path("/d")


def test_sandbox_network_settings() -> None:
    config = ApiConfig.from_env({"SLESS_SANDBOX_NETWORK": "own", "SLESS_SANDBOX_HOST_PORTS": " 6379, 5432,6379,"})
    assert (config.sandbox.network, config.sandbox.host_ports) == ("own", (5432, 6379))
    assert (ApiConfig.from_env({}).sandbox.network, ApiConfig.from_env({}).sandbox.host_ports) == ("auto", ())


def test_secrets_are_kept_out_of_the_repr() -> None:
    env = {"SLESS_JWT_SECRET": "jwt-" + "x" * 32, "SLESS_S3_SECRET_KEY": "s3-secret-value",
           "SLESS_METRICS_TOKEN": "scrape-token", "SLESS_SECRETS_BACKEND": "vault",
           "SLESS_VAULT_ADDR": "http://vault:8200", "SLESS_VAULT_TOKEN": "vault-token-value"}
    text = repr(ApiConfig.from_env(env))
    assert not any(value in text for value in ("jwt-xx", "s3-secret-value", "scrape-token", "vault-token-value"))


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SLESS_BACKEND", "lambda"),
        ("SLESS_MAX_TIMEOUT_SEC", "soon"),
        ("SLESS_MAX_TIMEOUT_SEC", "0"),
        ("SLESS_MAX_UPLOAD_BYTES", "1.5"),
        ("SLESS_MAX_BODY_BYTES", "-1"),
        ("SLESS_PROXY_TIMEOUT_MARGIN_SEC", "x"),
        ("SLESS_IDLE_TIMEOUT_SEC", "nan"),
        ("SLESS_TENANT_MAX_CONCURRENCY", "-1"),
        ("SLESS_TENANT_MAX_FUNCTIONS", "-1"),
        ("SLESS_TENANT_MAX_TRIGGERS", "many"),
        ("SLESS_TENANT_MAX_JOBS", "100001"),
        ("SLESS_CONCURRENCY_QUEUE_MAX", "many"),
        ("SLESS_CONCURRENCY_QUEUE_WAIT_SEC", "-1"),
        ("SLESS_ASYNC_WORKERS", "0"),
        ("SLESS_ASYNC_MAX_RETRIES", "101"),
        ("SLESS_ASYNC_RETRY_BACKOFF_SEC", "0"),
        ("SLESS_ASYNC_RETRY_BACKOFF_MAX_SEC", "0.5"),
        ("SLESS_ASYNC_RESULT_MAX_BYTES", "-1"),
        ("SLESS_ASYNC_RETENTION_SEC", "0"),
        ("SLESS_JWT_LEEWAY_SEC", "-1"),
        ("SLESS_JWT_PUBLIC_KEY", "/nonexistent/key.pem"),
        ("SLESS_JWT_PUBLIC_KEY", "-----BEGIN PUBLIC KEY-----\nnot a key\n-----END PUBLIC KEY-----"),
        ("SLESS_JWKS_URL", "file:///etc/passwd"),
        ("SLESS_SECRETS_BACKEND", "s3"),
        ("SLESS_SECRETS_BACKEND", "kubernetes"),
        ("SLESS_SECRETS_BACKEND", "vault"),
        ("SLESS_SANDBOX", "maybe"),
        ("SLESS_SANDBOX_NPROC", "lots"),
        ("SLESS_SANDBOX_TMP_MB", "0"),
        ("SLESS_SANDBOX_FSIZE_MB", "x"),
        ("SLESS_SANDBOX_NETWORK", "bridge"),
        ("SLESS_SANDBOX_HOST_PORTS", "0"),
        ("SLESS_SANDBOX_HOST_PORTS", "8080,70000"),
        ("SLESS_SANDBOX_HOST_PORTS", "5432;6379"),
        ("SLESS_CODE_VERSIONS_KEPT", "0"),
        ("SLESS_TENANT_CODE_QUOTA_BYTES", "1G"),
        ("SLESS_LOG_LEVEL", "LOUD"),
        ("SLESS_LOG_FORMAT", "xml"),
        ("SLESS_HEADER_TIMEOUT_SEC", "0"),
        ("SLESS_MAX_CONNECTIONS", "0"),
        ("SLESS_MAX_HEADER_BYTES", "100"),
        ("SLESS_KEEPALIVE_SEC", "x"),
        ("SLESS_WORKERS", "0"),
        ("SLESS_EVENTS_PORT", "70000"),
        ("SLESS_KUBE_SERVICE_DOMAIN", "bad domain"),
        ("SLESS_KUBE_REQUEST_TIMEOUT_SEC", "0"),
        ("SLESS_KUBE_CODE_FETCH", "maybe"),
        ("SLESS_RUNTIME_IMAGE_TAG", "x y"),
        ("SLESS_PROXY_STREAM_MAX_SEC", "0"),
        ("SLESS_CALLBACK_ALLOWED_NETS", "10.0.0.0/99"),
        ("SLESS_CALLBACK_ATTEMPTS", "11"),
        ("SLESS_CALLBACK_TIMEOUT_SEC", "x"),
    ],
)
def test_every_bad_value_names_its_variable(name: str, value: str) -> None:
    env = {"SLESS_JWT_SECRET": "s" * 32, name: value}
    with pytest.raises(ConfigError, match=name):
        ApiConfig.from_env(env)


@pytest.mark.parametrize(
    ("name", "value"),
    [("SLESS_EVENT_PREFETCH", "0"), ("SLESS_EVENT_MAX_RETRIES", "x"), ("SLESS_EVENT_DEDUP_WINDOW_SEC", "1"),
     ("SLESS_EVENT_DRAIN_SEC", "-1")],
)
def test_event_knobs_are_checked_when_a_broker_is_set(name: str, value: str) -> None:
    ApiConfig.from_env({name: value})  # no broker: no dispatcher, nothing to check
    with pytest.raises(ConfigError, match=name):
        ApiConfig.from_env({"SLESS_RABBITMQ_URL": "amqp://mq/", name: value})


def run_entry(argv: list[str], extra: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLESS_")} | extra
    return subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [("SLESS_MAX_TIMEOUT_SEC", "soon", "SLESS_MAX_TIMEOUT_SEC must be an integer, got 'soon'"),
     ("SLESS_KUBE_CODE_FETCH", "maybe", "SLESS_KUBE_CODE_FETCH must be true or false, got 'maybe'"),
     ("SLESS_BACKEND", "lambda", "SLESS_BACKEND must be one of standalone, kubernetes, got 'lambda'")],
)
@pytest.mark.parametrize("entry", ["up", "api", "events"])
def test_each_entry_point_refuses_a_bad_value_in_one_line(entry: str, name: str, value: str, message: str,
                                                          tmp_path: Path) -> None:
    argv = {"up": [sys.executable, "-m", "sless_api", "up", "--port", "1", "--data-dir", str(tmp_path / "d")],
            "api": [sys.executable, "-c", "import sys, sless_api.main.serve as s; sys.exit(s.main())"],
            "events": [sys.executable, "-m", "sless_api.main.events"]}[entry]
    extra = {name: value, "SLESS_JWT_SECRET": "s" * 32, "SLESS_RABBITMQ_URL": "amqp://127.0.0.1:1/",
             "SLESS_DATABASE_URL": "postgresql://127.0.0.1:1/x"}
    done = run_entry(argv, extra, tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.rstrip().endswith(message)
