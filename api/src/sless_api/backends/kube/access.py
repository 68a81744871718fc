"""The API's rights inside a tenant namespace: a RoleBinding of the tenant role to its own ServiceAccount.

Why: the API's ClusterRole holds no Secret and no pod log anywhere, so a bug or a stolen token of the API
reads nothing in ``kube-system`` or any other namespace that is not a tenant's. What it needs in a tenant's
namespace (that tenant's Secrets ``sless-secret-*``, the logs of its function pods) is the ClusterRole named
by ``SLESS_KUBE_TENANT_ROLE``, bound in that namespace only, to the ServiceAccount named by
``SLESS_KUBE_SERVICE_ACCOUNT``. RBAC lets the API ``bind`` that one role and no other, and the chart's
admission policy lets it create such RoleBindings only in tenant namespaces, only of that role, only for
itself.

When: the binding is created with the namespace (``POST /ensure``, and the first create of a new tenant),
and otherwise before this process first uses those rights in a namespace, so tenants that existed before
the binding did get theirs on their first secret or log request after an upgrade. A binding that exists
already is a 409, taken as done. Without ``SLESS_KUBE_TENANT_ROLE`` nothing is bound (the API's own RBAC
must then grant those rights some other way, as in development against a cluster admin's kubeconfig).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

import urllib3.exceptions
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from sless_api.backends.settings import KubeSettings
from sless_core import crd

log = logging.getLogger("sless.kube.access")
#: The admission policy reads a namespace's labels from the API server's cache, which may lag a namespace
#: created (or marked) a moment ago: only that denial is retried, this long.
SETTLE_SEC = (0.2, 0.5, 1.0, 2.0)


class Cluster(Protocol):
    """What granting needs of the API's client (``kube.client.KubeClient``, which holds a TenantAccess: so this
    module names the client's shape, not its module)."""

    settings: KubeSettings
    rbac: k8s.RbacAuthorizationV1Api

    @property
    def timeout(self) -> tuple[float, float]: ...

    def translate(self, exc: BaseException, what: str) -> Exception: ...


class TenantAccess:
    """Creates the API's RoleBinding in tenant namespaces, once per namespace and process."""

    def __init__(self, kube: Cluster) -> None:
        self.kube = kube
        self.role = kube.settings.tenant_role
        self.subject = kube.settings.service_account
        self._granted: set[str] = set()
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return bool(self.role and self.subject)

    def binding(self, namespace: str) -> dict[str, Any]:
        """The RoleBinding: the tenant role, in NAMESPACE, for the API's ServiceAccount alone."""
        assert self.subject is not None
        account_ns, account = self.subject
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": self.role, "namespace": namespace,
                         "labels": {crd.LABEL_MANAGED: crd.MANAGED_BY}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": self.role},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": account_ns}],
        }  # fmt: skip

    def ensure(self, namespace: str) -> bool:
        """The binding in NAMESPACE, created unless this process made or found it before; False when the
        namespace does not exist (so it holds nothing to read)."""
        if not self.enabled or namespace in self._granted:
            return True
        return self.grant(namespace)

    def grant(self, namespace: str) -> bool:
        """Create the binding in NAMESPACE (an existing one is fine); False when the namespace does not exist.
        Blocking: call it from a worker thread."""
        if not self.enabled:
            return True
        what = f"the API's access to namespace {namespace!r}"
        for delay in (*SETTLE_SEC, None):
            try:
                self.kube.rbac.create_namespaced_role_binding(namespace, self.binding(namespace),
                                                              _request_timeout=self.kube.timeout)
            except ApiException as exc:
                if exc.status == 404:
                    self.forget(namespace)
                    return False
                if exc.status == 403 and delay is not None and "ValidatingAdmissionPolicy" in str(exc.body):
                    time.sleep(delay)
                    continue
                if exc.status != 409:
                    raise self.kube.translate(exc, what) from None
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                raise self.kube.translate(exc, what) from None
            with self._lock:
                self._granted.add(namespace)
            return True
        raise AssertionError("unreachable")

    def forget(self, namespace: str) -> None:
        """Make the next use of NAMESPACE create the binding again (the namespace went away)."""
        with self._lock:
            self._granted.discard(namespace)
