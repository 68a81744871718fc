"""The activator's rules: a call to a scaled function with no ready pod waits for one, bounded in count and time.

The EndpointSlices come from a thread, as the watch delivers them; the calls wait on the event loop.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from sless_api.backends.kube.activator import RETRY_AFTER_SEC, Activator
from sless_api.backends.kube.endpoints import ReadyEndpoints, ready_addresses
from sless_api.domain.errors import NotActivated
from sless_api.domain.routing import Route
from sless_api.gateway import calltiming
from sless_api.gateway.admission import Throttled
from sless_api.gateway.calltiming import CallTiming
from tests.support.poll import until_async

NS, FN = "sless-t", "hello"
URL = "http://hello.sless-t.svc.cluster.local:8080"


def endpoint_slice(name: str, *states: tuple[str, bool, bool], service: str = FN, ns: str = NS) -> dict[str, Any]:
    """A slice with endpoints (address, ready, terminating) as the EndpointSlice controller writes them."""
    return {
        "metadata": {"name": name, "namespace": ns, "labels": {"kubernetes.io/service-name": service}},
        "endpoints": [{"addresses": [ip], "conditions": {"ready": ready, "terminating": terminating}}
                      for ip, ready, terminating in states],
    }


class Counts:
    """The demand the activator reports, as the scaler's reporter would receive it."""

    def __init__(self) -> None:
        self.in_flight: dict[tuple[str, str], int] = {}
        self.waiting: dict[tuple[str, str], int] = {}
        self.woken = 0

    def call_started(self, namespace: str, function: str) -> None:
        key = (namespace, function)
        self.in_flight[key] = self.in_flight.get(key, 0) + 1

    def call_ended(self, namespace: str, function: str) -> None:
        self.in_flight[(namespace, function)] -= 1

    def waiting_started(self, namespace: str, function: str) -> None:
        key = (namespace, function)
        self.waiting[key] = self.waiting.get(key, 0) + 1
        self.woken += 1

    def waiting_ended(self, namespace: str, function: str) -> None:
        self.waiting[(namespace, function)] -= 1


def make(timeout: float = 10.0, queue: int = 5, synced: bool = True) -> tuple[Activator, ReadyEndpoints, Counts]:
    endpoints, counts = ReadyEndpoints(), Counts()
    return Activator(endpoints, lambda ns: synced, timeout, queue, counts), endpoints, counts


SCALED = Route(NS, FN, 30.0, "public", scaled=True)


def from_thread(fn: Any, *args: Any) -> None:
    thread = threading.Thread(target=fn, args=args)
    thread.start()
    thread.join()


def test_only_ready_endpoints_that_are_not_terminating_count() -> None:
    obj = endpoint_slice("s1", ("10.0.0.1", True, False), ("10.0.0.2", False, False), ("10.0.0.3", True, True))
    assert ready_addresses(obj) == ("10.0.0.1:8080",)


def test_slices_add_up_per_service_and_a_relist_replaces_a_namespace() -> None:
    endpoints = ReadyEndpoints()
    endpoints.apply("endpointslices", "ADDED", endpoint_slice("a", ("10.0.0.1", True, False)))
    endpoints.apply("endpointslices", "ADDED", endpoint_slice("b", ("10.0.0.2", True, False)))
    endpoints.apply("endpointslices", "ADDED", endpoint_slice("c", ("10.0.0.9", True, False), ns="other"))
    assert sorted(endpoints.addresses(NS, FN)) == ["10.0.0.1:8080", "10.0.0.2:8080"]
    endpoints.apply("endpointslices", "DELETED", endpoint_slice("a"))
    assert endpoints.addresses(NS, FN) == ("10.0.0.2:8080",)
    endpoints.replace("endpointslices", [], NS)  # the namespace relisted empty: its slices are gone
    assert not endpoints.has_ready(NS, FN)
    assert endpoints.has_ready("other", FN)  # another namespace's part is kept


def test_a_call_at_zero_waits_for_the_first_ready_pod_and_is_cold() -> None:
    activator, endpoints, counts = make()

    async def scenario() -> CallTiming:
        timing = CallTiming(ready=0.0)
        token = calltiming.CURRENT.set(timing)
        try:
            call = asyncio.ensure_future(_through(activator))
            await until_async("the call reported waiting", lambda: counts.woken == 1, 5, 0.01)  # before any pod
            assert not call.done() and counts.waiting[(NS, FN)] == 1
            endpoints.apply("endpointslices", "ADDED", endpoint_slice("s", ("10.0.0.1", False, False)))
            await asyncio.sleep(0)
            assert not call.done()  # a pod that is not ready yet does not release the call
            await asyncio.to_thread(endpoints.apply, "endpointslices", "MODIFIED",
                                    endpoint_slice("s", ("10.0.0.1", True, False)))
            assert await asyncio.wait_for(call, 5) == URL
        finally:
            calltiming.CURRENT.reset(token)
        return timing

    timing = asyncio.run(scenario())
    assert timing.cold and timing.start_sec > 0
    assert counts.waiting[(NS, FN)] == 0 and counts.in_flight[(NS, FN)] == 0
    assert activator.waiting == {}


def test_a_ready_function_and_a_fixed_one_are_forwarded_at_once() -> None:
    activator, endpoints, counts = make()
    from_thread(endpoints.apply, "endpointslices", "ADDED", endpoint_slice("s", ("10.0.0.1", True, False)))
    assert asyncio.run(_through(activator)) == URL
    fixed = Route(NS, "fixed", 30.0, "public")  # no scale: never held, even with no endpoint known
    assert asyncio.run(_through(activator, fixed, "fixed")) == URL
    assert counts.woken == 0 and counts.in_flight == {(NS, FN): 0, (NS, "fixed"): 0}


def test_without_listed_endpoints_a_call_is_forwarded_as_before() -> None:
    activator, _, counts = make(synced=False)
    assert asyncio.run(_through(activator)) == URL
    assert counts.woken == 0


def test_no_pod_in_time_is_503_with_retry_after() -> None:
    activator, _, counts = make(timeout=0.2)
    with pytest.raises(NotActivated) as refused:
        asyncio.run(_through(activator))
    assert refused.value.status == 503 and refused.value.retry_after == RETRY_AFTER_SEC
    assert "no ready pod 0.2s after" in refused.value.message
    assert counts.in_flight[(NS, FN)] == 0 and counts.waiting[(NS, FN)] == 0


def test_the_queue_at_zero_is_bounded() -> None:
    activator, endpoints, _ = make(queue=2)

    async def scenario() -> None:
        held = [asyncio.ensure_future(_through(activator)) for _ in range(2)]
        await until_async("two calls held", lambda: activator.waiting.get((NS, FN)) == 2, 5, 0.01)
        with pytest.raises(NotActivated) as refused:
            await _through(activator)
        assert "2 calls already wait" in refused.value.message and refused.value.retry_after == RETRY_AFTER_SEC
        await asyncio.to_thread(endpoints.apply, "endpointslices", "ADDED",
                                endpoint_slice("s", ("10.0.0.1", True, False)))
        assert await asyncio.wait_for(asyncio.gather(*held), 5) == [URL, URL]

    asyncio.run(scenario())


async def _through(activator: Activator, route: Route = SCALED, service: str = FN) -> str:
    async with activator.upstream(route, service, URL) as url:
        return url



def test_direct_routing_picks_the_ready_pod_with_the_fewest_calls_in_flight() -> None:
    endpoints = ReadyEndpoints()
    activator = Activator(endpoints, lambda ns: True, 10.0, 5, direct=True)
    pods = (("10.0.0.1", True, False), ("10.0.0.2", True, False), ("10.0.0.3", True, False))
    endpoints.apply("endpointslices", "ADDED", endpoint_slice("s", *pods))

    async def scenario() -> None:
        first = activator.upstream(SCALED, FN, URL)
        busy = await first.__aenter__()  # one call held open on one pod
        picks = []
        for _ in range(4):  # the others share the next calls in turn, the busy pod gets none while they are idle
            async with activator.upstream(SCALED, FN, URL) as url:
                picks.append(url)
        assert busy not in picks and len(set(picks)) == 2
        assert activator.in_flight == {busy.removeprefix("http://"): 1}
        await first.__aexit__(None, None, None)
        assert activator.in_flight == {}

    asyncio.run(scenario())
    leaving = endpoint_slice("s", ("10.0.0.1", True, True), ("10.0.0.2", True, False))
    endpoints.apply("endpointslices", "MODIFIED", leaving)
    assert asyncio.run(_through(activator)) == "http://10.0.0.2:8080"  # a terminating pod takes no new call


def test_slice_ports_and_ipv6_addresses() -> None:
    obj = endpoint_slice("s", ("fd00::5", True, False))
    obj["ports"] = [{"name": "http", "port": 9000}]
    assert ready_addresses(obj) == ("[fd00::5]:9000",)


LIMITED = Route(NS, FN, 30.0, "public", scaled=True, pod_concurrency=1)


def test_a_full_pod_takes_no_more_calls_and_a_waiting_call_is_demand() -> None:
    endpoints, counts = ReadyEndpoints(), Counts()
    activator = Activator(endpoints, lambda ns: True, 10.0, 5, counts, direct=True)
    two = endpoint_slice("s", ("10.0.0.1", True, False), ("10.0.0.2", True, False))
    endpoints.apply("endpointslices", "ADDED", two)

    async def scenario() -> None:
        first, second = activator.upstream(LIMITED, FN, URL), activator.upstream(LIMITED, FN, URL)
        assert {await first.__aenter__(), await second.__aenter__()} == {"http://10.0.0.1:8080", "http://10.0.0.2:8080"}
        third = asyncio.ensure_future(_through(activator, LIMITED))
        await until_async("the third call waits for a slot", lambda: counts.waiting.get((NS, FN)) == 1, 5, 0.01)
        assert counts.in_flight[(NS, FN)] == 3  # three calls started, one of them waits for a slot
        await second.__aexit__(None, None, None)  # a call ends: its pod takes the waiting one
        assert await asyncio.wait_for(third, 5) == "http://10.0.0.2:8080"
        # every pod full again; a new pod that becomes ready takes the next waiting call
        busy = activator.upstream(LIMITED, FN, URL)
        await busy.__aenter__()
        fourth = asyncio.ensure_future(_through(activator, LIMITED))
        await until_async("the fourth call waits", lambda: counts.waiting.get((NS, FN)) == 1, 5, 0.01)
        new_pod = endpoint_slice("s2", ("10.0.0.3", True, False))
        await asyncio.to_thread(endpoints.apply, "endpointslices", "ADDED", new_pod)
        assert await asyncio.wait_for(fourth, 5) == "http://10.0.0.3:8080"
        await busy.__aexit__(None, None, None)
        await first.__aexit__(None, None, None)

    asyncio.run(scenario())
    assert activator.in_flight == {} and activator.waiting == {}


def test_no_slot_in_time_is_429_and_service_routing_counts_per_ready_pod() -> None:
    endpoints = ReadyEndpoints()
    activator = Activator(endpoints, lambda ns: True, 0.2, 5)  # Service routing
    endpoints.apply("endpointslices", "ADDED", endpoint_slice("s", ("10.0.0.1", True, False)))

    async def scenario() -> None:
        held = activator.upstream(LIMITED, FN, URL)
        assert await held.__aenter__() == URL
        with pytest.raises(Throttled) as refused:  # 1 call per pod, 1 ready pod: full
            await _through(activator, LIMITED)
        assert "max_concurrency of 1 calls in flight on each of its 1 ready pods" in refused.value.message
        assert refused.value.retry_after == 1
        two = endpoint_slice("s", ("10.0.0.1", True, False), ("10.0.0.2", True, False))
        endpoints.apply("endpointslices", "MODIFIED", two)
        assert await _through(activator, LIMITED) == URL  # 2 ready pods: room for a second call
        await held.__aexit__(None, None, None)

    asyncio.run(scenario())


def test_a_pod_that_refuses_the_connection_is_passed_over_for_a_ready_one() -> None:
    """A pod whose process is gone (nothing listens at its address) while its endpoint is still ready: each call
    sent there goes on to the other ready pod at once instead of trying the dead address again until it fails.
    Two loopback addresses stand for two pods: 127.0.0.1 serves, 127.0.0.2 refuses (nothing bound there)."""
    from sless_api.gateway.invoker import Invoker

    async def scenario() -> None:
        served: list[str] = []

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while (await reader.readuntil(b"\r\n\r\n")) != b"":
                served.append("call")
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                await writer.drain()
                if reader.at_eof():
                    break
            writer.close()

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        endpoints = ReadyEndpoints()
        activator = Activator(endpoints, lambda ns: True, 10.0, 5, direct=True)
        pods = endpoint_slice("s", ("127.0.0.2", True, False), ("127.0.0.1", True, False))
        pods["ports"] = [{"name": "http", "port": port}]
        endpoints.apply("endpointslices", "ADDED", pods)

        class Router:
            def upstream(self, route: Route) -> Any:
                return activator.upstream(route, FN, URL)

        invoker = Invoker(Router(), None, timeout_margin_sec=1.0)  # type: ignore[arg-type]
        try:
            results = [await invoker.call(SCALED, "GET", "/", [], b"", "http") for _ in range(6)]
        finally:
            await invoker.close()
            server.close()
        assert [r.status for r in results] == [200] * 6, [r.error for r in results]
        assert len(served) == 6  # half of them were picked for the refusing pod first (in turn)
        assert activator.in_flight == {}

    asyncio.run(scenario())
