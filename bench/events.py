"""Event trigger benchmark: events per second end to end, and publish -> handler-start latency.

Run: ``.venv/bin/python -m bench.events [--quick]`` (needs RabbitMQ from
``scripts/install-test-services.sh``; a private broker and a private `sless up` are started on
127.0.0.1 and stopped at the end). Bounded: at most ``--count`` messages per phase (2,000 by default,
500 with ``--quick``) and a paced phase of ``--rate`` msg/s (1,000 by default) for ``--seconds`` s.

Measured, each against a baseline from the same run on the same broker:
- throughput: a backlog of N messages drained by an event trigger calling a trivial Python function
  (broker -> dispatcher -> dedup store -> invoke path -> runtime -> ack), vs a bare aio-pika consumer
  with the same prefetch that only acks (the broker's own ceiling here);
- latency: messages published at a steady rate, timed from publish to the first line of the handler
  (the publish time travels in the body; one clock), vs publish -> bare consumer callback;
- at each ``--prefetch`` (SLESS_EVENT_PREFETCH: 32, the default, and 8 unless given; ``--quick``: the first only).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import aio_pika

from bench.common import Table, percentile
from tests.support.platform import SlessProcess, Tenant, start_sless
from tests.support.rabbitmq import RabbitBroker, queue_counts, rabbitmq_server

#: The handler's first statement takes the time; the line is written after, outside the measurement.
STAMPER = """
import json, os, time

OUT = os.path.join(os.environ["OUT_DIR"], "starts.txt")

def handle(event):
    started = time.time()
    with open(OUT, "a") as f:
        f.write(json.dumps([event["id"], event["data"]["t"], started]) + "\\n")
    return "ok"
"""


async def publish(url: str, queue: str, count: int, rate: float | None, tag: str) -> None:
    """``count`` messages carrying their publish time; as fast as confirms allow, or paced at ``rate``/s."""
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        start = time.monotonic()
        pending = []
        for i in range(count):
            if rate:
                delay = start + i / rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            body = json.dumps({"t": time.time(), "i": i}).encode()
            message = aio_pika.Message(body, message_id=f"{tag}-{i}", content_type="application/json",
                                       delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
            pending.append(asyncio.ensure_future(channel.default_exchange.publish(message, routing_key=queue)))
            if len(pending) >= 200 or rate:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await connection.close()


async def bare_consumer(url: str, queue: str, count: int, prefetch: int, rate: float | None,
                        tag: str) -> list[tuple[float, float]]:
    """(publish time, receive time) per message for a consumer that only acks: the broker baseline."""
    got: list[tuple[float, float]] = []
    done = asyncio.Event()
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=prefetch)
        q = await channel.declare_queue(queue, durable=True)

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            received = time.time()
            got.append((json.loads(message.body)["t"], received))
            await message.ack()
            if len(got) >= count:
                done.set()

        if rate is None:  # a backlog first, then drain it
            await publish(url, queue, count, None, tag)
            await q.consume(on_message)
        else:
            await q.consume(on_message)
            await publish(url, queue, count, rate, tag)
        await asyncio.wait_for(done.wait(), timeout=300)
    finally:
        await connection.close()
    return got


def read_starts(out: Path, tag: str) -> list[tuple[float, float]]:
    path = out / "starts.txt"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [(t, started) for mid, t, started in rows if mid.startswith(tag + "-")]


def wait_starts(out: Path, tag: str, count: int, limit: float = 300) -> list[tuple[float, float]]:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        rows = read_starts(out, tag)
        if len(rows) >= count:
            return rows
        time.sleep(0.05)
    raise SystemExit(f"only {len(read_starts(out, tag))} of {count} events reached the handler in {limit}s")


def rate_of(rows: list[tuple[float, float]]) -> float:
    starts = sorted(r for _, r in rows)
    span = starts[-1] - starts[0]
    return (len(starts) - 1) / span if span > 0 else float("nan")


def latencies_ms(rows: list[tuple[float, float]]) -> list[float]:
    return [(received - sent) * 1000 for sent, received in rows]


def measure(table: Table, broker: RabbitBroker, workdir: Path, prefetch: int, count: int, rate: float,
            seconds: float) -> None:
    out = workdir / f"out-p{prefetch}"
    out.mkdir(parents=True)
    sp: SlessProcess = start_sless(workdir / f"data-p{prefetch}", {
        "SLESS_RABBITMQ_URL": broker.url, "SLESS_EVENT_PREFETCH": str(prefetch),
        # The stamper writes its timestamps to a folder of the host, which a sandboxed function cannot see.
        "SLESS_SANDBOX": "off"})
    try:
        tenant = Tenant(sp.url, f"bench-events-{prefetch}")
        tenant.deploy("stamper", "python3.11", {"handler.py": STAMPER}, http=False, env_vars={"OUT_DIR": str(out)})
        tenant.api("POST", "/triggers", json={"name": "on-bench", "type": "event", "function": "stamper",
                                              "queue": "bench", "enabled": False}, expect=201)
        queue = f"{tenant.ns}.bench"
        # Warm up: the runtime process starts on the first call.
        tenant.api("PATCH", "/triggers/on-bench", json={"enabled": True}, expect=200)
        deadline = time.monotonic() + 60
        while queue_counts(broker, queue)[1] != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        asyncio.run(publish(broker.url, queue, 20, None, "warm"))
        wait_starts(out, "warm", 20)

        # Throughput: a backlog drained with the trigger enabled.
        tenant.api("PATCH", "/triggers/on-bench", json={"enabled": False}, expect=200)
        while queue_counts(broker, queue)[1] != 0:
            time.sleep(0.05)
        asyncio.run(publish(broker.url, queue, count, None, "backlog"))
        tenant.api("PATCH", "/triggers/on-bench", json={"enabled": True}, expect=200)
        backlog = wait_starts(out, "backlog", count)
        base_q = f"bench-bare-{prefetch}-{os.getpid()}"
        bare = asyncio.run(bare_consumer(broker.url, base_q, count, prefetch, None, "bare"))
        table.add(f"events/s, backlog of {count}, prefetch {prefetch}", rate_of(backlog), "ev/s",
                  rate_of(bare), "bare aio-pika consumer, acks only")

        # Latency: a steady rate well under the throughput, so it is not queueing that is measured.
        paced_count = int(rate * seconds)
        asyncio.run(publish(broker.url, queue, paced_count, rate, "paced"))
        paced = latencies_ms(wait_starts(out, "paced", paced_count))
        bare_paced = latencies_ms(asyncio.run(bare_consumer(broker.url, base_q + "-paced", paced_count, prefetch,
                                                            rate, "barepaced")))
        for pct in (50, 99):
            table.add(f"publish -> handler start p{pct} at {rate:g}/s, prefetch {prefetch}",
                      percentile(paced, pct), "ms", percentile(bare_paced, pct), "publish -> bare consumer")
        stats = tenant.api("GET", "/triggers/on-bench", expect=200).json()["message"]
        print(f"prefetch {prefetch}: {stats}")
    finally:
        sp.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="500 messages, the first prefetch only")
    parser.add_argument("--prefetch", default="", help="comma list of SLESS_EVENT_PREFETCH values (default 32,8)")
    parser.add_argument("--count", type=int, default=None, help="backlog size (max 20000)")
    parser.add_argument("--rate", type=float, default=1000.0, help="paced publish rate, msg/s (max 2000)")
    parser.add_argument("--seconds", type=float, default=None, help="paced phase length (max 30)")
    args = parser.parse_args()
    count = min(args.count or (500 if args.quick else 2000), 20000)
    rate = min(args.rate, 2000.0)
    seconds = min(args.seconds or (3.0 if args.quick else 6.0), 30.0)
    table = Table("Event triggers (RabbitMQ -> dispatcher -> python3.11 runtime)")
    with tempfile.TemporaryDirectory(prefix="sless-bench-events-") as tmp, rabbitmq_server() as broker:
        prefetches = [max(1, min(int(p), 1000)) for p in args.prefetch.split(",") if p.strip()] or [32, 8]
        for prefetch in (prefetches[:1] if args.quick else prefetches):
            measure(table, broker, Path(tmp), prefetch, count, rate, seconds)
    table.print()


if __name__ == "__main__":
    main()
