"""Kubernetes runs into the invocation log: a FunctionJob's run and a cron firing, with what their pod printed.

On Kubernetes a run is a Job whose end only the operator sees, and whose pod (and log) goes with the Job's TTL or
the next run. So the operator leaves each finished run in its owner's status (``status.runRecord``,
``sless_core.runrecord``) and every API process, watching FunctionJobs and Triggers, stores it as an invocation
record with trigger ``job`` or ``cron``, as ``sless up`` records its runs: ``sless logs``, ``--id`` and the console
show it after the pod is gone. The Job's uid is the record's key, claimed in the record's own transaction
(``InvocationLog.record_once``), so however many API replicas see a run it is recorded once, and a run that ended
while every replica was down is recorded when they list again.

What is stored is not taken on trust: the function, the trigger and the path come from the object that holds the
record (its kind, name and spec), the rest is checked by ``runrecord.parse`` and, for the lines, by the invocation
log's writer as any call's output is. A store that fails is tried again, with back-off, a bounded number of runs.
Only the last run of each object is there to record: a cron trigger that fires more often than the API can see it
(all replicas down for several ticks) keeps only its last firing.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from sless_api import metrics
from sless_api.backends.kube.client import KubeClient
from sless_api.backends.kube.routes import TRIGGERS
from sless_api.backends.kube.watch import Resource, RouteWatch
from sless_api.domain import calloutput
from sless_api.stores.invocations import Invocation, InvocationLog
from sless_core import crd, runrecord
from sless_core.runrecord import RunRecord

log = logging.getLogger("sless.kube.runrecords")

JOBS = crd.JOB_PLURAL
RESOURCES = (Resource(TRIGGERS), Resource(JOBS))
#: Seconds before a run whose store failed is tried again, growing to the last value.
RETRY_DELAYS_SEC = (1.0, 5.0, 30.0)
#: Runs waiting to be stored at most; beyond it a new run is dropped (logged), never memory without bound.
MAX_PENDING = 10_000
#: Keys this process knows are stored, so a status written again costs no database round trip (a relist may).
REMEMBERED = 50_000


def owned_record(kind: str, obj: dict[str, Any]) -> tuple[str, RunRecord] | None:
    """``(namespace, record)`` of a FunctionJob's or cron Trigger's ``status.runRecord``, with its function,
    trigger and path those of the object itself; None when there is none or it does not belong to OBJ."""
    meta, spec = obj.get("metadata"), obj.get("spec")
    if not isinstance(meta, dict) or not isinstance(spec, dict):
        return None
    record = runrecord.parse(obj.get("status"))
    namespace, name = meta.get("namespace"), meta.get("name")
    if record is None or not isinstance(namespace, str) or not isinstance(name, str):
        return None
    if kind == JOBS:
        trigger, path = "job", f"/jobs/{name}"
    elif kind == TRIGGERS and spec.get("type") == "cron":
        trigger, path = "cron", f"/triggers/{name}"
    else:
        return None
    if record.trigger != trigger or record.function != spec.get("function"):
        return None
    return namespace, dataclasses.replace(record, path=path)


def invocation(namespace: str, record: RunRecord) -> Invocation:
    """The invocation record of a finished run, as ``sless up`` records one (method ``RUN``)."""
    output = calloutput.encode(record.lines, record.truncated) if record.lines or record.truncated else None
    return Invocation(namespace=namespace, function=record.function, method="RUN", path=record.path,
                      status=200 if record.succeeded else 500, duration_ms=record.duration_ms, request_bytes=0,
                      response_bytes=0, trigger=record.trigger, error=None if record.succeeded else record.error,
                      started_at=record.started_at, request_id=record.job or None, version=record.version,
                      output=output)  # fmt: skip


def watch(kube: KubeClient, recorder: RunRecorder) -> RouteWatch:
    """The list-and-watch of FunctionJobs and Triggers that feeds RECORDER (cluster-wide, else per tenant)."""
    return RouteWatch(kube, recorder, RESOURCES)


class RunRecorder:
    """Stores each finished run it is shown once: the ``MirrorTable`` of a watch of FunctionJobs and Triggers
    (``watch``), with a thread of its own that writes, so a slow store never holds a watch up."""

    def __init__(self, invocations: InvocationLog) -> None:
        self.invocations = invocations
        self._wake = threading.Condition()
        self._pending: dict[str, tuple[str, RunRecord, int, float]] = {}  # key -> (ns, record, tries, due)
        self._stored: OrderedDict[str, None] = OrderedDict()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="sless-run-records", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # -- MirrorTable: what the watch reports

    def replace(self, kind: str, objects: Iterable[dict[str, Any]], namespace: str | None = None) -> None:
        for obj in objects:
            self._offer(kind, obj)

    def apply(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        if event in ("ADDED", "MODIFIED"):
            self._offer(kind, obj)

    def _offer(self, kind: str, obj: dict[str, Any]) -> None:
        found = owned_record(kind, obj)
        if found is None:
            return
        namespace, record = found
        with self._wake:
            if record.uid in self._stored or record.uid in self._pending:
                return
            if len(self._pending) >= MAX_PENDING:
                log.warning("run %s/%s not recorded: %d runs already wait to be", namespace, record.job, MAX_PENDING)
                return
            self._pending[record.uid] = (namespace, record, 0, 0.0)
            self._wake.notify()

    # -- the writer

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and not self._due():
                    self._wake.wait(self._next_wait())
                if self._stopping:
                    return
                due = [(key, item) for key, item in self._pending.items() if item[3] <= time.monotonic()]
            for key, (namespace, record, tries, _) in due:
                self._store(key, namespace, record, tries)

    def _due(self) -> bool:
        now = time.monotonic()
        return any(item[3] <= now for item in self._pending.values())

    def _next_wait(self) -> float | None:
        if not self._pending:
            return None
        return max(0.0, min(item[3] for item in self._pending.values()) - time.monotonic())

    def _store(self, key: str, namespace: str, record: RunRecord, tries: int) -> None:
        try:
            stored = self.invocations.record_once(key, invocation(namespace, record))
        except Exception as exc:
            delay = RETRY_DELAYS_SEC[min(tries, len(RETRY_DELAYS_SEC) - 1)]
            log.warning("run %s/%s not recorded yet (%s): trying again in %.0f s", namespace, record.job, exc, delay)
            with self._wake:
                self._pending[key] = (namespace, record, tries + 1, time.monotonic() + delay)
            return
        if stored:  # counted once, by the process that stored it
            metrics.observe_invocation(namespace, record.function, record.trigger, 200 if record.succeeded else 500,
                                       record.duration_ms / 1000)  # fmt: skip
        with self._wake:
            self._pending.pop(key, None)
            self._stored[key] = None
            while len(self._stored) > REMEMBERED:
                self._stored.popitem(last=False)
