"""Routing of the Kubernetes backend: the route table kept by watches, and the Services calls go to.

A :class:`KubeRouter` needs only a client and the settings, never a code store: the event dispatcher
(``sless-events``) builds one on its own, and the API's :class:`~sless_api.backends.kube.KubernetesPlatform` has one.
"""

from __future__ import annotations

import asyncio
import time

from sless_api.backends.kube import endpoints
from sless_api.backends.kube.activator import ActivatedUpstream, Activator, Demand
from sless_api.backends.kube.client import KubeClient
from sless_api.backends.kube.endpoints import ReadyEndpoints
from sless_api.backends.kube.routes import RouteTable, concurrency
from sless_api.backends.kube.watch import Resource, RouteWatch
from sless_api.backends.settings import KubeSettings
from sless_api.domain.errors import NotFound, Unavailable
from sless_api.domain.routing import Route
from sless_api.services.scaling.reporter import LoadReporter, default_reporter_id

SYNC_WAIT_SEC = 5.0


class KubeRouter:
    """The :class:`~sless_api.domain.ports.Router` of the Kubernetes backend.

    ``table``: the route table the watches feed (a subclass, for the event dispatcher, also keeps the
    event triggers: one watch feeds both). ``demand``: where calls in flight and waiting are reported (the
    scaler's reporter); the function Services' EndpointSlices feed the activator (``kube.activator``).
    """

    def __init__(self, kube: KubeClient, settings: KubeSettings, table: RouteTable | None = None,
                 demand: Demand | None = None, reporter_kind: str = "api") -> None:
        self.kube = kube
        self.settings = settings
        self.reporter: LoadReporter | None = None
        self._reporting: asyncio.Task[None] | None = None  # the reporter's start, kept from the collector
        if demand is None and settings.scaler_address:
            self.reporter = LoadReporter(settings.scaler_address, settings.scaler_token,
                                         default_reporter_id(reporter_kind))
            demand = self.reporter
        self.table = table if table is not None else RouteTable()
        self.watch = RouteWatch(kube, self.table)
        self.endpoints = ReadyEndpoints()
        slices = Resource(endpoints.PLURAL, endpoints.GROUP, endpoints.VERSION, endpoints.SELECTOR)
        self.endpoint_watch = RouteWatch(kube, self.endpoints, (slices,))
        self.activator = Activator(self.endpoints, self.endpoint_watch.listed, settings.activation_timeout_sec,
                                   settings.activation_queue, demand, direct=settings.routing == "endpoints")

    def start(self) -> None:
        """Start the watches, and the scaler's reporter on the running loop (the backends start on theirs)."""
        self.watch.start()
        self.endpoint_watch.start()
        if self.reporter is not None:
            self._reporting = asyncio.get_running_loop().create_task(self.reporter.start())

    async def close(self) -> None:
        await asyncio.gather(asyncio.to_thread(self.watch.stop), asyncio.to_thread(self.endpoint_watch.stop))
        if self.reporter is not None:
            await self.reporter.aclose()  # the scaler forgets this process's calls at once

    def loaded(self) -> bool:
        """Whether the route table has listed the cluster's Functions and Triggers (``RouteWatch.loaded``)."""
        return self.watch.loaded()

    def add_namespace(self, namespace: str) -> None:
        """A tenant namespace the API has touched (watched on its own when cluster-wide watches are refused)."""
        self.watch.add_namespace(namespace)
        self.endpoint_watch.add_namespace(namespace)

    async def _wait_synced(self, namespace: str) -> bool:
        """Wait (briefly) until NAMESPACE's watches have listed; False when they already had."""
        if self.watch.synced(namespace):
            return False
        deadline = time.monotonic() + SYNC_WAIT_SEC
        while not self.watch.synced(namespace):
            if time.monotonic() > deadline:
                raise Unavailable("the route table is still loading from the cluster; try again")
            await asyncio.sleep(0.05)
        return True

    async def route(self, namespace: str, name: str) -> Route:
        """From memory only; waits (briefly) only before the watches have listed for the first time."""
        route = self.table.lookup(namespace, name)
        if route is not None:
            return route
        if await self._wait_synced(namespace):
            route = self.table.lookup(namespace, name)
            if route is not None:
                return route
        raise NotFound(self.table.explain(namespace, name))

    async def event_route(self, namespace: str, name: str) -> Route:
        """Any deployed function (by the http route's rule), whether or not it has an http trigger."""
        fn = self.table.function(namespace, name)
        if fn is None and await self._wait_synced(namespace):
            fn = self.table.function(namespace, name)
        if fn is None:
            raise NotFound(f"function {name!r} not found in {namespace}")
        if not fn.deployed:
            raise Unavailable(f"function {name!r} is not ready (phase {fn.phase})")
        max_concurrency, pod_concurrency = concurrency(fn)
        return Route(namespace, name, fn.timeout_sec, "public", max_concurrency, fn.version, scaled=fn.scaled,
                     pod_concurrency=pod_concurrency)

    def upstream(self, route: Route) -> ActivatedUpstream:
        """The function's Service, once it has a ready pod (``kube.activator``); the call counts as demand."""
        service = route.target or route.function
        return self.activator.upstream(route, service, self.settings.service_url(route.namespace, service))
