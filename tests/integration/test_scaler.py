"""``sless-scaler`` as a real process on loopback, driven as KEDA drives it and fed by real LoadReporters.

KEDA's side uses the generated ``externalscaler`` stub (IsActive, GetMetricSpec, GetMetrics, StreamIsActive) over
a grpc.aio channel; the load comes from :class:`LoadReporter` (in this process, and in a child process that is
killed to show that a dead reporter's counts expire). Waits are on conditions (tests.support.poll) or on the
stream's next message with a bounded timeout: a stream message that arrives proves the push, no sleep does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import grpc
import pytest

from sless_api.services.scaling.proto import (
    externalscaler_pb2,
    externalscaler_pb2_grpc,
    loadreports_pb2,
    loadreports_pb2_grpc,
)
from sless_api.services.scaling.reporter import LoadReporter
from tests.support import scaler as scalerproc
from tests.support.poll import holds_async, until, until_async
from tests.support.scaler import SCALER, TOKEN, Scaler, serving
from tests.support.services import free_port

NS = "tenant-a"
#: A message the scaler pushes reaches the test within this on a loaded 2-core machine (it takes milliseconds).
PUSH_TIMEOUT = 10.0


@pytest.fixture
def start_scaler(tmp_path: Path) -> Iterator[Callable[..., Scaler]]:
    """Start ``sless-scaler`` on a free loopback port with extra env vars; stopped (SIGTERM) after the test."""
    started: list[Scaler] = []

    def start(**env: str) -> Scaler:
        started.append(scalerproc.start(tmp_path, f"scaler-{len(started)}", **env))
        return started[-1]

    yield start
    for scaler in started:
        scalerproc.stop(scaler)


def ref(function: str, namespace: str = NS, **metadata: str) -> externalscaler_pb2.ScaledObjectRef:
    """The ScaledObjectRef KEDA sends for a function's ``external-push`` trigger."""
    meta = {"scalerAddress": "sless-scaler:9090", "function": function, **metadata}
    return externalscaler_pb2.ScaledObjectRef(name=f"{function}-so", namespace=namespace, scalerMetadata=meta)


@contextlib.asynccontextmanager
async def keda(address: str) -> AsyncIterator[externalscaler_pb2_grpc.ExternalScalerAsyncStub]:
    async with grpc.aio.insecure_channel(address) as channel:
        yield externalscaler_pb2_grpc.ExternalScalerStub(channel)


async def metric(stub: externalscaler_pb2_grpc.ExternalScalerAsyncStub, function: str) -> int:
    answer = await stub.GetMetrics(externalscaler_pb2.GetMetricsRequest(scaledObjectRef=ref(function),
                                                                         metricName="s0-inflight"))
    (value,) = answer.metricValues
    assert value.metricName == "s0-inflight" and value.metricValueFloat == value.metricValue
    return value.metricValue


async def until_metric(stub: externalscaler_pb2_grpc.ExternalScalerAsyncStub, function: str, want: int,
                       timeout: float = 15) -> None:
    """Poll GetMetrics as KEDA's HPA does until it says WANT."""
    last: list[int] = []

    async def probe() -> None:
        last.append(await metric(stub, function))

    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        await probe()
        if last[-1] == want:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"GetMetrics({function}) = {want} not reached within {timeout}s; got {last[-5:]}")
        await asyncio.sleep(0.1)


async def next_state(call: grpc.aio.UnaryStreamCall[externalscaler_pb2.ScaledObjectRef,
                                                    externalscaler_pb2.IsActiveResponse]) -> bool:
    message = await asyncio.wait_for(call.read(), PUSH_TIMEOUT)
    assert message is not grpc.aio.EOF, "the stream ended"
    assert isinstance(message, externalscaler_pb2.IsActiveResponse)
    return message.result


def reporter(scaler: Scaler, name: str, interval: float = 0.2, **kwargs: float) -> LoadReporter:
    return LoadReporter(scaler.address, TOKEN, name, interval=interval, **kwargs)


def test_keda_sees_the_sum_of_two_reporters_and_the_trigger_target(start_scaler: Callable[..., Scaler]) -> None:
    scaler = start_scaler()

    async def run() -> None:
        async with keda(scaler.address) as stub, reporter(scaler, "api-1") as one, reporter(scaler, "api-2") as two:
            assert not (await stub.IsActive(ref("resize"))).result
            assert await metric(stub, "resize") == 0
            for _ in range(2):
                one.begin(NS, "resize")
            two.begin(NS, "resize")
            two.begin(NS, "resize", waiting=True)
            one.begin(NS, "thumbs")
            await until_metric(stub, "resize", 4)  # 2 + 1 in flight, 1 waiting
            await until_metric(stub, "thumbs", 1)
            assert (await stub.IsActive(ref("resize"))).result
            assert await metric(stub, "other") == 0
            # the same function name in another namespace is another function
            other_ns = await stub.GetMetrics(externalscaler_pb2.GetMetricsRequest(
                scaledObjectRef=ref("resize", namespace="tenant-b"), metricName="inflight"))
            assert other_ns.metricValues[0].metricValue == 0

            (spec,) = (await stub.GetMetricSpec(ref("resize", target="3"))).metricSpecs
            assert (spec.metricName, spec.targetSize, spec.targetSizeFloat) == ("inflight", 3, 3.0)
            (spec,) = (await stub.GetMetricSpec(ref("resize"))).metricSpecs
            assert (spec.targetSize, spec.targetSizeFloat) == (10, 10.0)  # the default target
            (spec,) = (await stub.GetMetricSpec(ref("resize", target="2.5"))).metricSpecs
            assert (spec.targetSize, spec.targetSizeFloat) == (3, 2.5)

            one.end(NS, "resize")
            two.end(NS, "resize", waiting=True)
            await until_metric(stub, "resize", 2)
            one.end(NS, "resize")
            two.end(NS, "resize")
            one.end(NS, "thumbs")
            await until_metric(stub, "resize", 0)
            await until_metric(stub, "thumbs", 0)
            assert not (await stub.IsActive(ref("resize"))).result
            # idle reporters stop sending: the count of reports stays put over several intervals
            sent = one.reports_sent
            await holds_async("an idle reporter sends nothing", lambda: one.reports_sent == sent, 1.0,
                              why="it ticks every 0.2 s: one that still sent would in 1 s, five times")

    asyncio.run(run())


def test_the_stream_pushes_active_the_moment_a_call_waits(start_scaler: Callable[..., Scaler]) -> None:
    # No keep-alive and no periodic report within the test: only the push on the first waiter can bring the message.
    scaler = start_scaler(SLESS_SCALER_KEEPALIVE_SEC="300")

    async def run() -> None:
        async with keda(scaler.address) as stub, reporter(scaler, "api-1", interval=300) as api:
            call = stub.StreamIsActive(ref("cold"))
            assert await next_state(call) is False  # the state at once when the stream opens
            loop = asyncio.get_running_loop()
            async with api.waiting(NS, "cold"):
                started = loop.time()
                assert await next_state(call) is True
                pushed_in = loop.time() - started
                assert pushed_in < PUSH_TIMEOUT
                assert (await stub.IsActive(ref("cold"))).result
                assert await metric(stub, "cold") == 1
                async with api.waiting(NS, "cold"):  # a second waiter: no state change, no message
                    await api.report_now()
                    assert await metric(stub, "cold") == 2
            await api.report_now()  # the calls left: the function goes idle, and the stream says so
            assert await next_state(call) is False
            call.cancel()  # KEDA went away: the server ends the stream, and keeps serving
            assert await call.code() == grpc.StatusCode.CANCELLED
            async with api.waiting(NS, "cold"):
                await until_metric(stub, "cold", 1)
        # after aclose(), the reporter's counts are gone at once (not after its ttl)
        async with keda(scaler.address) as stub:
            call = stub.StreamIsActive(ref("cold"))
            assert await next_state(call) is False
            call.cancel()

    asyncio.run(run())
    until("the scaler logged the stream's end", lambda: any(line["msg"] == "stream closed for tenant-a/cold"
                                                            for line in scaler.lines()), 10)


def test_the_stream_resends_the_state_as_keepalive(start_scaler: Callable[..., Scaler]) -> None:
    scaler = start_scaler(SLESS_SCALER_KEEPALIVE_SEC="0.2")

    async def run() -> None:
        async with keda(scaler.address) as stub:
            call = stub.StreamIsActive(ref("quiet"))
            states = [await next_state(call) for _ in range(4)]
            assert states == [False] * 4
            call.cancel()

    asyncio.run(run())


REPORTER_SCRIPT = """
import asyncio, sys
from sless_api.services.scaling.reporter import LoadReporter

async def main():
    api = LoadReporter(sys.argv[1], sys.argv[2], "doomed", interval=0.2, ttl=1.5)
    await api.start()
    api.begin("tenant-a", "orphan")
    api.begin("tenant-a", "orphan", waiting=True)
    while not api.reports_sent:
        await asyncio.sleep(0.05)
    print("reported", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def test_the_counts_of_a_killed_reporter_expire(start_scaler: Callable[..., Scaler]) -> None:
    scaler = start_scaler()
    child = subprocess.Popen([sys.executable, "-c", REPORTER_SCRIPT, scaler.address, TOKEN],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "reported"

        async def run() -> None:
            async with keda(scaler.address) as stub, reporter(scaler, "survivor") as api:
                api.begin(NS, "orphan")
                await until_metric(stub, "orphan", 3)
                call = stub.StreamIsActive(ref("orphan"))
                assert await next_state(call) is True
                child.kill()  # no goodbye: its snapshot stays until its ttl (1.5 s) runs out
                await until_metric(stub, "orphan", 1)
                assert (await stub.IsActive(ref("orphan"))).result
                api.end(NS, "orphan")
                # the survivor's last report (at 0) makes it idle: the stream pushes it
                assert await next_state(call) is False
                call.cancel()

        asyncio.run(run())
    finally:
        child.kill()
        child.wait()


def test_the_stream_pushes_idle_when_the_last_reporter_expires(start_scaler: Callable[..., Scaler]) -> None:
    scaler = start_scaler(SLESS_SCALER_KEEPALIVE_SEC="300")

    async def run() -> None:
        async with grpc.aio.insecure_channel(scaler.address) as channel, keda(scaler.address) as stub:
            reports = loadreports_pb2_grpc.LoadReportsStub(channel)
            call = stub.StreamIsActive(ref("brief"))
            assert await next_state(call) is False
            report = loadreports_pb2.LoadReport(reporter="once", ttl_ms=1000, functions=[
                loadreports_pb2.FunctionLoad(namespace=NS, function="brief", inflight=2)])
            ack = await reports.Report(report, metadata=(("authorization", f"Bearer {TOKEN}"),))
            assert ack.ttl_ms == 1000
            assert await next_state(call) is True
            assert await next_state(call) is False  # nobody renewed it: expired after 1 s, pushed by the sweep
            assert await metric(stub, "brief") == 0
            call.cancel()

    asyncio.run(run())


def test_reports_need_the_token(start_scaler: Callable[..., Scaler], caplog: pytest.LogCaptureFixture) -> None:
    scaler = start_scaler()
    report = loadreports_pb2.LoadReport(reporter="faker", functions=[
        loadreports_pb2.FunctionLoad(namespace=NS, function="victim", inflight=1000)])

    async def run() -> None:
        async with grpc.aio.insecure_channel(scaler.address) as channel, keda(scaler.address) as stub:
            reports = loadreports_pb2_grpc.LoadReportsStub(channel)
            for metadata in [(), (("authorization", "Bearer wrong-token-0123456789"),),
                             (("authorization", f"Basic {TOKEN}"),), (("authorization", f"Bearer {TOKEN}x"),)]:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await reports.Report(report, metadata=metadata)
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, metadata
                assert "token" in (refused.value.details() or "")
            assert await metric(stub, "victim") == 0

            # a LoadReporter with a wrong token: its calls go on, a warning is logged once, the next tick retries
            api = LoadReporter(scaler.address, "wrong-token-0123456789", "api-bad", interval=0.1)
            async with api, api.inflight(NS, "victim"):
                await until_async("two failed reports", lambda: api.failures >= 2, 10)
                assert api.reports_sent == 0
            assert await metric(stub, "victim") == 0

    with caplog.at_level(logging.WARNING, logger="sless.scaler.reporter"):
        asyncio.run(run())
    warnings = [r for r in caplog.records if r.name == "sless.scaler.reporter"]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]  # rate-limited
    assert "UNAUTHENTICATED" in warnings[0].getMessage()


def test_an_unreachable_scaler_never_fails_a_call(caplog: pytest.LogCaptureFixture) -> None:
    address = f"127.0.0.1:{free_port()}"  # nobody listens

    async def run() -> None:
        async with LoadReporter(address, TOKEN, "api-lonely", interval=0.05, timeout=0.5) as api:
            # the first waiter's immediate report fails in the background
            async with api.waiting(NS, "fn"), api.inflight(NS, "fn"):
                assert api.counts() == {(NS, "fn"): (1, 1)}
                await until_async("three failed reports", lambda: api.failures >= 3, 20)
            assert api.counts() == {}
            assert await api.report_now() is False

    with caplog.at_level(logging.WARNING, logger="sless.scaler.reporter"):
        asyncio.run(run())
    warnings = [r.getMessage() for r in caplog.records if r.name == "sless.scaler.reporter"]
    assert len(warnings) == 1 and address in warnings[0], warnings


@pytest.mark.parametrize(("metadata", "namespace", "complaint"), [
    ({}, NS, "`function`"),
    ({"function": "  "}, NS, "`function`"),
    ({"function": "f" * 300}, NS, "`function` is longer"),
    ({"function": "fn", "target": "many"}, NS, "`target`"),
    ({"function": "fn", "target": "0"}, NS, "`target`"),
    ({"function": "fn", "target": "-3"}, NS, "`target`"),
    ({"function": "fn", "target": "nan"}, NS, "`target`"),
    ({"function": "fn"}, "", "namespace"),
])
def test_bad_trigger_metadata_is_invalid_argument(start_scaler: Callable[..., Scaler], metadata: dict[str, str],
                                                  namespace: str, complaint: str) -> None:
    scaler = start_scaler()
    bad = externalscaler_pb2.ScaledObjectRef(name="so", namespace=namespace, scalerMetadata=metadata)

    async def run() -> None:
        async with keda(scaler.address) as stub:
            calls: list[Awaitable[object]] = [
                stub.IsActive(bad), stub.GetMetricSpec(bad),
                stub.GetMetrics(externalscaler_pb2.GetMetricsRequest(scaledObjectRef=bad, metricName="x"))]
            for call in calls:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert complaint in (refused.value.details() or ""), refused.value.details()
            stream = stub.StreamIsActive(bad)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await asyncio.wait_for(stream.read(), PUSH_TIMEOUT)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    asyncio.run(run())


def test_oversize_reports_are_refused(start_scaler: Callable[..., Scaler]) -> None:
    scaler = start_scaler(SLESS_SCALER_MAX_FUNCTIONS="10", SLESS_SCALER_MAX_REPORTERS="2")
    auth = (("authorization", f"Bearer {TOKEN}"),)

    def load(function: str, namespace: str = NS, inflight: int = 1) -> loadreports_pb2.FunctionLoad:
        return loadreports_pb2.FunctionLoad(namespace=namespace, function=function, inflight=inflight)

    async def run() -> None:
        async with grpc.aio.insecure_channel(scaler.address) as channel, keda(scaler.address) as stub:
            reports = loadreports_pb2_grpc.LoadReportsStub(channel)

            async def refused(report: loadreports_pb2.LoadReport) -> tuple[grpc.StatusCode, str]:
                with pytest.raises(grpc.aio.AioRpcError) as error:
                    await reports.Report(report, metadata=auth)
                return error.value.code(), error.value.details() or ""

            too_many = loadreports_pb2.LoadReport(reporter="big", functions=[load(f"f{i}") for i in range(11)])
            code, details = await refused(too_many)
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "11 functions" in details
            assert (await reports.Report(loadreports_pb2.LoadReport(
                reporter="big", functions=[load(f"f{i}") for i in range(10)]), metadata=auth)) is not None

            assert (await refused(loadreports_pb2.LoadReport(reporter="r" * 129)))[0] == \
                grpc.StatusCode.INVALID_ARGUMENT
            assert (await refused(loadreports_pb2.LoadReport(reporter="")))[0] == grpc.StatusCode.INVALID_ARGUMENT
            for bad in [load("f" * 254), load("fn", namespace="n" * 64), load(""), load("fn", namespace=""),
                        load("fn", inflight=1_000_001)]:
                code, details = await refused(loadreports_pb2.LoadReport(reporter="small", functions=[bad]))
                assert code == grpc.StatusCode.INVALID_ARGUMENT, details
            assert await metric(stub, "fn") == 0  # nothing of the refused reports was kept

            # past the bound of gRPC messages (4 MiB): refused before it is parsed
            huge = loadreports_pb2.LoadReport(reporter="huge", functions=[load("x" * 200) for _ in range(30_000)])
            assert (await refused(huge))[0] == grpc.StatusCode.RESOURCE_EXHAUSTED

            # two live reporters at most ("big" is one): a third is refused until one expires or leaves
            await reports.Report(loadreports_pb2.LoadReport(reporter="second", ttl_ms=60_000), metadata=auth)
            code, details = await refused(loadreports_pb2.LoadReport(reporter="third"))
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "reporters" in details
            assert await metric(stub, "f3") == 1

    asyncio.run(run())


def test_sigterm_ends_the_streams_and_exits_cleanly(start_scaler: Callable[..., Scaler]) -> None:
    scaler = start_scaler(SLESS_SCALER_KEEPALIVE_SEC="300")

    async def run() -> None:
        async with keda(scaler.address) as stub:
            call = stub.StreamIsActive(ref("fn"))
            assert await next_state(call) is False
            scaler.proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(call.read(), PUSH_TIMEOUT) is grpc.aio.EOF
            assert await call.code() == grpc.StatusCode.OK

    asyncio.run(run())
    assert scaler.proc.wait(15) == 0
    # the service's own lines (at DEBUG, gRPC's and asyncio's may come after them)
    messages = [line["msg"] for line in scaler.lines() if line["logger"] == "sless.scaler.service"]
    assert str(messages[-2]).startswith("stopping") and messages[-1] == "stopped", messages
    assert all(line["logger"] and line["level"] for line in scaler.lines())


@pytest.mark.parametrize(("env", "complaint"), [
    ({"SLESS_SCALER_TOKEN": ""}, "SLESS_SCALER_TOKEN is required"),
    ({"SLESS_SCALER_TOKEN": "short"}, "at least 16"),
    ({"SLESS_SCALER_TOKEN_FILE": "/nonexistent/token"}, "cannot read"),
    ({"SLESS_SCALER_LISTEN": "9090"}, "host:port"),
    ({"SLESS_SCALER_LISTEN": "127.0.0.1:70000"}, "host:port"),
    ({"SLESS_SCALER_REPORT_TTL_SEC": "soon"}, "SLESS_SCALER_REPORT_TTL_SEC"),
])
def test_a_bad_configuration_exits_2_naming_it(env: dict[str, str], complaint: str) -> None:
    full = {**os.environ, "SLESS_SCALER_TOKEN": TOKEN, "SLESS_SCALER_LISTEN": "127.0.0.1:0", **env}
    done = subprocess.run([str(SCALER)], env=full, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and complaint in done.stderr, done.stderr


def test_the_token_comes_from_a_file(start_scaler: Callable[..., Scaler], tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-a-file-0123456789\n")
    scaler = start_scaler(SLESS_SCALER_TOKEN_FILE=str(token_file))

    async def run() -> None:
        api = LoadReporter(scaler.address, "from-a-file-0123456789", "api-f", interval=0.1)
        async with keda(scaler.address) as stub, api, api.inflight(NS, "filed"):
            await until_metric(stub, "filed", 1)

    asyncio.run(run())


def test_a_taken_port_exits_1(start_scaler: Callable[..., Scaler]) -> None:
    scaler = start_scaler()
    full = {**os.environ, "SLESS_SCALER_TOKEN": TOKEN, "SLESS_SCALER_LISTEN": scaler.address,
            "SLESS_LOG_FORMAT": "json"}
    done = subprocess.run([str(SCALER)], env=full, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1 and "cannot listen" in done.stderr, done.stderr
    assert serving(scaler.address)  # the first one still serves


def test_the_number_of_streams_is_bounded(start_scaler: Callable[..., Scaler]) -> None:
    scaler = start_scaler(SLESS_SCALER_MAX_STREAMS="2")

    async def run() -> None:
        async with keda(scaler.address) as stub:
            first, second = stub.StreamIsActive(ref("a")), stub.StreamIsActive(ref("b"))
            assert await next_state(first) is False and await next_state(second) is False
            third = stub.StreamIsActive(ref("c"))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await asyncio.wait_for(third.read(), PUSH_TIMEOUT)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "streams" in (refused.value.details() or "")
            first.cancel()  # a stream that ends makes room (once the server has seen the cancel)
            opened: list[bool] = []

            async def open_one() -> bool:
                call = stub.StreamIsActive(ref("c"))
                try:
                    opened.append(await next_state(call))
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    return False
                return True

            deadline = asyncio.get_running_loop().time() + PUSH_TIMEOUT
            while not await open_one():
                assert asyncio.get_running_loop().time() < deadline, "the cancelled stream's room was not freed"
                await asyncio.sleep(0.05)
            assert opened == [False]

    asyncio.run(run())
