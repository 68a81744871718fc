"""Cold starts of Python and Node: warm spares, and Python's precompiled runtime against compiling it at every start.

Run: ``.venv/bin/python -m bench.coldstart [--quick] [--no-platform]`` (the platform part needs bwrap,
like ``sless up``; everything listens on 127.0.0.1).

A function process runs with PYTHONDONTWRITEBYTECODE and, sandboxed, sees the runtimes folder read-only,
so it cannot cache bytecode: unless the runtime's modules were compiled beforehand (``sless up`` does it
at start, the image at build), every cold start compiles the whole server again. Measured, interleaved:

1. process start: ``python -S server.py`` of a trivial handler until ``GET /_/health`` answers 200, with
   the runtime precompiled (``precompiled``), from a copy without bytecode (``compiled at start``, the
   baseline: what every sandboxed start did before), and the previous thread-per-connection server
   (``bench/peers/threaded_server.py``) from a copy without bytecode (its smaller file compiles faster);
   and, precompiled, in the sandbox as ``sless up`` starts it (bwrap, and as root a tenant uid, cgroups
   and the port rule): what the sandbox adds;
2. through the supervisor (no sandbox): the runtime saying it listens on its readiness pipe against the
   same runtime polled every 5 ms;
3. with ``sless up`` (sandboxed, as it runs tenants): the first call through the proxy after scale to
   zero (trigger disabled and enabled, then a pause: scale to zero happens after minutes without calls, so
   whatever the platform prepares in the background has had its time), three platforms in the same run:
   the default (a warm spare per tenant, ``SLESS_WARM_SPARES=1``: the call takes over a pre-started
   sandboxed runtime), no spares (``SLESS_WARM_SPARES=0``: a fresh sandboxed process, precompiled), and no
   spares with a runtimes copy that cannot hold bytecode (its ``__pycache__`` is a file).

Node, in the same run: the first call after scale to zero of a Node function on the default ``sless up`` (a Node
spare per tenant) and on the one without spares, against the bare interpreter: ``node`` running a three-line
``http.createServer().listen()`` until it answers (no sandbox, no runtime; ``node -e ''`` to its exit, and the
runtime's own ``server.js`` to healthy, are printed beside it).

What the sandbox's syscall filter (standalone/seccomp.py) and, as root, the process's own network namespace
(standalone/network.py: pasta set up before the process runs) cost, in the same run: the sandboxed process
start against the same launch with the filter off, and against the same launch on the host's network; and
the no-spare ``sless up`` cold start against a fourth platform whose filter is off (``bench.unfiltered_up``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import Table, median, percentile

REPO = Path(__file__).resolve().parent.parent
RUNTIME = REPO / "runtimes" / "python3.11"
HANDLER = "def handle(event):\n    return 'ok'\n"
NODE_HANDLER = "exports.handle = async () => 'ok';\n"
#: The bare interpreter, listening: what a Node cold start cannot go below without a spare.
NODE_LISTEN = ("require('http').createServer((q, s) => s.end('ok'))"
               ".listen(Number(process.env.PORT), '127.0.0.1');")
NODE_BARE = "bare node, start to listening"
NODE_EMPTY = "node -e '', start to exit"
NODE_RUNTIME = "node server.js, start to healthy"
PRECOMPILED = "precompiled"
COMPILED = "compiled at start"
PREVIOUS = "previous server, compiled at start"
SANDBOXED = "precompiled, sandboxed"
SPARE = "warm spare"
READY_PIPE = "readiness byte"
POLLED = "health polled every 5 ms"
NO_SPARE = "no spare, precompiled"
UNFILTERED = "precompiled, sandboxed without the syscall filter"
HOST_NETWORK = "precompiled, sandboxed on the host's network"
NO_SPARE_UNFILTERED = "no spare, precompiled, without the syscall filter"
#: Pause between scale to zero and the call (see the module docstring).
SETTLE_SEC = 0.5


def log(message: str) -> None:
    print(f"[bench.coldstart] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def runtime_copy(root: Path, server_source: Path | None = None, cacheable: bool = True) -> Path:
    """The runtime's files in ``root`` (``server_source`` as server.py when given); ``cacheable=False``
    makes ``__pycache__`` a file, so nothing can compile bytecode there."""
    root.mkdir(parents=True)
    for path in RUNTIME.glob("*.py"):
        shutil.copy(path, root / path.name)
    if server_source is not None:
        shutil.copy(server_source, root / "server.py")
    if not cacheable:
        (root / "__pycache__").write_text("bytecode cannot be cached here\n")
    return root


def start_to_healthy(python: str, server: Path, code: Path, sandbox: Any = None, filtered: bool = True,
                     own_network: bool = True) -> float:
    """Seconds from spawning the server (in ``sandbox``'s jail when given, as ``sless up`` starts it) until
    /_/health answers 200 (polled every millisecond). ``filtered``: with the syscall filter; ``own_network``:
    in a network namespace of its own when the sandbox gives one (as root, with pasta)."""
    port = free_port()
    env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PORT": str(port),
           "SLESS_HOST": "127.0.0.1", "SLESS_CODE_DIR": str(code)}
    request = b"GET /_/health HTTP/1.1\r\nHost: x\r\n\r\n"
    argv, preexec, jail = [python, "-S", str(server)], None, None
    started = time.perf_counter()
    if sandbox is not None:
        from sless_api.backends.standalone.host.sandbox import JailSpec, Limits

        spec = JailSpec("bench-coldstart", Limits.for_function(128, "python3.11"), ro_binds=(code, server.parent))
        pasta, sandbox.syscall_filter = sandbox.pasta, filtered
        if not own_network:
            sandbox.pasta = None
        try:
            jail = sandbox.prepare(argv, code, spec, f"bench-coldstart-{port}", port=port)
        finally:
            sandbox.pasta, sandbox.syscall_filter = pasta, True
        argv, preexec = jail.argv, jail.preexec
        env.update(jail.env)
    pass_fds = jail.pass_fds if jail is not None else ()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=code,
                            start_new_session=True, preexec_fn=preexec,  # noqa: PLW1509 - the sandbox's hook
                            pass_fds=pass_fds)
    if jail is not None:
        jail.release_fds()
        jail.attach()  # its own network namespace (as root, with pasta), as sless up gives it
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                    sock.sendall(request)
                    if sock.recv(64).startswith(b"HTTP/1.1 200"):
                        return time.perf_counter() - started
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError(f"{server} exited with {proc.returncode}") from None
                time.sleep(0.001)
        raise RuntimeError(f"{server} did not answer within 30 s")
    finally:
        if jail is not None:
            jail.kill(proc.pid)
        proc.terminate()
        proc.wait(30)
        if jail is not None:
            jail.cleanup()


def bench_process(table: Table, workdir: Path, rounds: int, sandboxed: bool) -> None:
    from sless_api.backends.standalone.builder import python_interpreter, toolchain_paths
    from sless_api.backends.standalone.host.sandbox import Sandbox

    python = str(python_interpreter())
    code = workdir / "code"
    code.mkdir()
    (code / "handler.py").write_text(HANDLER)
    precompiled = runtime_copy(workdir / "precompiled")
    modules = [str(path) for path in sorted(precompiled.glob("sless_*.py"))]
    subprocess.run([python, "-S", "-m", "py_compile", *modules], check=True, timeout=120)
    servers = {
        PRECOMPILED: precompiled / "server.py",
        COMPILED: runtime_copy(workdir / "compiled", cacheable=False) / "server.py",
        PREVIOUS: runtime_copy(workdir / "previous", REPO / "bench/peers/threaded_server.py", False) / "server.py",
    }
    sandbox = Sandbox.detect("bwrap", toolchain=[*toolchain_paths(), precompiled]) if sandboxed else None
    # (name, server, sandbox, filtered, own_network)
    runs: list[tuple[str, Path, Any, bool, bool]] = [(name, server, None, True, True)
                                                     for name, server in servers.items()]
    if sandbox is not None:
        runs += [(SANDBOXED, precompiled / "server.py", sandbox, True, True),
                 (UNFILTERED, precompiled / "server.py", sandbox, False, True),
                 (HOST_NETWORK, precompiled / "server.py", sandbox, True, False)]
    try:
        for _, server, jail, filtered, own_network in runs:
            start_to_healthy(python, server, code, jail, filtered, own_network)  # warm the page cache
        times: dict[str, list[float]] = {name: [] for name, *_ in runs}
        for r in range(rounds):
            log(f"process starts, round {r + 1}/{rounds}")
            for name, server, jail, filtered, own_network in runs:
                times[name].append(start_to_healthy(python, server, code, jail, filtered, own_network))
    finally:
        if sandbox is not None:
            sandbox.close()
    ms = {name: [t * 1000 for t in values] for name, values in times.items()}
    for baseline in (COMPILED, PREVIOUS):
        table.add(f"process start to healthy, p50 ({rounds} starts)", median(ms[PRECOMPILED]), "ms",
                  median(ms[baseline]), baseline)
    table.add(f"process start to healthy, p90 ({rounds} starts)", percentile(ms[PRECOMPILED], 90), "ms",
              percentile(ms[COMPILED], 90), COMPILED)
    if sandbox is not None:
        table.add(f"process start to healthy in the sandbox, p50 ({rounds} starts)", median(ms[SANDBOXED]), "ms",
                  median(ms[PRECOMPILED]), f"{PRECOMPILED}, no sandbox")
        table.add(f"sandboxed start with the syscall filter, p50 ({rounds} starts)", median(ms[SANDBOXED]), "ms",
                  median(ms[UNFILTERED]), UNFILTERED)
        table.add(f"sandboxed start with the syscall filter, p90 ({rounds} starts)", percentile(ms[SANDBOXED], 90),
                  "ms", percentile(ms[UNFILTERED], 90), UNFILTERED)
        if sandbox.pasta is not None:
            table.add(f"sandboxed start in its own network namespace, p50 ({rounds} starts)",
                      median(ms[SANDBOXED]), "ms", median(ms[HOST_NETWORK]), HOST_NETWORK)


def answered(port: int, proc: subprocess.Popen[bytes], started: float, what: str) -> float:
    """Seconds from ``started`` until ``GET /_/health`` on ``port`` gets an answer (any status: the bare server
    answers every path), polled every millisecond."""
    request = b"GET /_/health HTTP/1.1\r\nHost: x\r\n\r\n"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(request)
                if sock.recv(64).startswith(b"HTTP/1.1 "):
                    return time.perf_counter() - started
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {proc.returncode}") from None
            time.sleep(0.001)
    raise RuntimeError(f"{what} did not answer within 30 s")


def node_start(kind: str, node: str, code: Path) -> float:
    """Seconds of one Node start of ``kind`` (NODE_BARE, NODE_EMPTY or NODE_RUNTIME), no sandbox."""
    port = free_port()
    env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "PORT": str(port), "SLESS_HOST": "127.0.0.1",
           "SLESS_CODE_DIR": str(code)}
    argv = {NODE_BARE: [node, "-e", NODE_LISTEN], NODE_EMPTY: [node, "-e", ""],
            NODE_RUNTIME: [node, str(REPO / "runtimes" / "nodejs20" / "server.js")]}[kind]
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=code)
    try:
        if kind == NODE_EMPTY:
            proc.wait(30)
            return time.perf_counter() - started
        return answered(port, proc, started, kind)
    finally:
        proc.kill()
        proc.wait(30)


def bench_node_process(workdir: Path, rounds: int) -> dict[str, list[float]]:
    """Node's own start, interleaved (ms by kind): the baseline a Node spare's claim is held to."""
    from sless_api.backends.standalone.builder import node_binary

    node = shutil.which(node_binary())
    if node is None:
        raise RuntimeError("node is not installed")
    code = workdir / "node-code"
    code.mkdir()
    (code / "handler.js").write_text(NODE_HANDLER)
    kinds = (NODE_BARE, NODE_EMPTY, NODE_RUNTIME)
    for kind in kinds:
        node_start(kind, node, code)  # warm the page cache
    ms: dict[str, list[float]] = {kind: [] for kind in kinds}
    for r in range(rounds):
        log(f"node starts, round {r + 1}/{rounds}")
        for kind in kinds:
            ms[kind].append(node_start(kind, node, code) * 1000)
    return ms


def bench_supervisor(table: Table, workdir: Path, rounds: int) -> None:
    """Starts through the supervisor (no sandbox): the runtime's readiness byte against health polling."""
    import asyncio

    from sless_api.backends.standalone.builder import python_interpreter
    from sless_api.backends.standalone.host.supervisor import ProcessSpec, Supervisor

    code = workdir / "supervised"
    code.mkdir()
    (code / "handler.py").write_text(HANDLER)
    env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "SLESS_CODE_DIR": str(code)}
    argv = [str(python_interpreter()), "-S", str(RUNTIME / "server.py")]
    kinds = {READY_PIPE: "python3.11", POLLED: ""}  # the supervisor polls runtimes it knows no readiness pipe of

    async def run() -> dict[str, list[float]]:
        sup = Supervisor(log_dir=workdir / "supervised-logs")
        times: dict[str, list[float]] = {kind: [] for kind in kinds}
        try:
            for r in range(rounds + 1):  # the first round warms the page cache
                for kind, runtime in kinds.items():
                    await sup.deploy(kind, ProcessSpec(argv=argv, env=env, cwd=code, version="1", runtime=runtime))
                    started = time.perf_counter()
                    await sup.endpoint(kind)
                    if r:
                        times[kind].append((time.perf_counter() - started) * 1000)
                    await sup.remove(kind)
        finally:
            await sup.close()
        return times

    log("supervisor starts")
    ms = asyncio.run(run())
    table.add(f"supervisor start to healthy, readiness byte, p50 ({rounds} starts)", median(ms[READY_PIPE]), "ms",
              median(ms[POLLED]), POLLED)


def bench_platform(table: Table, workdir: Path, rounds: int, node: dict[str, list[float]]) -> None:
    import requests

    from bench.sandbox import cold_start
    from tests.support.platform import SlessProcess, Tenant, start_sless

    blocked = runtime_copy(workdir / "blocked-runtimes" / "python3.11", cacheable=False).parent
    for sub in ("nodejs20", "go1.23"):  # the platform looks for the other runtimes' folders too
        shutil.copytree(REPO / "runtimes" / sub, blocked / sub, ignore=shutil.ignore_patterns("node_modules"))
    platforms: dict[str, SlessProcess] = {}
    try:
        for name, env in ((SPARE, {"SLESS_WARM_SPARES": "1"}), (NO_SPARE, {"SLESS_WARM_SPARES": "0"}),
                          (COMPILED, {"SLESS_WARM_SPARES": "0", "SLESS_RUNTIMES_DIR": str(blocked)})):
            log(f"starting sless up ({name})")
            platforms[name] = start_sless(workdir / name.replace(" ", "-"), {"SLESS_SANDBOX": "bwrap", **env})
        log(f"starting sless up ({NO_SPARE_UNFILTERED})")
        platforms[NO_SPARE_UNFILTERED] = start_unfiltered(workdir / "unfiltered", {"SLESS_WARM_SPARES": "0"})
        tenants = {name: Tenant(sp.url, "bench-coldstart") for name, sp in platforms.items()}
        for tenant in tenants.values():
            tenant.deploy("py", "python3.11", {"handler.py": HANDLER})
            requests.get(tenant.fn_url("py"), timeout=30)
        for name in (SPARE, NO_SPARE):
            tenants[name].deploy("js", "nodejs20", {"handler.js": NODE_HANDLER})
            requests.get(tenants[name].fn_url("js"), timeout=30)
        cold: dict[str, list[float]] = {name: [] for name in tenants}
        cold_js: dict[str, list[float]] = {SPARE: [], NO_SPARE: []}
        for r in range(rounds):
            log(f"sless up cold starts, round {r + 1}/{rounds}")
            for name, tenant in tenants.items():
                cold[name].append(cold_start(tenant, "py", SETTLE_SEC) * 1000)
                if name in cold_js:
                    cold_js[name].append(cold_start(tenant, "js", SETTLE_SEC) * 1000)
        table.add(f"sless up: first call after scale to zero, p50 ({rounds})", median(cold[SPARE]), "ms",
                  median(cold[NO_SPARE]), NO_SPARE, "<= 10 ms", median(cold[SPARE]) <= 10)
        table.add(f"sless up: first call after scale to zero, p90 ({rounds})", percentile(cold[SPARE], 90), "ms",
                  percentile(cold[NO_SPARE], 90), NO_SPARE)
        table.add(f"sless up, no spare: first call after scale to zero, p50 ({rounds})", median(cold[NO_SPARE]),
                  "ms", median(cold[COMPILED]), COMPILED)
        table.add(f"sless up, no spare, with the syscall filter: first call after scale to zero, p50 ({rounds})",
                  median(cold[NO_SPARE]), "ms", median(cold[NO_SPARE_UNFILTERED]), NO_SPARE_UNFILTERED)
        table.add(f"sless up, no spare, with the syscall filter: first call after scale to zero, p90 ({rounds})",
                  percentile(cold[NO_SPARE], 90), "ms", percentile(cold[NO_SPARE_UNFILTERED], 90),
                  NO_SPARE_UNFILTERED)
        add_node_rows(table, rounds, cold_js, node)
    finally:
        for sp in platforms.values():
            sp.stop()


def add_node_rows(table: Table, rounds: int, cold_js: dict[str, list[float]], node: dict[str, list[float]]) -> None:
    """Node's rows: the first call after scale to zero with a spare against none, and against node's own start."""
    spare, bare = median(cold_js[SPARE]), median(node[NODE_BARE])
    table.add(f"sless up, Node: first call after scale to zero, p50 ({rounds})", spare, "ms",
              median(cold_js[NO_SPARE]), "no spare")
    table.add(f"sless up, Node: first call after scale to zero, p90 ({rounds})", percentile(cold_js[SPARE], 90),
              "ms", percentile(cold_js[NO_SPARE], 90), "no spare")
    table.add(f"sless up, Node: first call after scale to zero, p50 ({rounds})", spare, "ms", bare,
              f"{NODE_BARE}, p50", "<= 0.5x", spare <= 0.5 * bare)


def add_node_process_rows(table: Table, rounds: int, node: dict[str, list[float]]) -> None:
    """What a bare node start costs here: to listening, against the empty script and the runtime's own server."""
    for other in (NODE_EMPTY, NODE_RUNTIME):
        table.add(f"{NODE_BARE}, p50 ({rounds} starts)", median(node[NODE_BARE]), "ms", median(node[other]), other)


def start_unfiltered(data_dir: Path, extra_env: dict[str, str]) -> Any:
    """``sless up`` sandboxed as start_sless starts it, but with the syscall filter off (bench.unfiltered_up)."""
    import requests

    from tests.support.platform import SECRET, SlessProcess

    port = free_port()
    env = {**os.environ, "SLESS_JWT_SECRET": SECRET, "SLESS_IDLE_TIMEOUT_SEC": "300", "SLESS_SANDBOX": "bwrap",
           **extra_env}
    env.pop("SLESS_DATABASE_URL", None)
    data_dir.mkdir(parents=True)
    log_path = data_dir / "sless-up.log"
    with open(log_path, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "bench.unfiltered_up", "up", "--host", "127.0.0.1", "--port",
                                 str(port), "--data-dir", str(data_dir)], stdout=out, stderr=subprocess.STDOUT,
                                env=env, cwd=REPO, start_new_session=True)
    sp = SlessProcess(f"http://127.0.0.1:{port}", data_dir, proc, log_path, env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sless up (unfiltered) exited with {proc.returncode}:\n{sp.log_tail()}")
        try:
            if requests.get(sp.url + "/health", timeout=1).status_code == 200:
                if "syscall filter switched off" not in sp.log_tail(200):
                    raise RuntimeError("the unfiltered platform still filters: " + sp.log_tail(20))
                return sp
        except requests.RequestException:
            pass
        time.sleep(0.1)
    sp.stop()
    raise RuntimeError(f"sless up (unfiltered) did not answer /health:\n{sp.log_tail()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="7 starts of each kind instead of 21")
    parser.add_argument("--no-platform", action="store_true", help="process starts only (no sless up, no bwrap)")
    args = parser.parse_args()
    rounds = 7 if args.quick else 21
    load_start = os.getloadavg()[0]
    table = Table("Cold start of Python and Node: warm spares, precompiled runtime vs compiled at every start "
                  "(same run)")
    with tempfile.TemporaryDirectory(prefix="sless-bench-coldstart-") as tmp:
        workdir = Path(tmp)
        bench_process(table, workdir, rounds, not args.no_platform)
        node = bench_node_process(workdir, rounds)
        add_node_process_rows(table, rounds, node)
        bench_supervisor(table, workdir, rounds)
        if not args.no_platform:
            bench_platform(table, workdir, rounds, node)
    print(f"# sless cold start (Python, Node)\n\n{os.cpu_count()} CPUs; load average at start {load_start:.2f}, "
          f"at end {os.getloadavg()[0]:.2f}")
    table.print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
