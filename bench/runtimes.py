"""Runtime benchmark: each sless runtime with a trivial handler against peers of the same language.

Run: ``.venv/bin/python -m bench.runtimes [--quick]`` (needs wrk: ``scripts/install-test-services.sh``;
Node 20 and Go for their runtimes; Flask/waitress/bjoern are installed on first use into a peer virtualenv
outside the repository, see ``bench/peers/venv.py``). Everything listens on 127.0.0.1; every load is one
wrk run bounded by ``-d``; a full run takes about three minutes, ``--quick`` about one.

For each runtime, the same run measures, with wrk (1 thread, keep-alive) at 1 and 32 connections,
requests/s and p50/p99 latency of:
- the sless runtime (``runtimes/<rt>/...``) with a handler returning ``"ok"``;
- the raw ceiling of its language answering a fixed ``ok``: Python: a bare asyncio Protocol server and a
  bare thread-per-connection socket server (the runtime's previous I/O model); Node: bare ``http.createServer``;
  Go: bare ``net/http``;
- Python only: Flask on bjoern (Fission's Python environment) and Flask on waitress (OpenFaaS's
  python3-flask template).
Rounds are interleaved (every server once per round, then the next round) so that the load of other
processes on a shared machine falls on all servers alike; each figure is the median over the rounds.

Targets: the Python runtime's requests/s at 32 connections >= 3 x Flask+bjoern's, its p99 at 32
connections <= Flask+bjoern's, its keep-alive p50 at 1 connection <= 0.1 ms; keep-alive p50 at 1
connection < 0.3 ms for all three runtimes.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from bench.common import Load, Table, median, wrk
from bench.peers import venv as peer_venv

REPO = Path(__file__).resolve().parent.parent
PEERS = REPO / "bench" / "peers"
RUNTIMES = ("python3.11", "nodejs20", "go1.23")
CONNECTIONS = (1, 32)
P50_TARGET_MS = 0.3
#: The Python runtime against Flask on bjoern (issue 26): throughput at 32 connections, and its own p50 at 1.
PY_RPS_FACTOR = 3.0
PY_P50_TARGET_MS = 0.1

PY_HANDLER = 'def handle(event):\n    return "ok"\n'
JS_HANDLER = "'use strict';\nexports.handle = (event) => 'ok';\n"
GO_HANDLER = """package function

import "context"

// Handle returns a short string.
func Handle(ctx context.Context, event map[string]any) (any, error) {
\treturn "ok", nil
}
"""

SLESS = "sless"
RAW_ASYNCIO = "raw asyncio"
RAW_THREADED = "raw threaded"
FLASK_BJOERN = "Flask+bjoern"
FLASK_WAITRESS = "Flask+waitress"
RAW_NODE = "raw http.createServer"
RAW_GO = "raw net/http"


def log(message: str) -> None:
    print(f"[bench.runtimes] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Spec:
    """How to start one server; ``port`` is filled in at start."""

    name: str
    argv: Callable[[int], list[str]]
    env: dict[str, str] = field(default_factory=dict)
    ready_path: str = "/"


@dataclass
class Running:
    spec: Spec
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path
    log_file: IO[bytes]

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(15)
        self.log_file.close()


def start(spec: Spec, workdir: Path) -> Running:
    """Start a server in its own process group and wait until it answers 200."""
    port = free_port()
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1", "PORT": str(port), "SLESS_HOST": "127.0.0.1", **spec.env}
    log_path = workdir / f"{spec.name.replace(' ', '_').replace('/', '_')}.log"
    log_file = open(log_path, "wb")  # noqa: SIM115 - closed by Running.stop
    proc = subprocess.Popen(spec.argv(port), env=env, stdout=log_file, stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=workdir)
    running = Running(spec, proc, f"http://127.0.0.1:{port}/", log_path, log_file)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log_file.close()
            raise RuntimeError(f"{spec.name} exited with {proc.returncode}: {log_path.read_text()[-2000:]}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", spec.ready_path)
            status = conn.getresponse().status
            conn.close()
            if status == 200:
                return running
        except OSError:
            pass
        time.sleep(0.05)
    running.stop()
    raise RuntimeError(f"{spec.name} did not answer within 60 s: {log_path.read_text()[-2000:]}")


@dataclass
class Summary:
    """Medians over the rounds of one server at one connection count."""

    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    requests: int

    @classmethod
    def of(cls, loads: list[Load]) -> Summary:
        return cls(median([x.rps for x in loads]), median([x.p50_ms for x in loads]),
                   median([x.p99_ms for x in loads]), sum(x.errors for x in loads), sum(x.requests for x in loads))


Results = dict[str, dict[int, Summary]]


def measure(specs: list[Spec], workdir: Path, seconds: int, rounds: int) -> Results:
    """Start all servers of one runtime, warm each up, then run interleaved rounds; stop them all."""
    running: list[Running] = []
    try:
        for spec in specs:
            log(f"starting {spec.name}")
            running.append(start(spec, workdir))
        for server in running:
            wrk(server.url, 32, 1)  # warm-up: imports, JIT, caches, thread start
        loads: dict[str, dict[int, list[Load]]] = {s.spec.name: {c: [] for c in CONNECTIONS} for s in running}
        for r in range(rounds):
            for conns in CONNECTIONS:
                for server in running:
                    log(f"round {r + 1}/{rounds}: {server.spec.name} at {conns} connection(s), {seconds:g} s")
                    loads[server.spec.name][conns].append(wrk(server.url, conns, seconds))
        return {name: {c: Summary.of(v) for c, v in per.items()} for name, per in loads.items()}
    finally:
        for server in running:
            server.stop()


# ---------------------------------------------------------------------------------------------- setup


def write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(text)
    return directory


def python_specs(workdir: Path, peers: peer_venv.PeerEnv | None) -> tuple[list[Spec], list[str]]:
    code = write(workdir / "py-code", "handler.py", PY_HANDLER)
    py = sys.executable
    specs = [
        Spec(SLESS, lambda p: [py, str(REPO / "runtimes/python3.11/server.py")], {"SLESS_CODE_DIR": str(code)},
             "/_/health"),
        Spec(RAW_ASYNCIO, lambda p: [py, str(PEERS / "raw_asyncio.py"), str(p)]),
        Spec(RAW_THREADED, lambda p: [py, str(PEERS / "raw_threaded.py"), str(p)]),
    ]
    notes: list[str] = []
    if peers is None:
        notes.append("Flask peers skipped (--no-peers)")
        return specs, notes
    flask = [str(peers.python), str(PEERS / "flask_app.py")]
    if peers.bjoern_error:
        notes.append(f"{FLASK_BJOERN} not measured: {peers.bjoern_error}")
    else:
        specs.append(Spec(FLASK_BJOERN, lambda p: [*flask, "bjoern", str(p)]))
    if peers.flask_error:
        notes.append(f"{FLASK_WAITRESS} not measured: {peers.flask_error}")
    else:
        specs.append(Spec(FLASK_WAITRESS, lambda p: [*flask, "waitress", str(p)]))
    return specs, notes


def node_specs(workdir: Path) -> list[Spec]:
    code = write(workdir / "js-code", "handler.js", JS_HANDLER)
    node = shutil.which("node") or "node"
    return [
        Spec(SLESS, lambda p: [node, str(REPO / "runtimes/nodejs20/server.js")], {"SLESS_CODE_DIR": str(code)},
             "/_/health"),
        Spec(RAW_NODE, lambda p: [node, str(PEERS / "raw_node.js"), str(p)]),
    ]


def go_specs(workdir: Path) -> list[Spec]:
    code = write(workdir / "go-code", "handler.go", GO_HANDLER)
    out = workdir / "go-out"
    env = {**os.environ, "GOTOOLCHAIN": "local"}
    log("building the go1.23 runtime with the trivial handler (runtimes/go1.23/build.sh)")
    subprocess.run(["bash", str(REPO / "runtimes/go1.23/build.sh"), str(code), str(out)], env=env, check=True,
                   timeout=900)
    log("building the raw net/http server")
    raw = workdir / "raw_go"
    build_env = {**env, "GOFLAGS": "", "GOWORK": "off", "CGO_ENABLED": "0"}
    subprocess.run(["go", "build", "-trimpath", "-ldflags=-s -w", "-o", str(raw), str(PEERS / "raw_go.go")],
                   env=build_env, check=True, timeout=900, cwd=workdir)
    return [
        Spec(SLESS, lambda p: [str(out / "server")], {}, "/_/health"),
        Spec(RAW_GO, lambda p: [str(raw), str(p)]),
    ]


# ---------------------------------------------------------------------------------------------- report


def overview(title: str, results: Results) -> None:
    """Every measured server at both connection counts, before the ratios."""
    header = ("server", *(f"{h} @{c}" for c in CONNECTIONS for h in ("req/s", "p50 ms", "p99 ms")), "errors")
    rows = [header]
    for name, per in results.items():
        cells = [name]
        for c in CONNECTIONS:
            s = per[c]
            cells += [f"{s.rps:,.0f}", f"{s.p50_ms:.3f}", f"{s.p99_ms:.3f}"]
        cells.append(str(sum(s.errors for s in per.values())))
        rows.append(tuple(cells))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    print(f"\n### {title}: measured servers\n")
    for i, row in enumerate(rows):
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
        if i == 0:
            print("| " + " | ".join("-" * w for w in widths) + " |")


@dataclass
class Verdict:
    target: str
    ok: bool | None  # None: not measured
    detail: str


def ratios(runtime: str, results: Results, ceilings: list[str], peers: list[str], notes: list[str],
           verdicts: list[Verdict]) -> Table:
    """The per-runtime table: sless against each baseline, with the targets' verdicts."""
    table = Table(f"{runtime}: sless runtime vs same-language peers (ratio = sless / baseline)")
    ours = results[SLESS]
    baselines = [b for b in [*ceilings, *peers] if b in results]
    python = runtime == "python3.11"
    for conns in CONNECTIONS:
        s = ours[conns]
        for b in baselines:
            is_target = python and conns == 32 and b == FLASK_BJOERN
            table.add(f"req/s at {conns} conn", s.rps, "req/s", results[b][conns].rps, b,
                      f">= {PY_RPS_FACTOR:.2f}x" if is_target else "",
                      s.rps >= PY_RPS_FACTOR * results[b][conns].rps if is_target else None)
        if python and conns == 32 and FLASK_BJOERN not in results:
            table.rows.append((f"req/s at {conns} conn", f"{s.rps:.3f} req/s", f"- ({FLASK_BJOERN}: see NOTE)", "-",
                               ">= Flask+bjoern", "not measured"))
        p50_target = PY_P50_TARGET_MS if python else P50_TARGET_MS
        for b in baselines:
            target = conns == 1 and b == baselines[0]
            table.add(f"p50 at {conns} conn", s.p50_ms, "ms", results[b][conns].p50_ms, b,
                      f"<= {p50_target} ms" if target else "", s.p50_ms <= p50_target if target else None)
        for b in baselines:
            is_target = python and conns == 32 and b == FLASK_BJOERN
            table.add(f"p99 at {conns} conn", s.p99_ms, "ms", results[b][conns].p99_ms, b,
                      "<= 1.00x" if is_target else "", s.p99_ms <= results[b][conns].p99_ms if is_target else None)
        if s.errors:
            table.add(f"errors at {conns} conn", s.errors, "", target="0", ok=False)
    p50 = ours[1].p50_ms
    verdicts.append(Verdict(f"{runtime}: keep-alive p50 at 1 connection < {P50_TARGET_MS} ms", p50 < P50_TARGET_MS,
                            f"{p50:.3f} ms"))
    if python:
        python_verdicts(ours, results, notes, verdicts)
    return table


def python_verdicts(ours: dict[int, Summary], results: Results, notes: list[str], verdicts: list[Verdict]) -> None:
    """The Python runtime's own targets: 3x Flask+bjoern's calls/s and no worse p99 at 32 connections,
    keep-alive p50 at 1 connection <= 0.1 ms."""
    p50 = ours[1].p50_ms
    verdicts.append(Verdict(f"python3.11: keep-alive p50 at 1 connection <= {PY_P50_TARGET_MS} ms",
                            p50 <= PY_P50_TARGET_MS, f"{p50:.3f} ms"))
    rps_target = f"python3.11: req/s at 32 connections >= {PY_RPS_FACTOR:g} x Flask+bjoern"
    p99_target = "python3.11: p99 at 32 connections <= Flask+bjoern's"
    if FLASK_BJOERN not in results:
        why = next((n for n in notes if n.startswith(FLASK_BJOERN)), "not measured")
        verdicts += [Verdict(rps_target, None, why), Verdict(p99_target, None, why)]
        return
    ref = results[FLASK_BJOERN][32]
    verdicts.append(Verdict(rps_target, ours[32].rps >= PY_RPS_FACTOR * ref.rps,
                            f"{ours[32].rps:,.0f} vs {ref.rps:,.0f} req/s ({ours[32].rps / ref.rps:.2f}x)"))
    verdicts.append(Verdict(p99_target, ours[32].p99_ms <= ref.p99_ms,
                            f"{ours[32].p99_ms:.2f} vs {ref.p99_ms:.2f} ms ({ours[32].p99_ms / ref.p99_ms:.2f}x)"))


def versions() -> str:
    def first_line(argv: list[str]) -> str:
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
            return (out.stdout or out.stderr).strip().splitlines()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            return "missing"

    return (f"python {sys.version.split()[0]}, node {first_line(['node', '--version'])}, "
            f"{first_line(['go', 'version'])}, {first_line(['wrk', '--version'])}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one round of 2 s loads instead of three of 3 s")
    parser.add_argument("--runtimes", default=",".join(RUNTIMES),
                        help="comma-separated subset of " + ", ".join(RUNTIMES))
    parser.add_argument("--no-peers", action="store_true", help="skip Flask+bjoern and Flask+waitress (no peer venv)")
    args = parser.parse_args()
    chosen = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    unknown = set(chosen) - set(RUNTIMES)
    if unknown:
        parser.error(f"unknown runtime(s): {', '.join(sorted(unknown))}")
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: run scripts/install-test-services.sh")
    seconds, rounds = (2, 1) if args.quick else (3, 3)  # whole seconds: wrk -d takes no fraction

    load_start = os.getloadavg()
    started = time.monotonic()
    verdicts: list[Verdict] = []
    tables: list[tuple[str, Results, Table, list[str]]] = []
    with tempfile.TemporaryDirectory(prefix="sless-bench-runtimes-") as tmp:
        workdir = Path(tmp)
        peers = None if args.no_peers or "python3.11" not in chosen else peer_venv.ensure(log)
        plans: list[tuple[str, list[Spec], list[str], list[str], list[str]]] = []
        if "python3.11" in chosen:
            specs, notes = python_specs(workdir, peers)
            plans.append(("python3.11", specs, [RAW_ASYNCIO, RAW_THREADED], [FLASK_BJOERN, FLASK_WAITRESS], notes))
        if "nodejs20" in chosen:
            plans.append(("nodejs20", node_specs(workdir), [RAW_NODE], [], []))
        if "go1.23" in chosen:
            plans.append(("go1.23", go_specs(workdir), [RAW_GO], [], []))
        for runtime, specs, ceilings, others, notes in plans:
            log(f"== {runtime}")
            results = measure(specs, workdir, seconds, rounds)
            tables.append((runtime, results, ratios(runtime, results, ceilings, others, notes, verdicts), notes))
    load_end = os.getloadavg()

    print("# sless runtime benchmark")
    print(f"\nwrk -t1 keep-alive on 127.0.0.1, {rounds} interleaved round(s) of {seconds:g} s per server and "
          f"connection count, medians; {os.cpu_count()} CPUs; load average at start "
          f"{load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}, at end "
          f"{load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}; {time.monotonic() - started:.0f} s")
    print(versions())
    for runtime, results, table, notes in tables:
        overview(runtime, results)
        table.print()
        for note in notes:
            print(f"\nNOTE: {note}")
    print("\n## Targets\n")
    for v in verdicts:
        state = "not measured" if v.ok is None else ("meets" if v.ok else "MISSES")
        print(f"- {v.target}: {state} ({v.detail})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
