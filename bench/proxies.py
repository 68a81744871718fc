"""``/fn`` against compiled reverse proxies, in front of the same Python runtime, on the same core.

Run: ``.venv/bin/python -m bench.proxies [--quick]`` (needs wrk, Go, taskset, ss; nginx from Debian's ``nginx``
package, else its rows read "not measured"). Everything listens on 127.0.0.1; every load is one bounded wrk run.

One ``sless up`` serves a function whose handler returns ``{'ok': True}``. Its function process (the Python
runtime, ``runtimes/python3.11/server.py``) is the one upstream of every path measured:

- ``runtime direct``: wrk to the function process's own port (the ceiling: no proxy);
- ``nginx``: one worker, keep-alive to the upstream (``keepalive`` in its ``upstream`` block), access log off;
- ``Go ReverseProxy``: ``bench/peers/go_proxy.go``, Go's ``httputil.ReverseProxy`` (the core of Fission's router
  and OpenFaaS's gateway) with a keep-alive ``Transport`` (``MaxIdleConnsPerHost``), built with this machine's Go;
- ``/fn``: the same function through ``sless up``'s invoke proxy (with its request id, access line, metrics and
  invocation record).

Why one upstream process: a proxy's figures then differ only by the proxy. The function's sandbox runs on the host's
network (``SLESS_SANDBOX_NETWORK=host``) so that its port is on the host's loopback, where the peers reach it;
``bench.sandbox`` measures what a network namespace of its own adds. Why pinned: the proxy and the runtime share
CPU 0 (every process of ``sless up``, nginx and the Go proxy), wrk runs alone on CPU 1, so a proxy's cost shows
as calls/s taken from the runtime, as it does on a machine whose cores are all busy.

Rounds are interleaved (every path at 1 and 32 connections once per round, the order turning every round); every
figure is the median over the rounds. The proxy's own CPU per call (its processes' user and system time over the
calls of each run, the runtime's not counted) is context.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import requests

from bench.common import Load, Table, median, wrk
from bench.compare_builds import process_cpu_sec
from tests.support.platform import REPO, SlessProcess, Tenant, start_sless
from tests.support.services import free_port

HANDLER = "def handle(event):\n    return {'ok': True}\n"
PROXY_CPU, WRK_CPU = 0, 1
DIRECT, NGINX, GO, FN = "runtime direct", "nginx", "Go ReverseProxy", "/fn"
CONNECTIONS = (1, 32)


def log(message: str) -> None:
    print(f"[bench.proxies] {message}", file=sys.stderr, flush=True)


@dataclass
class Way:
    """One way to the runtime: its URL, the processes whose CPU is the proxy's, and its loads by connections."""

    name: str
    url: str
    cpu_pids: Callable[[], list[int]]
    loads: dict[int, list[Load]] = field(default_factory=dict)
    cpu_us: dict[int, list[float]] = field(default_factory=dict)

    def fig(self, conns: int, attr: str) -> float:
        return median([getattr(x, attr) for x in self.loads[conns]])


# Processes and pinning


def children(pid: int) -> list[int]:
    """PID's direct children (from /proc; a process gone meanwhile is skipped)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(stat[1]) == pid:
            found.append(int(entry.name))
    return found


def tree(pid: int) -> list[int]:
    """PID and all its descendants."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(children(current))
    return out


def pin(pid: int, cpu: int) -> None:
    """Every thread of PID and of its descendants to CPU (threads made later inherit their maker's affinity)."""
    for proc in tree(pid):
        try:
            tasks = [int(t.name) for t in Path(f"/proc/{proc}/task").iterdir()]
        except OSError:
            continue
        for tid in tasks:
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                os.sched_setaffinity(tid, {cpu})


def policy(pid: int) -> str:
    """The scheduling policy PID ran under, by name (read before it ended: its /proc entry is gone after)."""
    return _POLICIES.get(_policy_seen.get(pid, -1), "unknown")


_POLICIES = {os.SCHED_OTHER: "SCHED_OTHER", os.SCHED_BATCH: "SCHED_BATCH", os.SCHED_IDLE: "SCHED_IDLE"}
_policy_seen: dict[int, int] = {}


def note_policy(pid: int) -> None:
    with contextlib.suppress(OSError):
        _policy_seen[pid] = os.sched_getscheduler(pid)


def cpu_sec(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):  # a process that ended meanwhile
            total += process_cpu_sec(pid)
    return total


def listening_ports(pids: set[int]) -> list[int]:
    """The TCP ports on 127.0.0.1 that one of PIDS listens on (``ss -ltnp``)."""
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
    ports = []
    for line in out.splitlines():
        match = re.search(r"127\.0\.0\.1:(\d+)\s", line)
        owners = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if match and owners & pids:
            ports.append(int(match.group(1)))
    return ports


def function_process_url(sless: SlessProcess) -> str:
    """The function process's own address: the port of a descendant of ``sless up`` answering the handler's JSON."""
    descendants = set(tree(sless.proc.pid)) - {sless.proc.pid}
    for port in listening_ports(descendants):
        url = f"http://127.0.0.1:{port}/"
        try:
            resp = requests.get(url, timeout=2)
        except requests.RequestException:
            continue
        if resp.status_code == 200 and resp.json() == {"ok": True}:
            return url
    raise SystemExit("could not find the function process's port (is SLESS_SANDBOX_NETWORK=host honoured?)")


# The peers


class Server:
    """A peer proxy started pinned to the proxy's CPU, stopped at the end."""

    #: Prefix of every peer's command line: ``chrt -b 0`` with ``--peers-batch`` (the scheduling policy sless up
    #: runs under), else nothing (the normal policy, as peers run by default).
    policy: list[str] = []

    def __init__(self, name: str, argv: list[str], log_path: Path, url: str) -> None:
        self.name, self.url, self.log_path = name, url, log_path
        with log_path.open("wb") as out:
            self.proc = subprocess.Popen([*self.policy, "taskset", "-c", str(PROXY_CPU), *argv], stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.wait_ready()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log_path.read_text(errors='replace')[-2000:]}")
            try:
                if requests.get(self.url, timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not answer 200 in 30 s")

    def pids(self) -> list[int]:
        return tree(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(15)


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)


NGINX_CONF = """worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    keepalive_requests 1000000;
    upstream runtime {{
        server 127.0.0.1:{upstream_port};
        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://runtime;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"""


def start_nginx(workdir: Path, upstream: str) -> Server | str:
    """nginx with one worker in front of UPSTREAM, or why it is not measured."""
    binary = nginx_binary()
    if binary is None:
        return "nginx is not installed (apt-get install nginx)"
    home = workdir / "nginx"
    home.mkdir()
    port = free_port()
    upstream_port = int(upstream.rstrip("/").rsplit(":", 1)[1])
    (home / "nginx.conf").write_text(NGINX_CONF.format(dir=home, port=port, upstream_port=upstream_port))
    argv = [binary, "-p", str(home), "-e", str(home / "error.log"), "-c", str(home / "nginx.conf"),
            "-g", "daemon off;"]
    try:
        return Server(NGINX, argv, workdir / "nginx.log", f"http://127.0.0.1:{port}/")
    except RuntimeError as exc:
        return f"nginx did not start: {exc}"


def start_go_proxy(workdir: Path, upstream: str) -> Server | str:
    """bench/peers/go_proxy.go built into WORKDIR and started in front of UPSTREAM, or why it is not measured."""
    if shutil.which("go") is None:
        return "go is not installed"
    binary = workdir / "go_proxy"
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "", "GOWORK": "off", "CGO_ENABLED": "0"}
    log("building bench/peers/go_proxy.go")
    built = subprocess.run(["go", "build", "-o", str(binary), str(REPO / "bench/peers/go_proxy.go")], env=env,
                           capture_output=True, text=True, timeout=900, cwd=workdir, check=False)
    if built.returncode != 0:
        return f"go build failed: {built.stderr.strip()[-300:]}"
    port = free_port()
    return Server(GO, [str(binary), str(port), upstream.rstrip("/")], workdir / "go_proxy.log",
                  f"http://127.0.0.1:{port}/")


# The platform


def start_platform(workdir: Path, single_tenant: bool) -> tuple[SlessProcess, str]:
    """``sless up`` pinned to the proxy's CPU, with the function deployed and its process started; its /fn URL."""
    env = {"SLESS_SANDBOX_NETWORK": "host", "SLESS_WARM_SPARES": "0", "SLESS_IDLE_TIMEOUT_SEC": "3600"}
    if single_tenant:
        env["SLESS_SANDBOX"] = "off"
    sless = start_sless(workdir / "data", env)
    pin(sless.proc.pid, PROXY_CPU)
    tenant = Tenant(sless.url, "bench-proxies")
    tenant.deploy("ok", "python3.11", {"handler.py": HANDLER})
    url = tenant.fn_url("ok", "/")
    resp = requests.get(url, timeout=30)
    if resp.status_code != 200:
        raise SystemExit(f"/fn answered {resp.status_code}: {resp.text[:300]}")
    pin(sless.proc.pid, PROXY_CPU)  # the function process, started since
    note_policy(sless.proc.pid)
    return sless, url


# Measuring


def measure(paths: list[Way], rounds: int, seconds: float, repin: Callable[[], None]) -> None:
    for path in paths:
        wrk(path.url, 32, 1, cpu=str(WRK_CPU))  # warm-up: pooled connections, caches
    for index in range(rounds):
        repin()
        for conns in CONNECTIONS:
            turn = index % len(paths)
            for path in paths[turn:] + paths[:turn]:
                pids = path.cpu_pids()
                before = cpu_sec(pids)
                load = wrk(path.url, conns, seconds, cpu=str(WRK_CPU))
                spent = cpu_sec(pids) - before
                path.loads.setdefault(conns, []).append(load)
                path.cpu_us.setdefault(conns, []).append(spent / max(1, load.requests) * 1e6)
                log(f"round {index + 1}/{rounds}, {conns} conn, {path.name}: {load.rps:,.0f} calls/s, "
                    f"p50 {load.p50_ms:.3f} ms, p99 {load.p99_ms:.3f} ms, errors {load.errors}")


def overview(paths: list[Way], missing: dict[str, str]) -> None:
    print("\n| path | calls/s at 1 conn | p50 at 1 conn (ms) | calls/s at 32 conn | p50 at 32 conn (ms) | "
          "p99 at 32 conn (ms) | proxy CPU per call at 32 conn (us) | errors |")
    print("|---|---|---|---|---|---|---|---|")
    for path in paths:
        errors = sum(x.errors for loads in path.loads.values() for x in loads)
        cpu = "-" if path.name == DIRECT else f"{median(path.cpu_us[32]):.0f}"
        print(f"| {path.name} | {path.fig(1, 'rps'):,.0f} | {path.fig(1, 'p50_ms'):.3f} | {path.fig(32, 'rps'):,.0f} | "
              f"{path.fig(32, 'p50_ms'):.3f} | {path.fig(32, 'p99_ms'):.3f} | {cpu} | {errors} |")
    for name, why in missing.items():
        print(f"| {name} | not measured: {why} | | | | | | |")


def verdicts(table: Table, by_name: dict[str, Way]) -> None:
    direct, fn = by_name[DIRECT], by_name[FN]
    for path in by_name.values():
        if path is direct:
            continue
        table.add(f"{path.name}: calls/s at 32 conn", path.fig(32, "rps"), "calls/s", direct.fig(32, "rps"), DIRECT)
        table.add(f"{path.name}: added p50 at 1 conn", path.fig(1, "p50_ms") - direct.fig(1, "p50_ms"), "ms")
        table.add(f"{path.name}: proxy CPU per call at 32 conn", median(path.cpu_us[32]), "us")
    rps = fn.fig(32, "rps")
    added = fn.fig(1, "p50_ms") - direct.fig(1, "p50_ms")
    if GO in by_name:
        go = by_name[GO].fig(32, "rps")
        table.add("/fn calls/s at 32 conn vs Go ReverseProxy", rps, "calls/s", go, GO, ">= 1.00x", rps >= go)
    if NGINX in by_name:
        nginx = by_name[NGINX]
        table.add("/fn calls/s at 32 conn vs nginx", rps, "calls/s", nginx.fig(32, "rps"), NGINX, ">= 0.80x",
                  rps >= 0.8 * nginx.fig(32, "rps"))
        nginx_added = nginx.fig(1, "p50_ms") - direct.fig(1, "p50_ms")
        table.add("/fn added p50 at 1 conn vs nginx's", added, "ms", nginx_added, f"{NGINX} added p50",
                  "<= nginx's + 0.1 ms", added <= nginx_added + 0.1)
    p50 = fn.fig(32, "p50_ms")
    table.add("/fn p99 at 32 conn vs its p50 at 32 conn", fn.fig(32, "p99_ms"), "ms", p50, "/fn p50 at 32 conn",
              "<= 3.00x", fn.fig(32, "p99_ms") <= 3 * p50)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 2 s loads instead of 5 of 4 s")
    parser.add_argument("--single-tenant", action="store_true",
                        help="sless up without a sandbox (SLESS_SANDBOX=off), where bwrap is missing")
    parser.add_argument("--peers-batch", action="store_true",
                        help="run nginx and the Go proxy under SCHED_BATCH too, as sless up runs itself")
    args = parser.parse_args()
    if args.peers_batch:
        Server.policy = ["chrt", "-b", "0"]
    for tool in ("wrk", "taskset", "ss"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (scripts/install-test-services.sh)")
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("needs 2 CPUs: the proxy and runtime on one, wrk on the other")
    rounds, seconds = (2, 2) if args.quick else (5, 4)
    load_start = os.getloadavg()
    started = time.monotonic()
    servers: list[Server] = []
    missing: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="sless-bench-proxies-") as tmp:
        workdir = Path(tmp)
        log("starting sless up and the function")
        sless, fn_url = start_platform(workdir, args.single_tenant)
        try:
            direct_url = function_process_url(sless)
            paths = [Way(DIRECT, direct_url, list)]
            for name, starter in ((NGINX, start_nginx), (GO, start_go_proxy)):
                made = starter(workdir, direct_url)
                if isinstance(made, str):
                    missing[name] = made
                    log(f"{name}: not measured: {made}")
                else:
                    servers.append(made)
                    paths.append(Way(name, made.url, made.pids))
            paths.append(Way(FN, fn_url, lambda: [sless.proc.pid]))
            measure(paths, rounds, seconds, lambda: pin(sless.proc.pid, PROXY_CPU))
        finally:
            for server in servers:
                server.stop()
            sless.stop()
    load_end = os.getloadavg()
    print("# /fn against compiled proxies, same upstream Python runtime, proxy+runtime on CPU "
          f"{PROXY_CPU}, wrk on CPU {WRK_CPU}; peers under "
          f"{'SCHED_BATCH' if args.peers_batch else 'the normal policy'}, sless up under {policy(sless.proc.pid)}")
    print(f"\nwrk -t1, {rounds} interleaved round(s) of {seconds:g} s, medians; handler returns {{'ok': True}}; "
          f"{os.cpu_count()} CPUs; load average at start {load_start[0]:.2f}, at end {load_end[0]:.2f}; "
          f"{time.monotonic() - started:.0f} s; {time.strftime('%Y-%m-%d %H:%M')}")
    overview(paths, missing)
    table = Table("/fn against the runtime alone and the compiled proxies (ratio = value / baseline)")
    verdicts(table, {p.name: p for p in paths})
    table.print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
