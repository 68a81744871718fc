"""Settings of the Kubernetes backend, read once from the environment.

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
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from sless_api.buildcontext import GO_RUN_IMAGE
from sless_core.models import RUNTIMES

_DOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_IMAGE_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-/:]*\Z")
FUNCTION_PORT = 8080


def _positive(env: Mapping[str, str], key: str, default: float) -> float:
    raw = (env.get(key) or "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{key} must be a number, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"{key} must be positive, got {raw!r}")
    return value


def _boolean(env: Mapping[str, str], key: str, default: bool) -> bool:
    raw = (env.get(key) or "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{key} must be true or false, got {raw!r}")


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

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> KubeSettings:
        source = os.environ if env is None else env
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
        return cls(
            kubeconfig=source.get("KUBECONFIG") or None,
            context=source.get("SLESS_KUBE_CONTEXT") or None,
            service_domain=domain,
            request_timeout_sec=_positive(source, "SLESS_KUBE_REQUEST_TIMEOUT_SEC", cls.request_timeout_sec),
            watch_timeout_sec=_positive(source, "SLESS_KUBE_WATCH_TIMEOUT_SEC", cls.watch_timeout_sec),
            runtime_image_prefix=prefix,
            runtime_image_tag=tag,
            go_run_image=go_run,
            code_fetch=_boolean(source, "SLESS_KUBE_CODE_FETCH", cls.code_fetch),
        )

    def base_image(self, runtime: str) -> str:
        """The image a function's generated Dockerfile starts ``FROM``."""
        if runtime not in RUNTIMES:
            raise ValueError(f"unknown runtime {runtime!r}")
        return f"{self.runtime_image_prefix}/{runtime}:{self.runtime_image_tag}"

    def service_url(self, namespace: str, name: str) -> str:
        """Where the operator's Service of a function answers inside the cluster."""
        return f"http://{name}.{namespace}.{self.service_domain}:{FUNCTION_PORT}"
