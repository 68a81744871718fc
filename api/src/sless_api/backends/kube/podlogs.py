"""One call's output on Kubernetes: read from the function's pods' logs through the API server.

The runtimes tag each line a handler writes during a call with the call's request id
(sless_core.calllines); the pod log keeps them, so a call's lines are those of its function's pods
that carry its id. This needs ``list`` on pods and ``get`` on ``pods/log`` in tenant namespaces
(the chart's tenant role holds both with ``api.callLogs.enabled``, bound in each tenant namespace
only: ``sless_api.backends.kube.access``); where the cluster refuses, the answer is a 501 that says so.
Bounded: only the log since shortly before the call, at most ``MAX_READ_BYTES`` per pod, at most
``MAX_CALL_BYTES`` of a call's text. What the log no longer holds (a pod gone, its log rotated) is not
there: the kubelet's log, not the platform, decides how long it is kept.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from kubernetes.client.exceptions import ApiException

from sless_api.backends.kube.client import KubeClient
from sless_api.domain.errors import PlatformError
from sless_api.domain.routing import CallRef
from sless_core import crd
from sless_core.calllines import parse_line, timestamped

#: Same cap as the standalone backend's (sless_api.backends.standalone.host.calllogs).
MAX_CALL_BYTES = 64 * 1024
MAX_READ_BYTES = 8 * 1024 * 1024
MAX_PODS = 20
#: Seconds of log read before the call's record says it started (clocks and batching differ a little).
SLACK_SEC = 30
CONTAINER = "function"
COMPONENT_FUNCTION = "function"


class PodLogsNotAllowed(PlatformError):
    """The cluster does not let the API read pod logs: a setting of the installation, not a failure."""

    status = 501


def collect(log_text: str, request_id: str, into: dict[str, Any]) -> None:
    """Append the lines of ``request_id`` in one pod's log to ``into`` (``lines``, ``truncated``, size)."""
    for raw in log_text.splitlines():
        ts, line = timestamped(raw)
        call_id, text = parse_line(line)
        if call_id != request_id:
            continue
        size = len(text.encode("utf-8", "replace"))
        if into["_size"] + size > MAX_CALL_BYTES:
            into["truncated"] = True
            return
        into["_size"] += size
        into["lines"].append({"stream": "log", "text": text, "ts": round(ts if ts is not None else time.time(), 3)})


async def read_call_logs(kube: KubeClient, namespace: str, function: str, call: CallRef) -> dict[str, Any]:
    """The call's lines from every pod of the function, in time order."""
    since = max(1, int(time.time() - call.started_at + call.duration_sec) + SLACK_SEC)
    selector = f"{crd.LABEL_FUNCTION}={function},{crd.LABEL_COMPONENT}={COMPONENT_FUNCTION}"
    found: dict[str, Any] = {"lines": [], "truncated": False, "_size": 0}
    if not await asyncio.to_thread(kube.access.ensure, namespace):
        return {"lines": [], "truncated": False}  # the namespace is gone, and its pods with it
    try:
        pods = await kube.call_raw(kube.core.list_namespaced_pod, namespace, label_selector=selector,
                                   limit=MAX_PODS)
        for pod in pods.items or []:
            try:
                # The raw answer: the generated client would hand back the repr of the bytes as "text".
                raw = await kube.call_raw(kube.core.read_namespaced_pod_log, pod.metadata.name, namespace,
                                          container=CONTAINER, since_seconds=since, timestamps=True,
                                          limit_bytes=MAX_READ_BYTES, _preload_content=False)
            except ApiException as exc:
                if exc.status in (400, 404):  # a pod that went away, or whose container has not started
                    continue
                raise
            collect(bytes(raw.data or b"").decode("utf-8", "replace"), call.request_id, found)
    except ApiException as exc:
        if exc.status == 403:
            raise PodLogsNotAllowed(
                "this cluster does not let the sless API read function pods' logs (it needs list on pods and get "
                "on pods/log in tenant namespaces: chart value api.callLogs.enabled)") from None
        raise kube.translate(exc, f"the logs of function {function!r}") from None
    found.pop("_size")
    found["lines"].sort(key=lambda line: line["ts"])
    return found
