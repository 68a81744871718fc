"""Platform benchmark: the invoke proxy, redeploys, cold starts, long calls, and the invocation log.

Run: ``.venv/bin/python -m bench.standalone [--quick]`` (needs wrk and the PostgreSQL server binaries:
``scripts/install-test-services.sh``). Everything runs on 127.0.0.1, bounded in time and count.

Measured, each against a baseline from the same run:
- proxy overhead: wrk through ``/fn/...`` vs the same runtime called directly, at 1 and 32 connections;
- code-only redeploy: upload of new code until the new code answers, vs a plain API round trip;
- cold start after scale to zero: first call after the idle stop vs a warm call;
- 1,000 concurrent calls of a function sleeping 5 s through ``sless-api`` (gunicorn + uvicorn worker,
  one worker), and the same through ``sless up``'s ``/fn`` (the function's process sandboxed as a tenant's
  is, with the platform's default limits unless ``--sandbox-nproc``): errors and wall time vs the ideal 5 s;
- invocation records per second into PostgreSQL through the batched log vs a bare COPY of the same rows;
- proxy latency while PostgreSQL is frozen (SIGSTOP) vs while it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import psycopg2
import requests

from bench.common import Table, median, percentile, wrk
from sless_api.stores.invocations import Invocation, InvocationLog, PostgresSink
from tests.support.platform import REPO, SECRET, SlessProcess, Tenant, start_sless
from tests.support.services import free_port, postgres_server

TRIVIAL = "def handle(event):\n    return 'ok'\n"
SLEEPER = "import time\n\ndef handle(event):\n    time.sleep(5)\n    return 'slept'\n"


def start_runtime_directly(code: str, workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    code_dir = workdir / "direct-code"
    code_dir.mkdir(parents=True, exist_ok=True)
    (code_dir / "handler.py").write_text(code)
    port = free_port()
    env = {"PATH": os.environ["PATH"], "PORT": str(port), "SLESS_HOST": "127.0.0.1", "SLESS_CODE_DIR": str(code_dir),
           "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.Popen([sys.executable, str(REPO / "runtimes/python3.11/server.py")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            if requests.get(url + "/_/health", timeout=1).ok:
                return proc, url
        except requests.RequestException:
            time.sleep(0.05)
    raise SystemExit("the python runtime did not start")


def bench_proxy(table: Table, tenant: Tenant, workdir: Path, seconds: float) -> None:
    proc, direct = start_runtime_directly(TRIVIAL, workdir)
    try:
        proxied = tenant.fn_url("trivial")
        for conns in (1, 32):
            base = wrk(direct + "/", conns, seconds)
            via = wrk(proxied, conns, seconds)
            table.add(f"p50 at {conns} conn via /fn", via.p50_ms, "ms", base.p50_ms, "runtime direct")
            table.add(f"p99 at {conns} conn via /fn", via.p99_ms, "ms", base.p99_ms, "runtime direct")
            table.add(f"req/s at {conns} conn via /fn", via.rps, "req/s", base.rps, "runtime direct")
            if conns == 1:  # at 32 connections p50 is queueing (Little's law): the target there is throughput
                table.add("added p50 at 1 conn", via.p50_ms - base.p50_ms, "ms",
                          target="<=0.5 ms", ok=(via.p50_ms - base.p50_ms) <= 0.5)
            else:
                table.add(f"req/s at {conns} conn via /fn (target)", via.rps, "req/s",
                          target=">=5000 req/s", ok=via.rps >= 5000)
            if via.errors or base.errors:
                table.add(f"errors at {conns} conn (proxy/direct)", via.errors, "", base.errors, "direct")
    finally:
        proc.terminate()
        proc.wait(10)


def bench_redeploy(table: Table, tenant: Tenant, rounds: int) -> None:
    times, api_rtts = [], []
    for i in range(2, rounds + 2):
        code = f"def handle(event):\n    return 'v{i}'\n"
        started = time.monotonic()
        tenant.upload("trivial", {"handler.py": code})
        while requests.get(tenant.fn_url("trivial"), timeout=10).text != f"v{i}":
            time.sleep(0.005)
        times.append(time.monotonic() - started)
        t0 = time.monotonic()
        tenant.api("GET", "/functions/trivial", expect=200)
        api_rtts.append(time.monotonic() - t0)
    table.add("code-only redeploy -> new code served (median)", median(times) * 1000, "ms",
              median(api_rtts) * 1000, "API round trip", "<1000 ms", median(times) < 1.0)


def bench_cold_start(table: Table, tenant: Tenant, idle_sec: float, rounds: int) -> None:
    url = tenant.fn_url("trivial")
    cold, warm = [], []
    for _ in range(rounds):
        requests.get(url, timeout=10)
        t0 = time.monotonic()
        requests.get(url, timeout=10)
        warm.append(time.monotonic() - t0)
        time.sleep(idle_sec + 1.5)  # the reaper stops the process
        t0 = time.monotonic()
        resp = requests.get(url, timeout=30)
        cold.append(time.monotonic() - t0)
        assert resp.status_code == 200, resp.text
    table.add("cold start after scale to zero (median, python)", median(cold) * 1000, "ms",
              median(warm) * 1000, "warm call", "<150 ms", median(cold) < 0.150)


async def _many_calls(url: str, count: int) -> tuple[int, int, float, list[float]]:
    connector = aiohttp.TCPConnector(limit=0)
    latencies: list[float] = []
    ok = errors = 0
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        async def one() -> None:
            nonlocal ok, errors
            t0 = time.monotonic()
            try:
                async with session.get(url) as resp:
                    await resp.read()
                    ok, errors = (ok + 1, errors) if resp.status == 200 else (ok, errors + 1)
            except (aiohttp.ClientError, TimeoutError):
                errors += 1
            latencies.append(time.monotonic() - t0)

        started = time.monotonic()
        await asyncio.gather(*(one() for _ in range(count)))
        return ok, errors, time.monotonic() - started, latencies


def bench_long_calls(table: Table, workdir: Path, count: int) -> None:
    data = workdir / "gunicorn-data"
    data.mkdir()
    port = free_port()
    env = {**os.environ, "SLESS_JWT_SECRET": SECRET, "SLESS_DATA_DIR": str(data), "SLESS_BACKEND": "standalone",
           "SLESS_WORKERS": "1", "SLESS_BIND": f"127.0.0.1:{port}"}
    log = open(data / "sless-api.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([str(Path(sys.executable).parent / "sless-api")], env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                if requests.get(url + "/health", timeout=1).ok:
                    break
            except requests.RequestException:
                time.sleep(0.1)
        tenant = Tenant(url, "bench-long")
        tenant.deploy("sleeper", "python3.11", {"handler.py": SLEEPER}, timeout_sec=30)
        requests.get(tenant.fn_url("sleeper"), timeout=30)  # start the process
        succeeded, errors, wall, lat = asyncio.run(_many_calls(tenant.fn_url("sleeper"), count))
        table.add(f"{count} concurrent 5 s calls via sless-api: answered 200", succeeded, "", float(count),
                  "calls made")
        table.add(f"{count} concurrent 5 s calls via sless-api: errors", errors, "", target="0", ok=errors == 0)
        table.add(f"{count} concurrent 5 s calls: wall time", wall, "s", 5.0, "ideal")
        table.add(f"{count} concurrent 5 s calls: p99 latency", percentile(lat, 99), "s", 5.0, "ideal")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
        log.close()


def bench_long_calls_up(table: Table, workdir: Path, count: int, nproc: int | None) -> None:
    """The same concurrent long calls through ``sless up`` (``/fn``, the invoke proxy, the sandboxed runtime)."""
    extra = {"SLESS_SANDBOX_NPROC": str(nproc)} if nproc else {}
    sp = start_sless(workdir / "long-up-data", extra)
    try:
        tenant = Tenant(sp.url, "bench-long-up")
        tenant.deploy("sleeper", "python3.11", {"handler.py": SLEEPER}, timeout_sec=30)
        requests.get(tenant.fn_url("sleeper"), timeout=30)  # start the process
        succeeded, errors, wall, lat = asyncio.run(_many_calls(tenant.fn_url("sleeper"), count))
    finally:
        sp.stop()
    how = f"sless up, SLESS_SANDBOX_NPROC={nproc}" if nproc else "sless up"
    table.add(f"{count} concurrent 5 s calls via {how} /fn: answered 200", succeeded, "", float(count),
              "calls made")
    table.add(f"{count} concurrent 5 s calls via {how} /fn: errors", errors, "", target="0", ok=errors == 0)
    table.add(f"{count} concurrent 5 s calls via {how} /fn: wall time", wall, "s", 5.0, "ideal", "<= 6 s",
              wall <= 6.0)
    table.add(f"{count} concurrent 5 s calls via {how} /fn: p99 latency", percentile(lat, 99), "s", 5.0, "ideal")


def _rows(n: int) -> list[Invocation]:
    now = time.time()
    return [Invocation("sless-bench", "fn", "GET", "/", 200, 1.5, 10, 20, "http", None, now) for _ in range(n)]


def bench_records(table: Table, pg_url: str, count: int) -> None:
    rows = _rows(count)
    log = InvocationLog(PostgresSink(pg_url), max_queue=count + 1)
    log.record(rows[0])
    log.flush(30)
    started = time.monotonic()
    for inv in rows:
        log.record(inv)
    log.flush(120)
    elapsed = time.monotonic() - started
    stats = log.stats()
    log.close(10)
    # the ceiling: one COPY of the same rows, built in memory, no queue
    buf = io.StringIO("".join("sless-bench\tfn\tGET\t/\t200\t1.5\t10\t20\thttp\t\\N\t2026-01-01 00:00:00+00\n"
                              for _ in range(count)))
    conn = psycopg2.connect(pg_url)
    with conn, conn.cursor() as cur:
        t0 = time.monotonic()
        cur.copy_expert("COPY invocations (namespace, function, method, path, status, duration_ms, request_bytes, "
                        "response_bytes, trigger, error, started_at) FROM STDIN", buf)
        copy_elapsed = time.monotonic() - t0
    conn.close()
    table.add("invocation records/s into PostgreSQL", count / elapsed, "rec/s", count / copy_elapsed,
              "bare COPY", ">=10,000/s", count / elapsed >= 10_000)
    table.add("records dropped in that burst", stats["dropped"], "", target="0", ok=stats["dropped"] == 0)


def bench_pg_frozen(table: Table, workdir: Path, pg: object, seconds: float) -> None:
    sp = start_sless(workdir / "pg-data", {"SLESS_DATABASE_URL": pg.url})  # type: ignore[attr-defined]
    try:
        tenant = Tenant(sp.url, "bench-pg")
        tenant.deploy("trivial", "python3.11", {"handler.py": TRIVIAL})
        requests.get(tenant.fn_url("trivial"), timeout=10)
        running = wrk(tenant.fn_url("trivial"), 1, seconds)
        pg.sigstop()  # type: ignore[attr-defined]
        try:
            frozen = wrk(tenant.fn_url("trivial"), 1, seconds)
        finally:
            pg.sigcont()  # type: ignore[attr-defined]
        table.add("proxy p50 while PostgreSQL is SIGSTOPped", frozen.p50_ms, "ms", running.p50_ms,
                  "PostgreSQL running", "unchanged", frozen.p50_ms < running.p50_ms * 1.5 + 0.2)
        table.add("failed calls while PostgreSQL is SIGSTOPped", frozen.errors, "", target="0",
                  ok=frozen.errors == 0)
    finally:
        sp.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="shorter loads (2 s) and fewer rounds")
    parser.add_argument("--concurrent", type=int, default=1000, help="concurrent 5 s calls (default 1000)")
    parser.add_argument("--proxy-only", action="store_true", help="only the /fn rows (proxy vs runtime direct)")
    parser.add_argument("--long-only", action="store_true", help="only the concurrent long calls")
    parser.add_argument("--sandbox-nproc", type=int, default=None,
                        help="SLESS_SANDBOX_NPROC of the sless up running the long calls (default: the platform's)")
    args = parser.parse_args()
    seconds, rounds = (2, 3) if args.quick else (5, 5)
    table = Table("sless platform (standalone), loopback, " + time.strftime("%Y-%m-%d %H:%M"))
    with tempfile.TemporaryDirectory(prefix="sless-bench-") as tmp:
        workdir = Path(tmp)
        if args.long_only:
            bench_long_calls_up(table, workdir, args.concurrent, args.sandbox_nproc)
            bench_long_calls(table, workdir, args.concurrent)
            table.print()
            return 0
        idle = 2.0
        sp: SlessProcess = start_sless(workdir / "data", {"SLESS_IDLE_TIMEOUT_SEC": str(idle)})
        try:
            tenant = Tenant(sp.url, "bench")
            tenant.deploy("trivial", "python3.11", {"handler.py": TRIVIAL})
            requests.get(tenant.fn_url("trivial"), timeout=10)
            print("proxy overhead...", file=sys.stderr)
            bench_proxy(table, tenant, workdir, seconds)
            if args.proxy_only:
                table.print()
                return 0
            print("redeploys...", file=sys.stderr)
            bench_redeploy(table, tenant, rounds)
            print("cold starts...", file=sys.stderr)
            bench_cold_start(table, tenant, idle, rounds)
        finally:
            sp.stop()
        print(f"{args.concurrent} concurrent long calls...", file=sys.stderr)
        bench_long_calls_up(table, workdir, args.concurrent, args.sandbox_nproc)
        bench_long_calls(table, workdir, args.concurrent)
        print("invocation log into PostgreSQL...", file=sys.stderr)
        with postgres_server() as pg:
            bench_records(table, pg.url, 50_000 if args.quick else 200_000)
            bench_pg_frozen(table, workdir, pg, seconds)
    table.print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
