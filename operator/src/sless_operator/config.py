"""The operator's configuration: one typed object, read once from the environment.

Every variable is optional and listed in the README's configuration table ("Operator"); the defaults suit
a chart install into ``sless-system``. A bad value stops the operator at start-up with one line naming the
variable (``sless_core.envconfig``), instead of surfacing later as a broken Job.

Code fetched at start. Python and Node functions run their runtime's image (or the tenant's
dependency image, ``<prefix>/<ns>/deps:<key>``, built once per manifest) with the code in an
emptyDir that the ``fetch-code`` init container fills: it downloads the code archive through a
URL the operator signs for exactly that object (kept in the Secret ``sless-code-<fn>`` in the
tenant namespace, renewed without a rollout) and checks its SHA-256. Function pods hold no S3
credential: a pod can read its own code and nothing else. The operator needs create and patch
on Secrets for this (never get or list). Tenant pods may reach the S3 endpoint (NetworkPolicy
``sless-allow-code-fetch``) when ``SLESS_S3_ENDPOINT`` is an IP address; a host name cannot be a
NetworkPolicy peer, so list its addresses in ``SLESS_FUNCTION_EGRESS_CIDRS`` then.

Build Jobs and credentials. ``SLESS_BUILD_FETCH_IMAGE`` runs the ``fetch-context`` init container
(``python -m sless_operator.contextfetch``) and the ``push-image`` step (``sless_operator.imagepush``):
they need Python, the minio client, requests and this package, which the platform image has (the chart
passes its own image). ``fetch-context`` alone receives the S3 Secret and unpacks the context into an
emptyDir; kaniko, which runs the tenant's Dockerfile steps (``pip install``, ``npm install``: setup.py and
install scripts) as root, builds from there into an image tarball (``--no-push``) and holds no
credential; ``push-image`` then pushes the tarball with ``SLESS_BUILD_REGISTRY_SECRET`` mounted in it
alone, and runs no tenant code. So the push credential may keep push rights below ``SLESS_REGISTRY``
without a tenant being able to read it.

The layer cache (``SLESS_BUILD_CACHE``, ``<prefix>/cache``) is pushed by kaniko itself while it builds. A
registry without credentials keeps it as configured. With ``SLESS_BUILD_REGISTRY_SECRET`` set, kaniko has
no credential to push cache layers with, so the cache is off unless ``SLESS_BUILD_KANIKO_SECRET`` names a
dockerconfigjson Secret that kaniko gets at ``/kaniko/.docker`` (for the cache and for base images behind
a login): every build step can read that one, so give it pull rights on the runtime images and push
rights on ``<prefix>/cache`` only, never the push Secret itself (refused at start). The cache is shared
between tenants: whoever may push there can poison another tenant's cached layers, so leave it off where
tenants do not trust each other. The build namespace's NetworkPolicies (chart ``build.networkPolicy``)
keep build pods away from everything but the registry, S3, DNS and the package registries listed.

Scaling on demand. A Function with ``scale`` gets a KEDA ScaledObject (``sless_operator.autoscale``) whose
one trigger is KEDA's ``external-push`` scaler at ``SLESS_SCALER_ADDRESS`` (the platform's ``sless-scaler``,
which the API processes feed with their calls in flight). ``SLESS_KEDA_API_VERSION`` is the ScaledObject's
API version; where the cluster does not serve it (KEDA not installed), scaled Functions fail and others run.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass

from sless_core.envconfig import ConfigError, EnvReader
from sless_core.models import SANDBOXES
from sless_core.naming import DNS1123_LABEL
from sless_core.release import platform_version, semver

_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?\Z")
_IMAGE = re.compile(r"^[a-z0-9][a-z0-9._\-/:@]*\Z")
_HOST = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9.]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])\Z")
_API_VERSION = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/v[0-9]+((alpha|beta)[0-9]+)?\Z")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?\Z")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?\Z")


_FLAG = re.compile(r"^--[a-z0-9][a-z0-9-]*(=[\x21-\x7e]+)?\Z")
# What the build's own correctness and confinement depend on: where it reads, what it builds, where it pushes
# (kaniko never pushes: it leaves a tarball for the push step).
RESERVED_KANIKO_FLAGS = frozenset({"--context", "--dockerfile", "--destination", "--cache-repo", "--no-push",
                                   "--tar-path"})  # fmt: skip


@dataclass(frozen=True)
class OperatorConfig:
    registry: str = "registry.sless-system.svc:5000/sless"
    registry_insecure: bool = False
    kaniko_image: str = "gcr.io/kaniko-project/executor:v1.23.2"
    build_namespace: str = "sless-build"
    build_fetch_image: str = f"ghcr.io/sless-dev/sless:{semver(platform_version())}"  # the chart's default too
    build_s3_secret: str = "sless-build-s3"  # noqa: S105  (a Secret's name, not a secret)
    build_registry_secret: str = ""
    build_kaniko_secret: str = ""  # a credential kaniko (and so the tenant's build steps) can read: cache only
    s3_endpoint: str = ""
    s3_bucket: str = "sless"
    s3_region: str = "us-east-1"
    s3_access_key: str = ""
    s3_secret_key: str = ""
    code_url_ttl_sec: int = 7 * 86400
    runtime_image_prefix: str = "sless"
    runtime_image_tag: str = "latest"
    go_run_image: str = "gcr.io/distroless/static-debian12:nonroot"
    build_deadline_sec: int = 900
    build_retries: int = 2
    build_cpu: str = "1"
    build_memory_mb: int = 2048
    build_cache: bool = True
    kaniko_extra_args: tuple[str, ...] = ()
    job_retries: int = 1
    job_ttl_sec: int = 86400
    image_pull_secret: str = ""
    platform_namespace: str = "sless-system"
    function_egress_cidrs: tuple[str, ...] = ()
    tenant_quota_pods: int = 50
    tenant_quota_cpu: str = "8"
    tenant_quota_memory: str = "16Gi"
    tenant_quota_functions: int = 100
    tenant_quota_triggers: int = 200
    tenant_quota_jobs: int = 200
    tenant_quota_secrets: int = 200  # the tenant's own and one sless-code-<fn> per function
    tenant_quota_storage: str = "0"  # requests.storage of PersistentVolumeClaims: the platform makes none
    dns_namespace: str = "kube-system"
    dns_pod_labels: tuple[tuple[str, str], ...] = (("k8s-app", "kube-dns"),)
    dns_cidrs: tuple[str, ...] = ()
    watch_timeout_sec: int = 60
    api_concurrency: int = 32
    metrics_token: str = ""  # empty: no metrics endpoint
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 8082
    official_client: bool = False  # allow the official kubernetes client (its exec/auth-provider plugins)
    leader_election: bool = False  # replicas take turns through a Lease (leader.py); off: this process is the only one
    lease_sec: int = 15  # how long a silent holder keeps the Lease before a standby takes it over
    # The stronger sandbox (sless_core.models.SANDBOXES): the RuntimeClass a function's pods run under when it asks
    # for gVisor, and the sandbox every function pod must run in whatever the function asks ("": only those that ask).
    sandbox_runtime_class: str = "gvisor"
    require_sandbox: str = ""
    # Demand-driven scaling (a Function's ``scale``) through KEDA: the address (host:port) of the platform's
    # external-push scaler that each ScaledObject names, and the API version of KEDA's ScaledObject.
    scaler_address: str = "sless-scaler.sless-system.svc:9090"
    keda_api_version: str = "keda.sh/v1alpha1"

    def __post_init__(self) -> None:
        if self.build_kaniko_secret and self.build_kaniko_secret == self.build_registry_secret:
            raise ConfigError("SLESS_BUILD_KANIKO_SECRET must not be the push credential SLESS_BUILD_REGISTRY_SECRET: "
                              "kaniko runs the tenants' build steps, which can read it")  # fmt: skip

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> OperatorConfig:
        """Read every ``SLESS_*`` variable of the README's operator table; unset ones keep their defaults."""
        reader = _Reader(env)
        return cls(
            registry=reader.image("SLESS_REGISTRY", cls.registry).rstrip("/"),
            registry_insecure=reader.boolean("SLESS_REGISTRY_INSECURE", cls.registry_insecure),
            kaniko_image=reader.image("SLESS_KANIKO_IMAGE", cls.kaniko_image),
            build_namespace=reader.label("SLESS_BUILD_NAMESPACE", cls.build_namespace),
            build_fetch_image=reader.image("SLESS_BUILD_FETCH_IMAGE", cls.build_fetch_image),
            build_s3_secret=reader.label("SLESS_BUILD_S3_SECRET", cls.build_s3_secret),
            build_registry_secret=reader.label("SLESS_BUILD_REGISTRY_SECRET", "", optional=True),
            build_kaniko_secret=reader.label("SLESS_BUILD_KANIKO_SECRET", "", optional=True),
            s3_endpoint=reader.text("SLESS_S3_ENDPOINT", cls.s3_endpoint),
            s3_bucket=reader.text("SLESS_S3_BUCKET", cls.s3_bucket, required=True),
            s3_region=reader.text("SLESS_S3_REGION", cls.s3_region, required=True),
            s3_access_key=reader.text("SLESS_S3_ACCESS_KEY", ""),
            s3_secret_key=reader.text("SLESS_S3_SECRET_KEY", ""),
            # SigV4 presigned URLs last at most 7 days
            code_url_ttl_sec=reader.integer("SLESS_CODE_URL_TTL_SEC", cls.code_url_ttl_sec, 3600, 7 * 86400),
            runtime_image_prefix=reader.image("SLESS_RUNTIME_IMAGE_PREFIX", cls.runtime_image_prefix).rstrip("/"),
            runtime_image_tag=reader.image("SLESS_RUNTIME_IMAGE_TAG", cls.runtime_image_tag),
            go_run_image=reader.image("SLESS_GO_RUN_IMAGE", cls.go_run_image),
            build_deadline_sec=reader.integer("SLESS_BUILD_DEADLINE_SEC", cls.build_deadline_sec, 60, 86400),
            build_retries=reader.integer("SLESS_BUILD_RETRIES", cls.build_retries, 0, 10),
            build_cpu=reader.quantity("SLESS_BUILD_CPU", cls.build_cpu),
            build_memory_mb=reader.integer("SLESS_BUILD_MEMORY_MB", cls.build_memory_mb, 256, 65536),
            build_cache=reader.boolean("SLESS_BUILD_CACHE", cls.build_cache),
            kaniko_extra_args=reader.flags("SLESS_KANIKO_EXTRA_ARGS", RESERVED_KANIKO_FLAGS),
            job_retries=reader.integer("SLESS_JOB_RETRIES", cls.job_retries, 0, 5),
            job_ttl_sec=reader.integer("SLESS_JOB_TTL_SEC", cls.job_ttl_sec, 60, 30 * 86400),
            image_pull_secret=reader.label("SLESS_IMAGE_PULL_SECRET", "", optional=True),
            platform_namespace=reader.label("SLESS_PLATFORM_NAMESPACE", cls.platform_namespace),
            function_egress_cidrs=reader.cidrs("SLESS_FUNCTION_EGRESS_CIDRS"),
            tenant_quota_pods=reader.integer("SLESS_TENANT_QUOTA_PODS", cls.tenant_quota_pods, 1, 100000),
            tenant_quota_cpu=reader.quantity("SLESS_TENANT_QUOTA_CPU", cls.tenant_quota_cpu),
            tenant_quota_memory=reader.quantity("SLESS_TENANT_QUOTA_MEMORY", cls.tenant_quota_memory),
            tenant_quota_functions=reader.integer("SLESS_TENANT_QUOTA_FUNCTIONS", cls.tenant_quota_functions, 0,
                                                  100000),
            tenant_quota_triggers=reader.integer("SLESS_TENANT_QUOTA_TRIGGERS", cls.tenant_quota_triggers, 0, 100000),
            tenant_quota_jobs=reader.integer("SLESS_TENANT_QUOTA_JOBS", cls.tenant_quota_jobs, 0, 100000),
            tenant_quota_secrets=reader.integer("SLESS_TENANT_QUOTA_SECRETS", cls.tenant_quota_secrets, 0, 100000),
            tenant_quota_storage=reader.quantity("SLESS_TENANT_QUOTA_STORAGE", cls.tenant_quota_storage),
            dns_namespace=reader.label("SLESS_DNS_NAMESPACE", cls.dns_namespace),
            dns_pod_labels=reader.labels("SLESS_DNS_POD_LABELS", cls.dns_pod_labels),
            dns_cidrs=reader.cidrs("SLESS_DNS_CIDRS"),
            watch_timeout_sec=reader.integer("SLESS_OPERATOR_WATCH_TIMEOUT", cls.watch_timeout_sec, 1, 3600),
            api_concurrency=reader.integer("SLESS_OPERATOR_API_CONCURRENCY", cls.api_concurrency, 1, 1000),
            metrics_token=reader.text("SLESS_METRICS_TOKEN", ""),
            metrics_host=reader.text("SLESS_OPERATOR_METRICS_HOST", cls.metrics_host, required=True),
            metrics_port=reader.integer("SLESS_OPERATOR_METRICS_PORT", cls.metrics_port, 1, 65535),
            official_client=reader.boolean("SLESS_OPERATOR_OFFICIAL_CLIENT", cls.official_client),
            leader_election=reader.boolean("SLESS_OPERATOR_LEADER_ELECTION", cls.leader_election),
            lease_sec=reader.integer("SLESS_OPERATOR_LEASE_SEC", cls.lease_sec, 3, 300),
            sandbox_runtime_class=reader.label("SLESS_SANDBOX_RUNTIME_CLASS", cls.sandbox_runtime_class),
            require_sandbox=reader.sandbox("SLESS_REQUIRE_SANDBOX"),
            scaler_address=reader.address("SLESS_SCALER_ADDRESS", cls.scaler_address),
            keda_api_version=reader.api_version("SLESS_KEDA_API_VERSION", cls.keda_api_version),
        )


class _Reader(EnvReader):
    """The shared typed getters plus the operator's own shapes (labels, images, quantities, flags, CIDRs)."""

    def label(self, name: str, default: str, optional: bool = False) -> str:
        value = self.raw(name)
        if value is None:
            return default
        if not DNS1123_LABEL.fullmatch(value) or len(value) > 63:
            raise ConfigError(f"{name} must be a DNS-1123 label, got {value!r}")
        return value if value or not optional else ""

    def sandbox(self, name: str) -> str:
        """One of the model's sandboxes, or "" (unset or empty): a typo must stop the operator, not run weaker."""
        value = self.raw(name) or ""
        if value and value not in SANDBOXES:
            raise ConfigError(f"{name} must be empty or one of {', '.join(SANDBOXES)}, got {value!r}")
        return value

    def address(self, name: str, default: str) -> str:
        """``host:port`` (a DNS name or an IP address; IPv6 in brackets)."""
        value = self.raw(name) or default
        host, sep, port = value.rpartition(":")
        if not sep or not _HOST.match(host) or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ConfigError(f"{name} must be host:port, got {value!r}")
        return value

    def api_version(self, name: str, default: str) -> str:
        """``<group>/<version>`` of a Kubernetes API group."""
        value = self.raw(name) or default
        if not _API_VERSION.match(value):
            raise ConfigError(f"{name} must be <group>/<version> such as keda.sh/v1alpha1, got {value!r}")
        return value

    def image(self, name: str, default: str) -> str:
        value = self.raw(name) or default
        if not _IMAGE.match(value):
            raise ConfigError(f"{name} must be an image reference, got {value!r}")
        return value

    def quantity(self, name: str, default: str) -> str:
        value = self.raw(name) or default
        if not _QUANTITY.match(value):
            raise ConfigError(f"{name} must be a Kubernetes quantity such as 500m, 2 or 4Gi, got {value!r}")
        return value

    def flags(self, name: str, reserved: frozenset[str]) -> tuple[str, ...]:
        """``--flag`` or ``--flag=value`` words; flags the operator sets itself are refused."""
        raw = self.raw(name)
        if raw is None:
            return ()
        found = tuple(raw.split())
        for flag in found:
            if not _FLAG.match(flag):
                raise ConfigError(f"{name}: {flag!r} is not a --flag or --flag=value")
            if flag.split("=", 1)[0] in reserved:
                raise ConfigError(f"{name}: {flag.split('=', 1)[0]} is set by the operator itself")
        return found

    def labels(self, name: str, default: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        """``key=value,key=value`` (a label selector's equality terms)."""
        raw = self.raw(name)
        if raw is None:
            return default
        found = []
        for item in raw.split(","):
            key, sep, value = item.strip().partition("=")
            if not sep or not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
                raise ConfigError(f"{name}: {item.strip()!r} is not key=value with a label's key and value")
            found.append((key, value))
        return tuple(found)

    def cidrs(self, name: str) -> tuple[str, ...]:
        raw = self.raw(name)
        if raw is None:
            return ()
        found = []
        for item in raw.split(","):
            part = item.strip()
            if not part:
                continue
            try:
                found.append(str(ipaddress.ip_network(part, strict=False)))
            except ValueError:
                raise ConfigError(f"{name}: {part!r} is not a CIDR") from None
        return tuple(found)
