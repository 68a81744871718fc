"""Leader election of the operator's replicas over a ``coordination.k8s.io`` Lease: only its holder runs Kopf.

Why not Kopf's own peering: peers of equal priority all pause when they see each other, so two replicas of one
Deployment would both stand still; and a higher priority does not make a replica that hangs (SIGSTOP, a stuck
node) give way. A Lease does: whoever holds it renews it, and a standby takes it over once it has seen the same
record (holder and renewal) unchanged for the Lease's duration, measured on its own clock (so the replicas'
clocks need not agree).

The life of a replica (``run_elected``):

1. standby: it tries to take the Lease every ``retry_sec`` (a PUT with the ``resourceVersion`` it read, so of two
   standbys only one wins) and runs nothing else meanwhile;
2. holder: Kopf starts (handlers, watches, timers), and a thread of its own renews the Lease every ``renew_sec``;
3. it stops holding in one of two ways. A SIGTERM (a rollout, a drain) ends Kopf as usual, and the Lease is
   given back at once, so a standby takes over within ``retry_sec`` instead of the Lease's duration. Losing it
   (the Lease names another holder, or no renewal succeeded for ``renew_deadline_sec``, which is shorter than
   the Lease's duration, so it steps down before anyone may take over) ends the process at once
   (``os._exit``): its replacement starts as a standby.

Kopf keeps its state in the objects (annotations and status), so the next holder resumes where the last one
stopped; every child has a name derived from its Function, so a write the old holder had in flight when it
stepped down cannot make a second set of children.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import logging
import os
import secrets
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kopf

from sless_operator.kube import ApiError, Kube, api_path

log = logging.getLogger(__name__)

LEASE_NAME = "sless-operator"
API_VERSION = "coordination.k8s.io/v1"


def micro_time(epoch: float) -> str:
    """A Lease's time stamp (``MicroTime``)."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def new_identity() -> str:
    """This process among the replicas: its pod (host) name, its pid, and a random part (a restarted container
    may get the same pid)."""
    return f"{socket.gethostname()}_{os.getpid()}_{secrets.token_hex(3)}"


@dataclass(frozen=True)
class Timing:
    """The Lease's duration, and how often its holder renews it and a standby tries to take it."""

    lease_sec: int = 15

    @property
    def renew_sec(self) -> float:
        return max(1.0, self.lease_sec / 5)

    @property
    def renew_deadline_sec(self) -> float:
        """A holder that could not renew for this long steps down: before a standby may take over."""
        return self.lease_sec * 2 / 3

    @property
    def retry_sec(self) -> float:
        return max(0.5, self.lease_sec / 7)


@dataclass
class _Seen:
    record: tuple[str, str]  # the holder and its last renewal, as last read
    since: float  # monotonic time this record was first read


class Lease:
    """One Lease taken, renewed and given back through the operator's Kube client."""

    def __init__(self, kube: Kube, namespace: str, identity: str, timing: Timing, name: str = LEASE_NAME) -> None:
        self.kube = kube
        self.namespace = namespace
        self.identity = identity
        self.timing = timing
        self.name = name
        self.path = api_path(API_VERSION, "leases", namespace, name)
        self._seen: _Seen | None = None
        self._waiting_for = ""  # the holder last logged as waited for

    def _spec(self, epoch: float, transitions: int, acquired: bool, holder: str | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {"holderIdentity": self.identity if holder is None else holder,
                                "leaseDurationSeconds": self.timing.lease_sec, "renewTime": micro_time(epoch),
                                "leaseTransitions": transitions}  # fmt: skip
        if acquired:
            spec["acquireTime"] = micro_time(epoch)
        return spec

    async def try_acquire(self) -> bool:
        """Take the Lease if it is free, given back, or its holder silent for its whole duration."""
        lease = await self.kube.get(self.path)
        now = time.time()
        if lease is None:
            body = {"apiVersion": API_VERSION, "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": self._spec(now, 0, acquired=True)}  # fmt: skip
            try:
                await self.kube.create(api_path(API_VERSION, "leases", self.namespace), body)
            except ApiError as exc:
                if exc.conflict:
                    return False  # another replica created it first
                raise
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, str(spec.get("renewTime") or ""))
        seen_at = time.monotonic()
        if self._seen is None or self._seen.record != record:
            self._seen = _Seen(record, seen_at)
        duration = float(spec.get("leaseDurationSeconds") or self.timing.lease_sec)
        if holder not in ("", self.identity) and seen_at - self._seen.since <= duration:
            if holder != self._waiting_for:
                self._waiting_for = holder
                log.info("standing by: the Lease %s/%s is held by %s", self.namespace, self.name, holder)
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (holder != self.identity)
        lease["spec"] = self._spec(now, transitions, acquired=True)
        try:
            await self.kube.request("PUT", self.path, body=lease)  # with the resourceVersion read: one winner
        except ApiError as exc:
            if exc.conflict:
                return False
            raise
        return True

    async def acquire(self, stop: threading.Event) -> bool:
        """Wait until this process holds the Lease (True), or STOP is set (False)."""
        while not stop.is_set():
            try:
                if await self.try_acquire():
                    log.info("leading: took the Lease %s/%s as %s", self.namespace, self.name, self.identity)
                    return True
            except ApiError as exc:
                log.warning("cannot read or take the Lease %s/%s: %s", self.namespace, self.name, exc)
            await asyncio.sleep(self.timing.retry_sec)
        return False

    async def renew_once(self) -> str:
        """Renew the Lease; "" when renewed, else why it is lost (another holder). ApiError when unreachable."""
        lease = await self.kube.get(self.path)
        holder = ((lease or {}).get("spec") or {}).get("holderIdentity") or ""
        if lease is None or holder != self.identity:
            return f"the Lease {self.namespace}/{self.name} is now held by {holder or 'nobody'}"
        lease["spec"]["renewTime"] = micro_time(time.time())
        try:
            await self.kube.request("PUT", self.path, body=lease)
        except ApiError as exc:
            if exc.conflict:
                return f"the Lease {self.namespace}/{self.name} changed under its holder (taken over)"
            raise
        return ""

    async def hold(self, stop: threading.Event) -> str:
        """Renew until STOP is set (""), or until the Lease is lost: why."""
        renewed = time.monotonic()
        while True:
            deadline = renewed + self.timing.renew_deadline_sec
            # checked before anything else: after a pause of the whole process (SIGSTOP) the Lease may be another's
            if time.monotonic() > deadline:
                return f"no renewal of the Lease for {time.monotonic() - renewed:.1f}s"
            if stop.is_set():
                return ""
            try:
                lost = await self.renew_once()
                if lost:
                    return lost
                renewed = time.monotonic()
            except ApiError as exc:
                log.warning("cannot renew the Lease %s/%s: %s", self.namespace, self.name, exc)
            await asyncio.sleep(self.timing.renew_sec if time.monotonic() - renewed < 1 else self.timing.retry_sec)

    async def give_back(self) -> None:
        """Let a standby take over at once (a graceful stop): no holder, renewed now."""
        lease = await self.kube.get(self.path)
        spec = (lease or {}).get("spec") or {}
        if lease is None or spec.get("holderIdentity") != self.identity:
            return
        lease["spec"] = {**spec, "holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": micro_time(time.time())}
        try:
            await self.kube.request("PUT", self.path, body=lease)
            log.info("gave back the Lease %s/%s", self.namespace, self.name)
        except ApiError as exc:
            log.warning("cannot give back the Lease %s/%s (a standby takes it when it expires): %s",
                        self.namespace, self.name, exc)  # fmt: skip


def login(official_client: bool) -> kopf.ConnectionInfo | None:
    """The same credentials Kopf logs in with (handlers.login): a service account's, else the kubeconfig's."""
    settings = kopf.OperatorSettings()
    info = kopf.login_with_service_account(settings=settings) or kopf.login_with_kubeconfig(settings=settings)
    if info is None and official_client:
        info = kopf.login_via_client(settings=settings, logger=log)
    return info


class Election:
    """The Lease's side of ``run_elected``: a thread with its own event loop that takes the Lease, tells the main
    thread, holds it, and ends the process when it is lost."""

    def __init__(self, namespace: str, timing: Timing, official_client: bool,
                 on_lost: Callable[[str], None] | None = None) -> None:  # fmt: skip
        self.namespace = namespace
        self.timing = timing
        self.official_client = official_client
        self.identity = new_identity()
        self.acquired = threading.Event()
        self.stop = threading.Event()
        self.failed = ""  # why the thread ended before the Lease was taken
        self._on_lost = on_lost or _step_down
        self._thread = threading.Thread(target=self._run, name="sless-leader-election", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            asyncio.run(self._elect())
        except Exception as exc:  # credentials or the loop itself: no Lease, so no Kopf either
            self.failed = f"leader election failed: {exc}"
            log.exception("leader election failed")

    async def _elect(self) -> None:
        info = login(self.official_client)
        if info is None:
            self.failed = "no Kubernetes credentials for the leader election"
            return
        kube = Kube(concurrency=2, request_timeout=max(1.0, self.timing.renew_deadline_sec / 3))

        async def relogin() -> kopf.ConnectionInfo | None:
            return login(self.official_client)

        await kube.connect(info, relogin)
        lease = Lease(kube, self.namespace, self.identity, self.timing)
        try:
            if not await lease.acquire(self.stop):
                return
            self.acquired.set()
            lost = await lease.hold(self.stop)
            if lost:
                self._on_lost(lost)
                return
            await lease.give_back()
        finally:
            await kube.close()


def _step_down(why: str) -> None:
    """Lost the Lease: stop now, before another write (the process's replacement starts as a standby)."""
    log.error("stepping down: %s; exiting so that only the Lease's holder runs", why)
    logging.shutdown()
    os._exit(1)


class _Alive(http.server.BaseHTTPRequestHandler):
    """A standby's liveness answer (Kopf's endpoint is not up before it holds the Lease)."""

    path_served = "/healthz"

    def do_GET(self) -> None:
        found = self.path.split("?", 1)[0] == self.path_served
        body = b'{"standby": true}' if found else b'{"error": "not found"}'
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (http.server's signature)
        return  # probes every few seconds: not worth a log line


@contextlib.contextmanager
def standby_liveness(url: str | None) -> Iterator[None]:
    """Answer the liveness probe at URL (Kopf's ``--liveness`` URL) while standing by, so the kubelet does not
    restart a standby for being one; closed before Kopf binds the same port."""
    if not url:
        yield
        return
    parts = urllib.parse.urlsplit(url)
    handler = type("Alive", (_Alive,), {"path_served": parts.path or "/"})
    server = http.server.ThreadingHTTPServer((parts.hostname or "0.0.0.0", parts.port or 80), handler)
    thread = threading.Thread(target=server.serve_forever, name="sless-standby-liveness", daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def run_elected(namespace: str, lease_sec: int, official_client: bool, run: Callable[[], None],
                liveness: str | None = None) -> int:  # fmt: skip
    """Run RUN (Kopf) while this process holds the operator's Lease in NAMESPACE; 1 when it never got it."""
    election = Election(namespace, Timing(lease_sec), official_client)
    election.start()
    with standby_liveness(liveness):
        while not election.acquired.wait(0.5):
            if not election.alive:
                log.error("%s", election.failed or "leader election ended without the Lease")
                return 1
    try:
        run()
    finally:
        election.stop.set()
        election.join(10.0)
    return 0
