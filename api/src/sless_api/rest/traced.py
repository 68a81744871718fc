"""The REST requests that change what runs, as server spans: a deploy and a job's creation or re-run.

Their context is the current span while the backend works, so the Kubernetes backend can write it on the custom
resource (``sless.dev/traceparent``) for the operator to continue, and ``sless up`` can hang its build and rollout
under it. Nothing happens while tracing is off.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import falcon.asgi

from sless_api import tracing


def _trace_headers(req: falcon.asgi.Request) -> list[tuple[str, str]]:
    return [(name, value) for name in tracing.TRACE_HEADERS if (value := req.get_header(name))]


@contextmanager
def deploy_span(req: falcon.asgi.Request, namespace: str, function: str) -> Iterator[Any]:
    """``deploy <namespace>/<function>``: a function created, changed, given code or rolled back."""
    with tracing.request_span(f"deploy {namespace}/{function}", _trace_headers(req) if tracing.enabled() else [],
                              sless_namespace=namespace, sless_function=function,
                              http_request_method=req.method) as current:  # fmt: skip
        yield current


@contextmanager
def job_span(req: falcon.asgi.Request, namespace: str, job: str) -> Iterator[Any]:
    """``submit job <namespace>/<job>``: a job created or run again."""
    with tracing.request_span(f"submit job {namespace}/{job}", _trace_headers(req) if tracing.enabled() else [],
                              sless_namespace=namespace, sless_job=job,
                              http_request_method=req.method) as current:  # fmt: skip
        yield current
