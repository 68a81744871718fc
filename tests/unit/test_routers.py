"""The routing half of the backend interface, apart from any backend's CRUD.

The Kubernetes router is built from a client and settings alone (what ``sless-events`` does); it is
fed here with watch events as the API server sends them (the client is never called: its watches are
not started). The change feed is what the cron scheduler and the event dispatchers subscribe to.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from sless_api.backends.kube.client import KubeClient
from sless_api.backends.kube.router import KubeRouter
from sless_api.backends.kube.routes import FUNCTIONS, TRIGGERS
from sless_api.backends.settings import KubeSettings
from sless_api.domain.changes import ChangeListeners
from sless_api.domain.errors import Unavailable
from sless_api.domain.ports import Router
from sless_api.domain.routing import Route
from tests.support.kube_objects import NS, fn, trg


def kube_router(*objects: tuple[str, dict[str, Any]]) -> KubeRouter:
    router = KubeRouter(cast(KubeClient, None), KubeSettings())  # no watch is started: no client call
    for kind, obj in objects:
        router.table.apply(kind, "ADDED", obj)
    return router


def test_kube_event_route_needs_no_http_trigger() -> None:
    router: Router = kube_router((FUNCTIONS, fn("a", timeout=12)), (TRIGGERS, trg("tick", "a", kind="cron")),
                                 (FUNCTIONS, fn("w")), (TRIGGERS, trg("web", "w", auth="token")))
    assert asyncio.run(router.event_route(NS, "a")) == Route(NS, "a", 12.0, "public")
    assert asyncio.run(router.route(NS, "w")) == Route(NS, "w", 30.0, "token")


def test_kube_event_route_refuses_a_function_not_deployed() -> None:
    router = kube_router((FUNCTIONS, fn("b", phase="Building")))
    with pytest.raises(Unavailable, match="not ready"):
        asyncio.run(router.event_route(NS, "b"))
    router.table.apply(FUNCTIONS, "MODIFIED", fn("b", phase="Building", image="img:1"))  # a rebuild serves on
    assert asyncio.run(router.event_route(NS, "b")).function == "b"


def test_kube_upstream_is_the_function_service() -> None:
    router = kube_router((FUNCTIONS, fn("c")), (TRIGGERS, trg("web", "c")))

    async def base_url() -> str:
        async with router.upstream(await router.route(NS, "c")) as url:
            return url

    assert asyncio.run(base_url()) == KubeSettings().service_url(NS, "c")


def test_change_listeners_all_hear_even_after_one_fails_and_can_leave() -> None:
    feed, heard = ChangeListeners(), list[str]()

    def broken() -> None:
        raise RuntimeError("listener bug")

    feed.subscribe(broken)
    leave = feed.subscribe(lambda: heard.append("cron"))
    feed.subscribe(lambda: heard.append("events"))
    feed.notify()
    assert heard == ["cron", "events"]
    leave()
    leave()  # twice is harmless
    feed.notify()
    assert heard == ["cron", "events", "events"]
