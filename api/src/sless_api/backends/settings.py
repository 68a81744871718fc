"""The settings of the two backends, read with the API's config (``sless_api.main.config``).

They live outside ``sless_api.backends.kube`` and ``sless_api.backends.standalone`` so that the config, which the
backend-free modules (the proxy, cron, the event dispatchers, async calls) import, imports no backend.

Kubernetes backend:

| variable | default | meaning |
|---|---|---|
| ``KUBECONFIG`` | in-cluster, else ``~/.kube/config`` | how the API reaches the API server |
| ``SLESS_KUBE_CONTEXT`` | current context | context to use from ``KUBECONFIG`` |
| ``SLESS_KUBE_SERVICE_DOMAIN`` | ``svc.cluster.local`` | function URL: ``http://<fn>.<ns>.<suffix>:8080`` |
| ``SLESS_KUBE_REQUEST_TIMEOUT_SEC`` | ``30`` | bound of one API request (a hung server: 503) |
| ``SLESS_KUBE_WATCH_TIMEOUT_SEC`` | ``240`` | length of one route-table watch before renewal |
| ``SLESS_RUNTIME_IMAGE_PREFIX`` | ``sless`` | build base images ``<prefix>/<runtime>:<tag>`` |
| ``SLESS_RUNTIME_IMAGE_TAG`` | ``latest`` | tag of those base images |
| ``SLESS_GO_RUN_IMAGE`` | ``gcr.io/distroless/static-debian12:nonroot`` | image a Go function's binary runs on |
| ``SLESS_KUBE_CODE_FETCH`` | ``true`` | pods fetch Python/Node code at start; ``false``: an image per change |
| ``SLESS_KUBE_TENANT_ROLE`` | (none) | ClusterRole the API binds to itself per tenant namespace |
| ``SLESS_KUBE_SERVICE_ACCOUNT`` | (none) | ``<namespace>:<name>``: the API's own, bound there |
| ``SLESS_ACTIVATION_TIMEOUT_SEC`` | ``120`` | a call to a function at zero waits this long for a ready pod (then 503) |
| ``SLESS_KUBE_ROUTING`` | ``service`` | ``endpoints``: to ready pods, fewest in flight first; ``service``: its VIP |
| ``SLESS_SCALER_ADDRESS`` | (none) | ``host:port`` of ``sless-scaler``, told the calls per function; none: not told |
| ``SLESS_SCALER_TOKEN_FILE`` | (none) | file with the scaler's report token (or ``SLESS_SCALER_TOKEN``) |
| ``SLESS_ACTIVATION_QUEUE`` | ``200`` | calls one API process holds per function at zero; more get 503 at once |

Standalone backend: ``SLESS_SANDBOX``, ``SLESS_SANDBOX_*`` (:class:`SandboxSettings`),
``SLESS_CODE_VERSIONS_KEPT``, ``SLESS_TENANT_CODE_QUOTA_BYTES`` (:class:`RetentionPolicy`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sless_api.services.events.config import EventsConfig
    from sless_api.stores.secrets.settings import SecretsSettings

from sless_api.services.scaling.config import read_token
from sless_core.buildcontext import GO_RUN_IMAGE
from sless_core.envconfig import ConfigError, EnvReader
from sless_core.models import RUNTIMES

_DOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_IMAGE_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-/:]*\Z")
FUNCTION_PORT = 8080
ROUTINGS = ("service", "endpoints")


@dataclass(frozen=True)
class KubeSettings:
    kubeconfig: str | None = None
    context: str | None = None
    service_domain: str = "svc.cluster.local"
    request_timeout_sec: float = 30.0
    watch_timeout_sec: float = 240.0
    runtime_image_prefix: str = "sless"
    runtime_image_tag: str = "latest"
    go_run_image: str = GO_RUN_IMAGE
    code_fetch: bool = True
    #: The ClusterRole bound per tenant namespace (``sless_api.backends.kube.access``); empty: no binding is made.
    tenant_role: str = ""
    #: ``(namespace, name)`` of the API's own ServiceAccount, the subject of those bindings.
    service_account: tuple[str, str] | None = None
    #: In a pod (``KUBERNETES_SERVICE_HOST`` set): without ``KUBECONFIG`` the service account is used.
    in_cluster: bool = False
    #: A call to a scaled function with no ready pod waits this long for one (``kube.activator``).
    activation_timeout_sec: float = 120.0
    #: Calls one process holds per function while it has no ready pod; the next ones are refused (503).
    activation_queue: int = 200
    #: ``endpoints``: calls go to ready pods picked by the API (``kube.activator``); ``service``: to the Service
    routing: str = "service"
    #: ``host:port`` of ``sless-scaler`` (``services.scaling``), which this process tells its calls per function
    #: (KEDA scales on them); empty: no reports (functions with ``scale`` then only wake by KEDA's own polling)
    scaler_address: str = ""
    scaler_token: str = field(default="", repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> KubeSettings:
        source, reader = env, EnvReader(env)
        domain = (source.get("SLESS_KUBE_SERVICE_DOMAIN") or cls.service_domain).strip().strip(".").lower()
        if not _DOMAIN.match(domain):
            raise ValueError(f"SLESS_KUBE_SERVICE_DOMAIN must be a DNS suffix (svc.cluster.local), got {domain!r}")
        prefix = (source.get("SLESS_RUNTIME_IMAGE_PREFIX") or cls.runtime_image_prefix).strip().rstrip("/")
        tag = (source.get("SLESS_RUNTIME_IMAGE_TAG") or cls.runtime_image_tag).strip()
        go_run = (source.get("SLESS_GO_RUN_IMAGE") or cls.go_run_image).strip()
        for key, value in (("SLESS_RUNTIME_IMAGE_PREFIX", prefix), ("SLESS_RUNTIME_IMAGE_TAG", tag),
                           ("SLESS_GO_RUN_IMAGE", go_run)):
            if not _IMAGE_PART.match(value):
                raise ValueError(f"{key} must be part of an image reference, got {value!r}")
        tenant_role, service_account = _tenant_binding(source)
        return cls(
            kubeconfig=source.get("KUBECONFIG") or None,
            context=source.get("SLESS_KUBE_CONTEXT") or None,
            service_domain=domain,
            request_timeout_sec=reader.number("SLESS_KUBE_REQUEST_TIMEOUT_SEC", cls.request_timeout_sec, low=0.1),
            watch_timeout_sec=reader.number("SLESS_KUBE_WATCH_TIMEOUT_SEC", cls.watch_timeout_sec, low=0.1),
            runtime_image_prefix=prefix,
            runtime_image_tag=tag,
            go_run_image=go_run,
            code_fetch=reader.boolean("SLESS_KUBE_CODE_FETCH", cls.code_fetch),
            in_cluster=bool(reader.optional("KUBERNETES_SERVICE_HOST")),
            tenant_role=tenant_role,
            service_account=service_account,
            activation_timeout_sec=reader.number("SLESS_ACTIVATION_TIMEOUT_SEC", cls.activation_timeout_sec,
                                                 low=1, high=3600),
            activation_queue=reader.integer("SLESS_ACTIVATION_QUEUE", cls.activation_queue, low=1, high=100_000),
            routing=reader.choice("SLESS_KUBE_ROUTING", cls.routing, ROUTINGS),
            **_scaler(reader),
        )

    def base_image(self, runtime: str) -> str:
        """The image a function's generated Dockerfile starts ``FROM``."""
        if runtime not in RUNTIMES:
            raise ValueError(f"unknown runtime {runtime!r}")
        return f"{self.runtime_image_prefix}/{runtime}:{self.runtime_image_tag}"

    def service_url(self, namespace: str, name: str) -> str:
        """Where the operator's Service of a function answers inside the cluster."""
        return f"http://{name}.{namespace}.{self.service_domain}:{FUNCTION_PORT}"


def _scaler(reader: EnvReader) -> dict[str, str]:
    """The scaler's address and report token (from ``SLESS_SCALER_TOKEN_FILE``, else ``SLESS_SCALER_TOKEN``)."""
    address = (reader.optional("SLESS_SCALER_ADDRESS") or "").strip()
    if not address:
        return {}
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"SLESS_SCALER_ADDRESS must be host:port, got {address!r}")
    token = read_token(reader)
    if not token:
        raise ConfigError("SLESS_SCALER_ADDRESS needs the scaler's token: set SLESS_SCALER_TOKEN_FILE "
                          "or SLESS_SCALER_TOKEN")
    return {"scaler_address": address, "scaler_token": token}


_ROLE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\Z")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")


def _tenant_binding(source: Mapping[str, str]) -> tuple[str, tuple[str, str] | None]:
    """``SLESS_KUBE_TENANT_ROLE`` and ``SLESS_KUBE_SERVICE_ACCOUNT``: both or neither, since a binding needs
    the role and the subject it binds it to."""
    role = (source.get("SLESS_KUBE_TENANT_ROLE") or "").strip()
    account = (source.get("SLESS_KUBE_SERVICE_ACCOUNT") or "").strip()
    if not role and not account:
        return "", None
    if not role or not account:
        raise ConfigError("SLESS_KUBE_TENANT_ROLE and SLESS_KUBE_SERVICE_ACCOUNT must be set together")
    if not _ROLE.match(role):
        raise ConfigError(f"SLESS_KUBE_TENANT_ROLE must be a ClusterRole name, got {role!r}")
    namespace, sep, name = account.partition(":")
    if not sep or not _LABEL.match(namespace) or not _ROLE.match(name):
        raise ConfigError(f"SLESS_KUBE_SERVICE_ACCOUNT must be <namespace>:<name>, got {account!r}")
    return role, (namespace, name)


MODES = ("auto", "bwrap", "off")
NETWORKS = ("auto", "own", "host")


@dataclass(frozen=True)
class SandboxSettings:
    """The host-wide sandbox knobs (``SLESS_SANDBOX``, ``SLESS_SANDBOX_*``), read once with the API's config."""

    mode: str = "auto"
    tmp_mb: int = 64
    #: 1,000 handler threads of a Python runtime whose calls block (each a task), and room for the rest
    nproc: int = 1280
    fsize_mb: int = 256
    #: ``SLESS_SANDBOX_NETWORK``: auto (a namespace of its own per function as root), own (required), host.
    network: str = "auto"
    #: ``SLESS_SANDBOX_HOST_PORTS``: host loopback ports functions may reach from their own namespace.
    host_ports: tuple[int, ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> SandboxSettings:
        reader = EnvReader(env)
        mode = reader.raw("SLESS_SANDBOX")
        aliases = {"0": "off", "false": "off", "none": "off", "on": "bwrap", "1": "bwrap", "true": "bwrap"}
        chosen = aliases.get((mode or "").lower(), (mode or cls.mode).lower())
        if chosen not in MODES:
            raise ConfigError(f"SLESS_SANDBOX must be one of auto, bwrap, off, got {mode!r}")
        return cls(
            mode=chosen,
            tmp_mb=reader.integer("SLESS_SANDBOX_TMP_MB", cls.tmp_mb, 1, 1 << 20),
            nproc=reader.integer("SLESS_SANDBOX_NPROC", cls.nproc, 1, 1 << 22),
            fsize_mb=reader.integer("SLESS_SANDBOX_FSIZE_MB", cls.fsize_mb, 1, 1 << 30),
            network=reader.choice("SLESS_SANDBOX_NETWORK", cls.network, NETWORKS),
            host_ports=_ports(reader.raw("SLESS_SANDBOX_HOST_PORTS") or ""),
        )


def _ports(text: str) -> tuple[int, ...]:
    """A comma-separated list of TCP ports (1-65535), e.g. ``8080,5432``; empty for none."""
    ports: set[int] = set()
    for item in filter(None, (part.strip() for part in text.split(","))):
        if not item.isdigit() or not 1 <= int(item) <= 65535:
            raise ConfigError(f"SLESS_SANDBOX_HOST_PORTS must be comma-separated ports 1-65535, got {item!r}")
        ports.add(int(item))
    return tuple(sorted(ports))


GIB = 1024**3


@dataclass(frozen=True)
class RetentionPolicy:
    """``SLESS_CODE_VERSIONS_KEPT`` versions per function, ``SLESS_TENANT_CODE_QUOTA_BYTES`` per tenant."""

    versions_kept: int = 3
    tenant_quota_bytes: int = GIB

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> RetentionPolicy:
        reader = EnvReader(env)
        return cls(reader.integer("SLESS_CODE_VERSIONS_KEPT", cls.versions_kept, low=1),
                   reader.integer("SLESS_TENANT_CODE_QUOTA_BYTES", cls.tenant_quota_bytes, low=1))


@dataclass(frozen=True)
class TenantLimits:
    """How many functions, triggers and jobs one tenant may have on ``sless up`` (0: no limit), the same defaults as
    the operator's ResourceQuota on Kubernetes (``SLESS_TENANT_QUOTA_*``), where the API server enforces them."""

    functions: int = 100
    triggers: int = 200
    jobs: int = 200

    #: the variable of each limit, as a refusal names it (the same names ``from_env`` reads)
    ENV = {"functions": "SLESS_TENANT_MAX_FUNCTIONS", "triggers": "SLESS_TENANT_MAX_TRIGGERS",
           "jobs": "SLESS_TENANT_MAX_JOBS"}  # fmt: skip

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> TenantLimits:
        reader = EnvReader(env)
        return cls(reader.integer("SLESS_TENANT_MAX_FUNCTIONS", cls.functions, 0, 100_000),
                   reader.integer("SLESS_TENANT_MAX_TRIGGERS", cls.triggers, 0, 100_000),
                   reader.integer("SLESS_TENANT_MAX_JOBS", cls.jobs, 0, 100_000))


@dataclass(frozen=True)
class PlatformSettings:
    """What a backend is told by its process's configuration: the composition root (``main``) builds it from the
    API's config, and a backend reads nothing else, so it never depends on the whole config."""

    data_dir: Path
    max_timeout_sec: int
    max_body_bytes: int
    proxy_timeout_margin_sec: float
    idle_timeout_sec: float
    rabbitmq_url: str | None
    secrets: SecretsSettings
    kube: KubeSettings
    events: EventsConfig | None
    sandbox: SandboxSettings
    retention: RetentionPolicy
    warm_spares: int
    tenant_limits: TenantLimits = field(default_factory=TenantLimits)
