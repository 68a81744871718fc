"""Connection-count benchmark of the Python runtime: 32 against 1,000 keep-alive connections.

Run: ``.venv/bin/python -m bench.connections [--quick] [--rate N]`` (needs wrk:
``scripts/install-test-services.sh``, and Go to build the paced client). Everything listens on 127.0.0.1;
every load is bounded in time; a full run takes about two and a half minutes, ``--quick`` about one.

Two servers run the same trivial handler (``return "ok"``) side by side:
- ``sless``: ``runtimes/python3.11/server.py``: connections wait in one epoll, a bounded set of handler
  threads waits on it;
- ``thread per connection`` (the baseline): the runtime's previous server, kept as
  ``bench/peers/threaded_server.py`` and run from a temporary directory next to the current
  ``sless_runtime.py``, with one thread per connection.

Each is loaded with ``wrk -t1`` at 32 and at 1,000 connections, in two ways:
- paced: every connection sends a request every ``connections / rate`` seconds
  (``bench/peers/pace_client.go``, one goroutine per connection, ``GOMAXPROCS=1``), so both connection
  counts offer the same request rate (``--rate``, default 4,000/s) and the server is not saturated: p99
  then shows what holding many connections costs, and the target is p99 at 1,000 <= 2 x p99 at 32 for
  ``sless``. (wrk's Lua ``delay`` cannot pace a thousand connections: its timers are a linear list, and
  it adds milliseconds to every request even against a bare asyncio server.)
- saturated: each connection sends its next request as soon as the answer arrives (context: throughput;
  latency then grows with the connection count by Little's law, whatever the server).
Rounds are interleaved (every server and load once per round); each figure is the median over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import Load, Table, median, wrk
from bench.runtimes import PY_HANDLER, Running, Spec, start, write

REPO = Path(__file__).resolve().parent.parent
CONNECTIONS = (32, 1000)
SLESS = "sless"
THREADED = "thread per connection"
P99_RATIO_TARGET = 2.0


def log(message: str) -> None:
    print(f"[bench.connections] {message}", file=sys.stderr, flush=True)


def raise_open_files_limit(needed: int) -> None:
    """wrk (a child) needs a descriptor per connection; the servers raise their own limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < needed:
        raise SystemExit(f"need {needed} open files (ulimit -n); the hard limit is {hard}")


def specs(workdir: Path) -> list[Spec]:
    code = write(workdir / "code", "handler.py", PY_HANDLER)
    old = workdir / "threaded"
    old.mkdir()
    shutil.copy(REPO / "bench/peers/threaded_server.py", old / "server.py")
    shutil.copy(REPO / "runtimes/python3.11/sless_runtime.py", old / "sless_runtime.py")
    py = sys.executable
    env = {"SLESS_CODE_DIR": str(code)}
    return [
        Spec(SLESS, lambda p: [py, str(REPO / "runtimes/python3.11/server.py")], env, "/_/health"),
        Spec(THREADED, lambda p: [py, str(old / "server.py")], env, "/_/health"),
    ]


def build_pace_client(workdir: Path) -> Path:
    out = workdir / "pace_client"
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "", "GOWORK": "off", "CGO_ENABLED": "0"}
    log("building bench/peers/pace_client.go")
    subprocess.run(["go", "build", "-o", str(out), str(REPO / "bench/peers/pace_client.go")], env=env, check=True,
                   timeout=900, cwd=workdir)
    return out


def paced(client: Path, url: str, conns: int, rate: int, seconds: int) -> Load:
    """One paced run: ``conns`` connections offering ``rate`` requests/s together."""
    out = subprocess.run([str(client), url, str(conns), str(rate), str(seconds)], capture_output=True, text=True,
                         check=True, timeout=seconds + 120, env={**os.environ, "GOMAXPROCS": "1"}).stdout
    data = json.loads(out)
    return Load(data["rps"], data["p50_ms"], data["p99_ms"], data["errors"], data["requests"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one round of 3 s loads instead of three of 5 s")
    parser.add_argument("--rate", type=int, default=4000, help="offered requests/s of the paced loads (4000)")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: run scripts/install-test-services.sh")
    if shutil.which("go") is None:
        raise SystemExit("go is not installed (it builds the paced client)")
    raise_open_files_limit(max(CONNECTIONS) + 256)
    seconds, rounds = (3, 1) if args.quick else (5, 3)
    load_start = os.getloadavg()
    started = time.monotonic()
    modes = ("paced", "saturated")
    loads: dict[tuple[str, str, int], list[Load]] = {}
    with tempfile.TemporaryDirectory(prefix="sless-bench-connections-") as tmp:
        workdir = Path(tmp)
        client = build_pace_client(workdir)
        running: list[Running] = []
        try:
            for spec in specs(workdir):
                log(f"starting {spec.name}")
                running.append(start(spec, workdir))
            for server in running:
                wrk(server.url, 32, 1)  # warm-up
            for r in range(rounds):
                for mode in modes:
                    for conns in CONNECTIONS:
                        for server in running:
                            log(f"round {r + 1}/{rounds}: {server.spec.name}, {mode}, {conns} connections, {seconds} s")
                            load = (paced(client, server.url, conns, args.rate, seconds) if mode == "paced"
                                    else wrk(server.url, conns, seconds))
                            loads.setdefault((server.spec.name, mode, conns), []).append(load)
        finally:
            for server in running:
                server.stop()
    load_end = os.getloadavg()

    def fig(name: str, mode: str, conns: int, attr: str) -> float:
        return median([getattr(x, attr) for x in loads[(name, mode, conns)]])

    print("# sless Python runtime: 32 vs 1,000 keep-alive connections")
    print(f"\npaced client and wrk -t1 on 127.0.0.1, {rounds} interleaved round(s) of {seconds} s, medians; "
          f"paced loads offer about {args.rate:,} requests/s at either connection count; {os.cpu_count()} CPUs; "
          f"load average at start {load_start[0]:.2f}, at end {load_end[0]:.2f}; {time.monotonic() - started:.0f} s")
    print("\n| server | load | conns | req/s | p50 ms | p99 ms | errors |")
    print("|---|---|---|---|---|---|---|")
    for name in (SLESS, THREADED):
        for mode in modes:
            for conns in CONNECTIONS:
                errors = sum(x.errors for x in loads[(name, mode, conns)])
                print(f"| {name} | {mode} | {conns} | {fig(name, mode, conns, 'rps'):,.0f} | "
                      f"{fig(name, mode, conns, 'p50_ms'):.3f} | {fig(name, mode, conns, 'p99_ms'):.3f} | {errors} |")

    table = Table("sless vs thread per connection (ratio = value / baseline)")
    for name in (SLESS, THREADED):
        ratio = fig(name, "paced", 1000, "p99_ms") / fig(name, "paced", 32, "p99_ms")
        target = name == SLESS
        table.add(f"{name}: paced p99 at 1000 / p99 at 32", ratio, "x", None, "",
                  f"<= {P99_RATIO_TARGET:.1f}x" if target else "", ratio <= P99_RATIO_TARGET if target else None)
    for mode in modes:
        for conns in CONNECTIONS:
            table.add(f"{mode} p99 at {conns} conn", fig(SLESS, mode, conns, "p99_ms"), "ms",
                      fig(THREADED, mode, conns, "p99_ms"), THREADED)
        for conns in CONNECTIONS:
            table.add(f"{mode} req/s at {conns} conn", fig(SLESS, mode, conns, "rps"), "req/s",
                      fig(THREADED, mode, conns, "rps"), THREADED)
    errors = sum(x.errors for (name, _, _), v in loads.items() if name == SLESS for x in v)
    table.add("sless errors (all loads)", errors, "", target="0", ok=errors == 0)
    table.print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
