"""The route table's list-and-watch against a real API server, with a page far smaller than the list.

A list larger than a page is complete; its pages are read one at a time as the table takes the objects (so a
relist never holds the whole list of objects); and a relist after the watch was away (another watcher on the
same table, as after a restart or an expired watch) leaves exactly the functions that exist: none lost, the
deleted ones gone.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

from sless_api.backends.kube import watch
from sless_api.backends.kube.client import KubeClient
from sless_api.backends.kube.routes import FUNCTIONS, TRIGGERS, RouteTable
from sless_api.backends.kube.watch import Resource, Watcher
from sless_api.backends.settings import KubeSettings
from sless_core import crd
from tests.support.poll import until
from tests.support.testbed import Testbed

pytestmark = [pytest.mark.k8s]

PAGE = 5
COUNT = 23  # four full pages and a part


class PageWitness(RouteTable):
    """The route table, noting how many requests its watcher had sent when each listed object reached it."""

    def __init__(self) -> None:
        super().__init__()
        self.watcher: Watcher | None = None
        self.seen_at: dict[str, list[int]] = {}

    def replace(self, kind: str, objects: Iterable[dict[str, Any]], namespace: str | None = None) -> None:
        def noted() -> Iterator[dict[str, Any]]:
            seen = self.seen_at.setdefault(kind, [])
            for obj in objects:
                assert self.watcher is not None
                seen.append(self.watcher.requests)
                yield obj

        self.seen_at[kind] = []
        super().replace(kind, noted(), namespace)


def function(ns: str, name: str) -> dict[str, Any]:
    return {"apiVersion": crd.API_VERSION, "kind": "Function", "metadata": {"name": name, "namespace": ns},
            "spec": {"runtime": "python3.11"}}  # fmt: skip


def started(bed: Testbed, table: PageWitness, plural: str, ns: str) -> tuple[Watcher, threading.Event]:
    kube = KubeClient(KubeSettings.from_env(bed.env))
    stop = threading.Event()
    watcher = Watcher(kube, table, Resource(plural), ns, stop)
    table.watcher = watcher
    watcher.start()
    until(f"{plural} listed", watcher.listed.is_set, timeout=30)
    return watcher, stop


def stopped(watcher: Watcher, stop: threading.Event) -> None:
    stop.set()
    watcher.stop()
    watcher.join(10)


def test_a_list_larger_than_a_page_is_complete_and_read_a_page_at_a_time(
    sless_crds: Testbed, tenant: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    bed = sless_crds
    monkeypatch.setattr(watch, "LIST_PAGE", PAGE)
    names = [f"paged-{i:02d}" for i in range(COUNT)]
    bed.apply(*(function(tenant, name) for name in names))
    bed.apply(*({"apiVersion": crd.API_VERSION, "kind": "Trigger", "metadata": {"name": name, "namespace": tenant},
                 "spec": {"type": "http", "function": name}} for name in names))  # fmt: skip
    table = PageWitness()
    functions = started(bed, table, FUNCTIONS, tenant)
    triggers = started(bed, table, TRIGGERS, tenant)
    try:
        assert all(table.function(tenant, name) is not None for name in names)
        # every page asked for only once the table had taken the previous one: object i arrived with page i // 5
        assert table.seen_at[FUNCTIONS] == [i // PAGE + 1 for i in range(COUNT)]
        assert table.seen_at[TRIGGERS] == [i // PAGE + 1 for i in range(COUNT)]
        assert sorted(name for (_, name) in table.routes()) == []  # not deployed yet: known, not routed
    finally:
        stopped(*functions)
        stopped(*triggers)

    # away: three deleted, two added; a relist (a watcher of its own, as after a restart or an expired watch)
    bed.kubectl("delete", "-n", tenant, f"{crd.FUNCTION_PLURAL}.{crd.GROUP}", *names[:3])
    added = ["paged-new-a", "paged-new-b"]
    bed.apply(*(function(tenant, name) for name in added))
    functions = started(bed, table, FUNCTIONS, tenant)
    try:
        present = [name for name in [*names, *added] if table.function(tenant, name) is not None]
        assert present == [*names[3:], *added]
        assert len(table.seen_at[FUNCTIONS]) == COUNT - 3 + 2
    finally:
        stopped(*functions)
