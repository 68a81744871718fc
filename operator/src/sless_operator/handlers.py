"""Kopf's view of the operator: which event calls what, and how failures map to retries.

Nothing is decided here. Function, Trigger and FunctionJob changes go to their modules; the
watches on our own Jobs and Deployments (server-side filtered by the managed-by label) feed
in-memory indices and wake the owning Function or FunctionJob when a child's state changes.

Resources outside tenant namespaces are refused by the reconcilers themselves (a status that
says why, no children; see ``tenancy.refusal``).

Error mapping: an invalid spec -> ``kopf.PermanentError`` (no retries); apiserver trouble,
a Function not built yet, a child name held by another owner, or KEDA missing for a scaled
Function -> ``kopf.TemporaryError`` with a delay, so Kopf retries with backoff.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, cast

import aiohttp
import kopf

from sless_core import crd
from sless_core.crcodec import FunctionResource, InvalidResource
from sless_core.traffic import LABEL_SPLIT_OF
from sless_operator import function, job, metrics, trigger
from sless_operator.autoscale import ABSENT_RECHECK_SEC, KedaMissing
from sless_operator.capture import terminated_state
from sless_operator.children import ChildConflict
from sless_operator.config import OperatorConfig
from sless_operator.context import Context
from sless_operator.job import WaitingForFunction
from sless_operator.kube import ApiError
from sless_operator.manifests import (
    COMPONENT_BUILD,
    COMPONENT_COMPILE,
    COMPONENT_CRON,
    COMPONENT_FUNCTION,
    COMPONENT_RUN,
    JOB_NAME_LABEL,
    LABEL_DEPS,
    UPLOAD_CONTAINER,
)
from sless_operator.observe import (
    deployment_summary,
    fetch_failure,
    fetched_key,
    job_summary,
    slim_function,
    trigger_summary,
)
from sless_operator.tenancy import NamespaceMissing, NotATenant

log = logging.getLogger(__name__)

FUNCTION = (crd.GROUP, crd.VERSION, crd.FUNCTION_PLURAL)
TRIGGER = (crd.GROUP, crd.VERSION, crd.TRIGGER_PLURAL)
FUNCTION_JOB = (crd.GROUP, crd.VERSION, crd.JOB_PLURAL)
JOBS = ("batch", "v1", "jobs")
DEPLOYMENTS = ("apps", "v1", "deployments")
PODS = ("", "v1", "pods")
FUNCTION_PODS = {**{crd.LABEL_MANAGED: crd.MANAGED_BY}, crd.LABEL_COMPONENT: COMPONENT_FUNCTION}
COMPILED_KEPT = 1000
COMPILE_PODS = {**{crd.LABEL_MANAGED: crd.MANAGED_BY}, crd.LABEL_COMPONENT: COMPONENT_COMPILE}
MANAGED = {crd.LABEL_MANAGED: crd.MANAGED_BY}
INDICES = ("sless_functions", "sless_jobs", "sless_deployments", "sless_triggers")
FINALIZER = "sless.dev/finalizer"
# well inside half of the shortest code URL lifetime (SLESS_CODE_URL_TTL_SEC >= 3600)
RENEW_INTERVAL_SEC = 900


class LeanDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """Kopf's "last handled" essence, computed without deep-copying what it throws away, kept as its digest.

    Kopf deep-copies the whole object (managedFields, status) on every event only to delete
    those parts; at a thousand Functions that copying was the operator's largest CPU cost.
    The essence is the same: spec and the like, labels and annotations.

    What is stored (annotation ``sless.dev/last-handled-configuration``) is the SHA-256 of that essence, not the
    essence: every handler here reconciles the whole object (level-triggered) and reads no diff, so a digest
    tells a change as well, costs 80 bytes instead of a second copy of the spec in every object, and never
    meets the API server's 256 KiB bound on an object's annotations (a spec with large environment values,
    within the CRD's schema, could not be recorded as handled, and an edit back to it was then ignored).
    """

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        if extra_fields:
            return super().build(body=body, extra_fields=extra_fields)
        meta = body.get("metadata", {})
        slim = {key: value for key, value in body.items() if key not in ("metadata", "status")}
        slim["metadata"] = {key: meta[key] for key in ("labels", "annotations") if key in meta}
        # Kopf's build drops its own annotations (this one among them), so recording it changes no digest
        essence = super().build(body=kopf.Body(cast("kopf.RawBody", slim)))
        text = json.dumps(essence, sort_keys=True, separators=(",", ":"), default=str)
        return cast("kopf.BodyEssence", {"sha256": hashlib.sha256(text.encode()).hexdigest()})


def configure(settings: kopf.OperatorSettings, config: OperatorConfig) -> None:
    """Kopf settings: state in our own annotations + status, short watches, no peering, quiet events."""
    settings.peering.standalone = True
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.MultiProgressStorage([
        kopf.AnnotationsProgressStorage(prefix="sless.dev"),
        kopf.StatusProgressStorage(field="status.kopf.progress"),
    ])  # fmt: skip
    settings.persistence.diffbase_storage = LeanDiffBaseStorage(prefix="sless.dev", key="last-handled-configuration")
    settings.watching.server_timeout = config.watch_timeout_sec
    settings.watching.client_timeout = config.watch_timeout_sec + 10
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 30
    # Kopf posts a Kubernetes Event per handler outcome at INFO: thousands of writes at scale.
    settings.posting.level = logging.WARNING
    settings.execution.max_workers = 4  # every handler is async; the thread pool is for Kopf's own use
    selector = f"{crd.LABEL_MANAGED}={crd.MANAGED_BY}"
    settings.watching.label_selectors[JOBS] = selector
    settings.watching.label_selectors[DEPLOYMENTS] = selector
    settings.watching.label_selectors[PODS] = f"{selector},{crd.LABEL_COMPONENT}={COMPONENT_FUNCTION}"


# the Jobs whose ends are counted, by their component label
METRIC_KINDS = {COMPONENT_BUILD: "build", COMPONENT_COMPILE: "compile", COMPONENT_RUN: "job", COMPONENT_CRON: "cron"}
def _runtime(body: dict[str, Any] | None) -> str:
    """The Function's runtime (a metrics label), "unknown" when it is gone or invalid."""
    try:
        return FunctionResource.from_cr(body).spec.runtime if body is not None else "unknown"
    except InvalidResource:
        return "unknown"


def _valid_functions(bodies: Iterable[dict[str, Any]]) -> list[FunctionResource]:
    found = []
    for body in bodies:
        with contextlib.suppress(InvalidResource):
            found.append(FunctionResource.from_cr(body))
    return found


EXPECTED = (InvalidResource, ChildConflict, NamespaceMissing, NotATenant, WaitingForFunction, KedaMissing)


async def to_kopf(ctx: Context, kind: str, work: Callable[[], Awaitable[None]]) -> None:
    """Run a change handler's work on a resource of KIND (bounded like the work queue, timed and counted in the
    metrics), mapping failures to Kopf's retries."""
    try:
        async with ctx.slots:
            await metrics.reconciled(kind, work)
    except InvalidResource as exc:
        raise kopf.PermanentError(f"invalid spec: {exc}") from exc
    except NotATenant as exc:
        raise kopf.PermanentError(str(exc)) from exc
    except ChildConflict as exc:
        raise kopf.TemporaryError(str(exc), delay=60) from exc
    except (WaitingForFunction, NamespaceMissing) as exc:
        raise kopf.TemporaryError(str(exc), delay=5) from exc
    except KedaMissing as exc:  # asked again after a while: KEDA may be installed meanwhile
        raise kopf.TemporaryError(str(exc), delay=ABSENT_RECHECK_SEC + 5) from exc
    except ApiError as exc:
        raise kopf.TemporaryError(str(exc), delay=2 if exc.transient else 30) from exc


# -- lifecycle ------------------------------------------------------------------------------------


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: Context, **kwargs: Any) -> None:
    configure(settings, memo.config)
    memo.state.indices.update({name: kwargs[name] for name in INDICES})
    memo.queue.expected = EXPECTED
    memo.queue.start()
    await memo.metrics.start()


def _credentials(**kwargs: Any) -> kopf.ConnectionInfo | None:
    # in-cluster token first, then a kubeconfig with files/inline data; the official client last
    # (it handles exec plugins, but importing it costs tens of MB)
    return (kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)
            or kopf.login_via_client(**kwargs))  # fmt: skip


@kopf.on.login()
async def login(memo: Context, **kwargs: Any) -> kopf.AiohttpSession | None:
    """Credentials for Kopf and for the operator's own client (re-read after a 401).

    Kopf gets its own session with a bounded connection pool: its default pool is unbounded,
    so a thousand Functions created at once meant a thousand TLS handshakes and connections
    (CPU and ~100 MB of buffers) for as many concurrent patches.
    """
    info = _credentials(**kwargs)
    if info is None:
        return None

    async def relogin() -> kopf.ConnectionInfo | None:
        return _credentials(**kwargs)

    await memo.kube.connect(info, relogin)
    connector = aiohttp.TCPConnector(limit=memo.kopf_connections, ssl=info.as_ssl_context())
    session = aiohttp.ClientSession(
        connector=connector,
        headers={"User-Agent": "sless-operator (kopf)", **info.as_http_headers()},
        proxy=info.proxy_url,
        trust_env=info.trust_env,
    )
    return kopf.AiohttpSession(server=info.server, default_namespace=info.default_namespace, priority=info.priority,
                               expiration=info.expiration, aiohttp_session=session)  # fmt: skip


@kopf.on.cleanup()
async def cleanup(memo: Context, **_: Any) -> None:
    await memo.metrics.stop()
    await memo.close()


# -- indices of our children and of triggers --------------------------------------------------------


@kopf.index(*FUNCTION)
async def sless_functions(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {(namespace, name): slim_function(dict(body))}


@kopf.index(*JOBS, labels=MANAGED)
async def sless_jobs(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {(namespace, name): job_summary(dict(body))}


@kopf.index(*DEPLOYMENTS, labels=MANAGED)
async def sless_deployments(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {(namespace, name): deployment_summary(dict(body))}


@kopf.index(*TRIGGER)
async def sless_triggers(namespace: str | None, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    summary = trigger_summary(dict(body))
    return {(namespace, summary.function): summary}


# -- Function --------------------------------------------------------------------------------------


@kopf.on.resume(*FUNCTION, id="function-resume")
@kopf.on.create(*FUNCTION, id="function-create")
@kopf.on.update(*FUNCTION, id="function-update")
async def function_changed(namespace: str | None, name: str, body: kopf.Body, memo: Context, **_: Any) -> None:
    await to_kopf(memo, "function", lambda: function.reconcile(memo, namespace or "", name, dict(body)))


@kopf.timer(*FUNCTION, id="function-renew", interval=RENEW_INTERVAL_SEC, initial_delay=RENEW_INTERVAL_SEC)
async def function_renew(namespace: str | None, name: str, memo: Context, **_: Any) -> None:
    """Now and then, a reconcile that renews the code download URL before it expires (else a no-op)."""
    await to_kopf(memo, "function", lambda: function.reconcile(memo, namespace or "", name))


@kopf.on.delete(*FUNCTION, id="function-cleanup")
async def function_deleted(namespace: str | None, name: str, memo: Context, **_: Any) -> None:
    await to_kopf(memo, "function", lambda: function.cleanup(memo, namespace or "", name))


# -- children's events ---------------------------------------------------------------------------


@kopf.on.event(*JOBS, labels=MANAGED)
async def job_event(type: str | None, body: kopf.Body, memo: Context, **_: Any) -> None:  # noqa: A002
    if type is None:
        return  # initial listing: the resume handlers look at everything anyway
    summary = job_summary(dict(body))
    key = ("Job", summary.namespace, summary.name)
    if type == "DELETED":
        memo.state.seen.pop(key, None)
    elif memo.state.seen.get(key) == (summary.state, summary.reason):
        return
    else:
        memo.state.seen[key] = (summary.state, summary.reason)
    component = summary.labels.get(crd.LABEL_COMPONENT)
    if summary.finished and type != "DELETED" and component in METRIC_KINDS:
        ns, fn = summary.labels.get(crd.LABEL_NAMESPACE, ""), summary.labels.get(crd.LABEL_FUNCTION, "")
        runtime = _runtime(memo.function(ns, fn))
        metrics.job_finished(METRIC_KINDS[component], ns, runtime, summary)
    if component == COMPONENT_COMPILE:
        fn = summary.labels.get(crd.LABEL_FUNCTION, "")
        if fn and summary.finished and type != "DELETED":
            _wake(memo, summary.namespace, fn)  # a Go function's binary is ready, or its compile failed
    elif component == COMPONENT_BUILD:
        ns, fn = summary.labels.get(crd.LABEL_NAMESPACE, ""), summary.labels.get(crd.LABEL_FUNCTION, "")
        deps = summary.labels.get(LABEL_DEPS, "")
        if not ns or not (summary.finished or type == "DELETED"):
            return  # a running build changes nothing
        # a dependency image is shared: every function of the tenant with that key waits for it
        names = {fn} | {f.meta.name for f in _valid_functions(memo.functions_in(ns)) if deps
                        and f.code.deps_hash[:32] == deps}  # fmt: skip
        for name in sorted(n for n in names if n):
            _wake(memo, ns, name)
    elif component == COMPONENT_RUN and type != "DELETED":
        memo.queue.add(key, lambda: job.on_run_job(memo, summary))
    elif component == COMPONENT_CRON and type != "DELETED":
        memo.queue.add(key, lambda: trigger.on_cron_job(memo, summary))


def _wake(memo: Context, namespace: str, name: str) -> None:
    memo.queue.add(("function", namespace, name), lambda: function.reconcile(memo, namespace, name))


@kopf.on.event(*DEPLOYMENTS, labels=MANAGED)
async def deployment_event(type: str | None, body: kopf.Body, memo: Context, **_: Any) -> None:  # noqa: A002
    if type is None:
        return
    summary = deployment_summary(dict(body))
    if (body.get("metadata", {}).get("labels") or {}).get(crd.LABEL_COMPONENT) != COMPONENT_FUNCTION:
        return
    key = ("Deployment", summary.namespace, summary.name)
    state = summary.rollout()[0]
    seen = (state, summary.replicas, summary.spec_hash)
    previous = memo.state.seen.get(key)
    if type == "DELETED":
        memo.state.seen.pop(key, None)
    elif previous == seen:
        return
    else:
        memo.state.seen[key] = seen
        # "progressing" is what the Function already says after creating or changing it
        if state == "progressing" and (previous is None or previous[1:] == seen[1:]):
            return
    # a traffic split's other version wakes the Function it serves
    ns, fn = summary.namespace, (body.get("metadata", {}).get("labels") or {}).get(LABEL_SPLIT_OF) or summary.name
    memo.queue.add(("function", ns, fn), lambda: function.reconcile(memo, ns, fn))


@kopf.on.event(*PODS, labels=FUNCTION_PODS)
async def function_pod_event(type: str | None, body: kopf.Body, memo: Context, **_: Any) -> None:  # noqa: A002
    """A function pod that cannot fetch its code (``fetch-code``, or the runtime container that fetches itself,
    ``observe.fetch_failure``): the Function says why now, not at the rollout's deadline."""
    if type in (None, "DELETED"):
        return
    failure = fetch_failure(dict(body))
    labels = body.get("metadata", {}).get("labels") or {}
    ns, fn = body.get("metadata", {}).get("namespace", ""), labels.get(crd.LABEL_FUNCTION, "")
    key = fetched_key(dict(body))  # which upload's archive: the same code uploaded again is another key
    if failure is None or not (ns and fn and key) or memo.state.fetch_failures.get((ns, fn)) == (key, failure):
        return
    memo.state.fetch_failures[(ns, fn)] = (key, failure)
    memo.queue.add(("function", ns, fn), lambda: function.reconcile(memo, ns, fn))


@kopf.on.event(*PODS, labels=COMPILE_PODS)
async def compile_pod_event(type: str | None, body: kopf.Body, memo: Context, **_: Any) -> None:  # noqa: A002
    """A compile pod whose binary is uploaded: the Function rolls out now, not when the Job controller
    has marked the Job complete (seconds later)."""
    if type in (None, "DELETED"):
        return
    meta = body.get("metadata", {})
    labels = meta.get("labels") or {}
    ns, fn, job_name = meta.get("namespace", ""), labels.get(crd.LABEL_FUNCTION, ""), labels.get(JOB_NAME_LABEL, "")
    uploaded = terminated_state(dict(body), UPLOAD_CONTAINER)
    if not (ns and fn and job_name) or uploaded.get("exitCode") != 0 or (ns, job_name) in memo.state.compiled:
        return
    compiled = memo.state.compiled
    compiled[(ns, job_name)] = str(uploaded.get("message") or "")
    while len(compiled) > COMPILED_KEPT:  # a reconcile takes its entry; later events of the pod may add it again
        del compiled[next(iter(compiled))]
    memo.queue.add(("function", ns, fn), lambda: function.reconcile(memo, ns, fn))


# -- Trigger ---------------------------------------------------------------------------------------


@kopf.on.resume(*TRIGGER, id="trigger-resume")
@kopf.on.create(*TRIGGER, id="trigger-create")
@kopf.on.update(*TRIGGER, id="trigger-update")
async def trigger_changed(body: kopf.Body, memo: Context, **_: Any) -> None:
    await to_kopf(memo, "trigger", lambda: trigger.reconcile(memo, dict(body)))


@kopf.on.delete(*TRIGGER, id="trigger-cleanup")
async def trigger_deleted(body: kopf.Body, memo: Context, **_: Any) -> None:
    await to_kopf(memo, "trigger", lambda: trigger.cleanup(memo, dict(body)))


# -- FunctionJob -----------------------------------------------------------------------------------


@kopf.on.resume(*FUNCTION_JOB, id="functionjob-resume")
@kopf.on.create(*FUNCTION_JOB, id="functionjob-create")
@kopf.on.update(*FUNCTION_JOB, id="functionjob-update")
async def functionjob_changed(body: kopf.Body, memo: Context, **_: Any) -> None:
    await to_kopf(memo, "functionjob", lambda: job.reconcile(memo, dict(body)))
