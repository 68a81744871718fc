"""A platform behind the REST API, on either backend: what the contract tests (tests/backends) may expect of it.

The fixtures that start one live in tests/backends/conftest.py; the test modules use :class:`Backend` in their
annotations and calls, so it lives here, importable without importing a conftest.
"""

from __future__ import annotations

import itertools
import json
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from sless_core import crd
from sless_core.naming import tenant_namespace
from tests.support.kube_operator import strip_finalizers
from tests.support.platform import Tenant
from tests.support.stages import FETCH_FAILED, render_stage
from tests.support.testbed import Testbed

# the one operator of the kubernetes backend serves every namespace starting so (see suite_sub)
NAMESPACE_PREFIX = "sless-c0fe"


def suite_sub(label: str) -> str:
    """A ``sub`` of LABEL whose tenant namespace starts with NAMESPACE_PREFIX (the operator's glob)."""
    for n in itertools.count():
        sub = f"{label}-{n}"
        if tenant_namespace(sub).startswith(NAMESPACE_PREFIX):
            return sub
    raise AssertionError("unreachable")


@dataclass
class Backend:
    """A running platform behind the REST API, and what a test may expect of it."""

    name: str
    url: str
    runs_functions: bool  # False on kwok: nothing really runs, a routable function answers 502
    build_wait_sec: float
    bed: Testbed | None = None  # the kubernetes backend's cluster
    build_namespace: str = ""  # and its operator's build namespace
    namespaces: list[str] = field(default_factory=list)

    @contextmanager
    def failing_builds(self, namespace: str, function: str) -> Iterator[None]:
        """While the block runs, FUNCTION's builds fail for a reason outside its code: on kwok a Stage fails
        its build pods; ``sless up`` really builds, so there the test's code must fail by itself."""
        if self.bed is None:
            yield
            return
        labels = {crd.LABEL_COMPONENT: "build", crd.LABEL_NAMESPACE: namespace, crd.LABEL_FUNCTION: function}
        name = f"sless-fail-build-{secrets.token_hex(4)}"
        self.bed.apply(render_stage(name, labels=labels, namespace=self.build_namespace, succeed=False,
                                    message="the build failed (simulated)"))
        # code without dependencies builds nothing: its pods fail to start instead (fetch-code fails)
        fetch = f"sless-fail-fetch-{secrets.token_hex(4)}"
        self.bed.apply_stage(fetch, [
            {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
            {"key": ".status.phase", "operator": "In", "values": ["Pending"]},
            {"key": ".metadata.namespace", "operator": "In", "values": [namespace]},
            {"key": f'.metadata.labels["{crd.LABEL_FUNCTION}"]', "operator": "In", "values": [function]},
            {"key": f'.metadata.labels["{crd.LABEL_COMPONENT}"]', "operator": "In", "values": ["function"]},
        ], FETCH_FAILED % {"message": json.dumps("code archive: the start failed (simulated)")})  # fmt: skip
        try:
            yield
        finally:
            self.bed.delete_stage(name)
            self.bed.delete_stage(fetch)

    def tenant(self, label: str = "t") -> Tenant:
        sub = suite_sub(f"{label}-{secrets.token_hex(4)}")
        tenant = Tenant(self.url, sub)
        self.namespaces.append(tenant.ns)
        return tenant

    def release(self) -> None:
        """Remove the tenants' namespaces made so far (kubernetes: the operator stops watching them)."""
        if self.bed is not None and self.namespaces:
            for ns in self.namespaces:
                strip_finalizers(self.bed, ns)
            self.bed.kubectl("delete", "namespace", *self.namespaces, "--wait=false", "--ignore-not-found",
                             check=False)
        self.namespaces.clear()
