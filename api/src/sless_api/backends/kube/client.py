"""The Kubernetes client of the API: configuration loading and one error vocabulary.

Every call goes through :meth:`KubeClient.call`, which runs the blocking client in a worker thread
with a bounded request time and turns whatever the API server (or the network) says into the
platform's errors. So an ``ApiException`` or a urllib3 error never reaches a client as a 500: a
missing object is a 404, a name clash a 409, a schema rejection a 400, a create beyond the tenant's
quota a 403 naming the quota (``kube.quota``), and anything the tenant cannot fix (refused
credentials, a server down or overloaded) a 503.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import urllib3.exceptions
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from sless_api.backends.kube import quota
from sless_api.backends.kube.access import TenantAccess
from sless_api.backends.settings import KubeSettings
from sless_api.domain.errors import Conflict, NotFound, PlatformError, Unavailable
from sless_core.errors import ValidationError

log = logging.getLogger("sless.kube")
T = TypeVar("T")
CONNECT_TIMEOUT_SEC = 10.0


class KubeNotFound(NotFound):
    """404 from the API server; ``kind`` says what was missing (``namespaces``, ``functions``, ...)."""

    def __init__(self, message: str, kind: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind


class KubeConflict(Conflict):
    """409 from the API server: the name is taken, or the object changed since it was read."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


def load_configuration(settings: KubeSettings) -> k8s.Configuration:
    """The kubeconfig named by KUBECONFIG, else the in-cluster service account, else ~/.kube/config."""
    cfg = k8s.Configuration()
    if settings.kubeconfig is None and settings.in_cluster:
        k8s_config.load_incluster_config(client_configuration=cfg)
    else:
        k8s_config.load_kube_config(config_file=settings.kubeconfig, context=settings.context,
                                    client_configuration=cfg, persist_config=False)
    return cfg


def _status_body(exc: ApiException) -> dict[str, Any]:
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def translate(exc: BaseException, what: str) -> PlatformError | ValidationError:
    """The platform error for a failed API server call about WHAT (e.g. ``function 'hello'``)."""
    if not isinstance(exc, ApiException):
        return Unavailable(f"the Kubernetes API is unreachable ({type(exc).__name__}); try again")
    body = _status_body(exc)
    message = str(body.get("message") or exc.reason or "no detail")
    raw_details = body.get("details")
    details: dict[str, Any] = raw_details if isinstance(raw_details, dict) else {}
    status = int(exc.status or 0)
    if status == 404:
        return KubeNotFound(f"{what} not found", kind=details.get("kind"))
    if status == 409:
        return KubeConflict(f"{what}: {message}", reason=body.get("reason"))
    if status in (400, 422):
        return ValidationError(f"{what} rejected by the cluster: {message}")
    if status == 403 and (beyond := quota.refusal(message, what)) is not None:
        return beyond
    if status in (401, 403):
        log.error("the API server refused the platform's credentials for %s: %s", what, message)
        return Unavailable(f"the platform is not allowed to manage {what}; ask the operator of this installation")
    log.warning("API server error on %s: %s %s", what, status, message)
    return Unavailable(f"the Kubernetes API failed on {what} ({status}); try again")


class KubeClient:
    """One API client for requests (the route table's watches open their own)."""

    def __init__(self, settings: KubeSettings, configuration: k8s.Configuration | None = None) -> None:
        self.settings = settings
        self.configuration = configuration or load_configuration(settings)
        self.api_client = k8s.ApiClient(self.configuration)
        self.custom = k8s.CustomObjectsApi(self.api_client)
        self.core = k8s.CoreV1Api(self.api_client)
        self.rbac = k8s.RbacAuthorizationV1Api(self.api_client)
        #: the API's rights inside tenant namespaces (a RoleBinding per namespace, see kube.access)
        self.access = TenantAccess(self)

    def new_api_client(self) -> k8s.ApiClient:
        """A separate connection pool (a watch holds its connection for minutes)."""
        return k8s.ApiClient(self.configuration)

    @property
    def timeout(self) -> tuple[float, float]:
        return (CONNECT_TIMEOUT_SEC, self.settings.request_timeout_sec)

    def call_sync(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """FN's answer, or the platform's error for its failure. A create the API server cannot yet check
        against the tenant's quota (``kube.quota.QuotaBeingCounted``) is tried again until the quota is counted,
        for at most ``quota.COUNTING_WAIT_SEC``: that passes by itself, and a tenant should not see it."""
        kwargs.setdefault("_request_timeout", self.timeout)
        deadline = time.monotonic() + quota.COUNTING_WAIT_SEC
        pause = 0.1
        while True:
            try:
                return fn(*args, **kwargs)
            except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
                error = translate(exc, what)
                if not isinstance(error, quota.QuotaBeingCounted) or time.monotonic() + pause > deadline:
                    raise error from exc
            log.info("%s waits for the quota controller to count the tenant's quota", what)
            time.sleep(pause)
            pause = min(pause * 2, 2.0)

    async def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.to_thread(self.call_sync, what, fn, *args, **kwargs)

    async def call_raw(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Like :meth:`call`, but the API server's refusals (``ApiException``) reach the caller as they are, for
        callers that answer some statuses their own way; network failures still become Unavailable."""
        kwargs.setdefault("_request_timeout", self.timeout)

        def run() -> T:
            try:
                return fn(*args, **kwargs)
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                raise translate(exc, "the Kubernetes API") from exc

        return await asyncio.to_thread(run)

    @staticmethod
    def translate(exc: BaseException, what: str) -> PlatformError | ValidationError:
        return translate(exc, what)

    def close(self) -> None:
        self.api_client.close()
