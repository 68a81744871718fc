"""What a finished Job's pod said: its result (stdout) or its error (stderr, a build log's tail).

The runner, kaniko and fetch-context containers use ``terminationMessagePolicy: FallbackToLogsOnError``: the
kubelet stores what the process wrote to ``/dev/termination-log``, or on failure the tail of its
log, in ``status.containerStatuses[].state.terminated.message``. That survives log rotation and
needs no log access, so it is read first; only when it is empty does the operator ask the pod
log API (e.g. a successful runner that printed its result on stdout).

Pods are found by the operator's own labels, never by the built-in ``job-name`` label.
"""

from __future__ import annotations

import logging
from typing import Any

from sless_core import calllines, runrecord
from sless_operator.kube import ApiError, Kube, api_path
from sless_operator.status import keep_head, keep_tail

log = logging.getLogger(__name__)
LOG_TAIL_LINES = 50
#: How the runtime marks its own lines (no call's, runtimes/README.md), e.g. its code fetch's: not a run's output.
RUNTIME_OWN = f"{calllines.TAG}{calllines.NO_CALL} "
RESULT_BYTES = 64 * 1024


def _finished_at(pod: dict[str, Any]) -> str:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        finished = ((status.get("state") or {}).get("terminated") or {}).get("finishedAt")
        if finished:
            return str(finished)
    return str((pod.get("metadata") or {}).get("creationTimestamp") or "")


def pick_pod(pods: list[dict[str, Any]], succeeded: bool) -> dict[str, Any] | None:
    """The pod that tells the outcome: the (last) Succeeded one, or the last one that failed."""
    phase = "Succeeded" if succeeded else "Failed"
    matching = [p for p in pods if (p.get("status") or {}).get("phase") == phase]
    if not matching and not succeeded:
        matching = list(pods)
    if not matching:
        return None
    return sorted(matching, key=_finished_at)[-1]


def terminated_state(pod: dict[str, Any], container: str) -> dict[str, Any]:
    status = pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    named = [*(status.get("initContainerStatuses") or []), *statuses]
    chosen = next((s for s in named if s.get("name") == container), statuses[0] if statuses else {})
    state = chosen.get("state") or {}
    terminated = state.get("terminated") or (chosen.get("lastState") or {}).get("terminated") or {}
    return dict(terminated)


def failed_init_container(pod: dict[str, Any], names: tuple[str, ...]) -> str | None:
    """The first of the init containers NAMES that ended with a non-zero exit code (the pod stopped there)."""
    for name in names:
        code = terminated_state(pod, name).get("exitCode")
        if code not in (None, 0):
            return name
    return None


async def job_pods(kube: Kube, namespace: str, selector: str) -> list[dict[str, Any]]:
    """The pods matching SELECTOR: listed once for a finished run, whose result and output lines both read them."""
    return await kube.list(api_path("v1", "pods", namespace), selector)


async def pod_output(kube: Kube, namespace: str, selector: str, container: str, succeeded: bool,
                     init_containers: tuple[str, ...] = (), pods: list[dict[str, Any]] | None = None) -> str:
    """The result (SUCCEEDED) or the error text of the Job whose pods match SELECTOR (PODS: those already listed).

    A result keeps its head, an error its tail, both within ``status.MESSAGE_LIMIT``. When
    one of INIT_CONTAINERS failed, CONTAINER never ran: the error is that init container's.
    Returns "" when no pod is left to ask (e.g. removed by the Job's TTL).
    """
    if pods is None:
        pods = await job_pods(kube, namespace, selector)
    pod = pick_pod(pods, succeeded)
    if pod is None:
        return ""
    if not succeeded:
        container = failed_init_container(pod, init_containers) or container
    terminated = terminated_state(pod, container)
    text = str(terminated.get("message") or "").strip()
    if not text:
        text = await _pod_log(kube, namespace, pod["metadata"]["name"], container, succeeded)
    if not text and not succeeded and terminated:
        text = f"exit code {terminated.get('exitCode')} ({terminated.get('reason') or 'Error'}), no output"
    return keep_head(text) if succeeded else keep_tail(text)


async def _pod_log(kube: Kube, namespace: str, pod: str, container: str, succeeded: bool) -> str:
    params = {"container": container}
    if succeeded:
        params["limitBytes"] = str(RESULT_BYTES)
    else:
        params["tailLines"] = str(LOG_TAIL_LINES)
    try:
        return (await kube.text(api_path("v1", "pods", namespace, pod, "log"), params)).strip()
    except ApiError as exc:
        # no kubelet to ask (node gone), or logs already rotated: the status says what it can
        log.info("no log for pod %s/%s: %s", namespace, pod, exc)
        return ""


def log_lines(log_text: str, default_ts: float, cut: bool = False) -> tuple[tuple[tuple[str, str, float], ...], bool]:
    """A run pod's log (read with timestamps) as a run's output lines within ``runrecord``'s bounds, without the
    runtime's own lines (``RUNTIME_OWN``); CUT: the read stopped at its byte limit, so the output is truncated
    whatever fits (its last line may be partial: left out)."""
    raw = log_text.splitlines()
    if cut and raw:
        raw.pop()
    lines: list[tuple[str, str, float]] = []
    for line in raw:
        ts, text = calllines.timestamped(line)
        if not text.startswith(RUNTIME_OWN):
            lines.append(("log", text, default_ts if ts is None else ts))
    kept, truncated = runrecord.bounded_lines(lines)
    return kept, truncated or cut


async def run_output(kube: Kube, namespace: str, pods: list[dict[str, Any]], job_uid: str, container: str,
                     default_ts: float) -> tuple[tuple[tuple[str, str, float], ...], bool]:  # fmt: skip
    """What the last pod of the Job JOB_UID (among PODS, ``job_pods``) printed: its log's lines with their times,
    bounded as a call's output is. Nothing when no pod or log is left (the kubelet decides how long)."""
    owned = [p for p in pods if any(ref.get("uid") == job_uid
                                    for ref in (p.get("metadata") or {}).get("ownerReferences") or [])]  # fmt: skip
    if not owned:
        return (), False
    pod = sorted(owned, key=_finished_at)[-1]
    params = {"container": container, "timestamps": "true", "limitBytes": str(RESULT_BYTES)}
    try:
        text = await kube.text(api_path("v1", "pods", namespace, pod["metadata"]["name"], "log"), params)
    except ApiError as exc:
        log.info("no log for run pod %s/%s: %s", namespace, pod["metadata"]["name"], exc)
        return (), False
    return log_lines(text, default_ts, cut=len(text.encode("utf-8", "replace")) >= RESULT_BYTES)
