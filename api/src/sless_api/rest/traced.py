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


def _request_span(req: falcon.asgi.Request, name: str, **attributes: Any) -> Any:
    """The request as server span NAME continuing the caller's ``traceparent`` (nothing while tracing is off)."""
    headers = [(key, value) for key in tracing.TRACE_HEADERS if (value := req.get_header(key))] \
        if tracing.enabled() else []
    return tracing.request_span(name, headers, http_request_method=req.method, **attributes)


@contextmanager
def deploy_span(req: falcon.asgi.Request, namespace: str, function: str) -> Iterator[Any]:
    """``deploy <namespace>/<function>``: a function created, changed, given code or rolled back."""
    with _request_span(req, f"deploy {namespace}/{function}", sless_namespace=namespace,
                       sless_function=function) as current:
        yield current


@contextmanager
def job_span(req: falcon.asgi.Request, namespace: str, job: str) -> Iterator[Any]:
    """``submit job <namespace>/<job>``: a job created or run again."""
    with _request_span(req, f"submit job {namespace}/{job}", sless_namespace=namespace, sless_job=job) as current:
        yield current
