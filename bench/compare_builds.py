"""Two builds of sless side by side: CPU per proxied call, throughput and latency of ``/fn`` through `sless up`.

Run: ``.venv/bin/python -m bench.compare_builds --baseline /path/to/older/checkout`` (needs wrk). The baseline is
another checkout of the repository with its own ``.venv`` (``scripts/bootstrap.sh`` in it), for instance::

    git worktree add /tmp/sless-base <commit> && (cd /tmp/sless-base && scripts/bootstrap.sh)

Why this and not two runs of ``bench.standalone``: this machine kind is a VM whose speed moves by +-20% from one
minute to the next, so two builds are only comparable when measured in the same minutes. Both builds run at
once, each a `sless up` serving the same trivial Python function, and their wrk runs alternate (the order flips
every round). The CPU per call is the `sless up` process's own (its threads included, its function processes
not), from ``/proc/PID/stat`` around each wrk run: the figure that says what a change to the proxy saved, since
requests/s also moves with the runtime and with wrk. Each figure is the median over the rounds.

``--pin``: every process of both builds (their function processes too) on CPU 0 and wrk on CPU 1, as
``bench.proxies`` measures: the proxy then shares its core with the runtime, and what it costs in context switches
and caches counts in its CPU per call.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

from bench.common import Table, median, wrk
from tests.support.platform import REPO, SECRET, Tenant
from tests.support.services import free_port

TRIVIAL: dict[str, str | bytes] = {"handler.py": "def handle(event):\n    return 'ok'\n"}


def process_cpu_sec(pid: int) -> float:
    """User plus system CPU seconds of one process (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Build:
    """One checkout's `sless up`, with a trivial function deployed."""

    def __init__(self, checkout: Path, data: Path) -> None:
        python = checkout / ".venv/bin/python"
        if not python.exists():
            raise SystemExit(f"{checkout}: no .venv (run scripts/bootstrap.sh there)")
        self.name = f"{checkout.name}@{_commit(checkout)}"
        port = free_port()
        env = {**os.environ, "SLESS_JWT_SECRET": SECRET, "SLESS_IDLE_TIMEOUT_SEC": "600"}
        env.pop("SLESS_DATABASE_URL", None)
        self.log = (data.parent / f"{data.name}.log").open("w")
        self.proc = subprocess.Popen(
            [str(python), "-m", "sless_api", "up", "--host", "127.0.0.1", "--port", str(port), "--data-dir",
             str(data)], cwd=checkout, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://127.0.0.1:{port}"
        self.fn = ""

    def ready(self) -> None:
        for _ in range(600):
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name}: sless up exited ({self.proc.returncode}); see {self.log.name}")
            try:
                if requests.get(self.url + "/health", timeout=1).ok:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.1)
        tenant = Tenant(self.url, "bench")
        tenant.deploy("trivial", "python3.11", TRIVIAL)
        self.fn = tenant.fn_url("trivial")
        requests.get(self.fn, timeout=30).raise_for_status()

    def pin(self, cpu: int) -> None:
        """Every thread of this build's processes (its function processes too) to CPU."""
        from bench.proxies import pin

        pin(self.proc.pid, cpu)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def _commit(checkout: Path) -> str:
    found = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True,
                           text=True, check=False)
    return found.stdout.strip() or "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--baseline", type=Path, required=True, help="another checkout, with its own .venv")
    parser.add_argument("--candidate", type=Path, default=REPO, help="the checkout measured (default: this one)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=int, default=3, help="length of each wrk run (whole seconds)")
    parser.add_argument("--conns", default="1,32", help="keep-alive connections, comma-separated")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 2 s")
    parser.add_argument("--pin", action="store_true", help="both builds on CPU 0, wrk on CPU 1")
    args = parser.parse_args()
    wrk_cpu = "1" if args.pin else None
    rounds, seconds = (3, 2) if args.quick else (args.rounds, args.seconds)
    with tempfile.TemporaryDirectory(prefix="sless-compare-") as tmp:
        builds = [Build(args.baseline.resolve(), Path(tmp) / "baseline"),
                  Build(args.candidate.resolve(), Path(tmp) / "candidate")]
        try:
            for build in builds:
                build.ready()
                if args.pin:
                    build.pin(0)
            table = Table(f"/fn through sless up: {builds[1].name} vs {builds[0].name}, "
                          f"{rounds} alternating rounds of {seconds:g} s{', pinned' if args.pin else ''}, "
                          f"{time.strftime('%Y-%m-%d %H:%M')}")
            print(f"load average at start: {os.getloadavg()[0]:.2f}", file=sys.stderr)
            for conns in (int(c) for c in args.conns.split(",")):
                wrk(builds[0].fn, conns, 1, cpu=wrk_cpu)  # warm both
                wrk(builds[1].fn, conns, 1, cpu=wrk_cpu)
                cpu: list[list[float]] = [[], []]
                rps: list[list[float]] = [[], []]
                p50: list[list[float]] = [[], []]
                for index in range(rounds):
                    for side in (0, 1) if index % 2 == 0 else (1, 0):
                        build = builds[side]
                        before = process_cpu_sec(build.proc.pid)
                        load = wrk(build.fn, conns, seconds, cpu=wrk_cpu)
                        cpu[side].append((process_cpu_sec(build.proc.pid) - before) / max(1, load.requests) * 1e6)
                        rps[side].append(load.rps)
                        p50[side].append(load.p50_ms)
                        print(f"{conns} conn, round {index + 1}, {build.name}: {load.rps:.0f} req/s, "
                              f"{cpu[side][-1]:.0f} us CPU per call", file=sys.stderr)
                table.add(f"CPU of sless up per call, {conns} conn", median(cpu[1]), "us", median(cpu[0]),
                          "baseline build")
                table.add(f"req/s at {conns} conn", median(rps[1]), "req/s", median(rps[0]), "baseline build")
                table.add(f"p50 at {conns} conn", median(p50[1]), "ms", median(p50[0]), "baseline build")
            print(f"load average at end: {os.getloadavg()[0]:.2f}", file=sys.stderr)
            table.print()
        finally:
            for build in builds:
                build.stop()


if __name__ == "__main__":
    main()
