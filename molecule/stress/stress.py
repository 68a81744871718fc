#!/usr/bin/env python3
"""The stress functions of the original platform on the standalone platform, with real runtimes.

    stress.py up     --state DIR        a private PostgreSQL and `sless up` (invocation log in PostgreSQL)
    stress.py deploy --state DIR        the nine functions of molecule/stress/functions, each with an http trigger
    stress.py run    --state DIR [--workers 20] [--duration 60] [--report FILE]
    stress.py down   --state DIR        stop both, delete DIR

`run` calls every function (bounded: a fixed number of calls per case, one PostgreSQL storm of
WORKERS x DURATION seconds), prints ok/error counts and throughput per case, and exits 1 when a
call failed that was not a deliberate crash, when a deliberate crash did not answer 500, or when
the platform is unhealthy afterwards (health, every function still Ready and answering).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support.platform import SECRET, Tenant, start_sless  # noqa: E402
from tests.support.services import PostgresServer, free_port  # noqa: E402

FUNCTIONS = Path(__file__).resolve().parent / "functions"
SUB = "stress"
# name -> (runtime, needs the database, timeout_sec)
SPECS: dict[str, tuple[str, bool, int]] = {
    "slow": ("python3.11", False, 60),
    "bigloop": ("python3.11", False, 60),
    "divzero": ("python3.11", False, 30),
    "writer": ("python3.11", True, 60),
    "go-fast": ("go1.23", False, 30),
    "go-nil": ("go1.23", False, 30),
    "js-async": ("nodejs20", True, 60),
    "js-badenv": ("nodejs20", False, 30),
    "go-pgstorm": ("go1.23", True, 900),
}


def log(message: str) -> None:
    print(f"[stress {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _load(state: Path) -> dict[str, Any]:
    return dict(json.loads((state / "stress.json").read_text()))


def up(state: Path) -> None:
    state.mkdir(parents=True, exist_ok=True)
    if (state / "stress.json").exists():
        raise RuntimeError(f"{state} already runs a stress platform; `stress.py down --state {state}` first")
    base = Path(tempfile.mkdtemp(prefix="sless-stress-pg-"))
    os.chmod(base, 0o755)  # noqa: S103  (the server runs as the postgres user and must reach its folder)
    pg = PostgresServer(base / "cluster", free_port())
    (base / "cluster").mkdir()
    pg.init()
    pg.start()
    pg.create_database()
    info: dict[str, Any] = {"pg": {"base": str(base), "port": pg.port, "url": pg.url}}
    (state / "stress.json").write_text(json.dumps(info))
    log(f"PostgreSQL on 127.0.0.1:{pg.port}")
    sless = start_sless(state / "data", {"SLESS_DATABASE_URL": pg.url, "SLESS_IDLE_TIMEOUT_SEC": "3600"})
    info["sless"] = {"pid": sless.proc.pid, "url": sless.url, "log": str(sless.log_path)}
    (state / "stress.json").write_text(json.dumps(info))
    log(f"sless up on {sless.url} (pid {sless.proc.pid})")


def down(state: Path) -> None:
    if not (state / "stress.json").exists():
        log(f"{state}: nothing runs")
        shutil.rmtree(state, ignore_errors=True)
        return
    info = _load(state)
    pid = info.get("sless", {}).get("pid")
    if pid:
        try:
            os.killpg(pid, signal.SIGTERM)
            for _ in range(400):
                os.kill(pid, 0)
                time.sleep(0.1)
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    base = Path(info["pg"]["base"])
    pg = PostgresServer(base / "cluster", int(info["pg"]["port"]))
    if pg.data_dir.exists() and pg.running():
        pg.stop("fast")
    shutil.rmtree(base, ignore_errors=True)
    shutil.rmtree(state, ignore_errors=True)
    log("stopped")


def tenant(state: Path) -> Tenant:
    return Tenant(_load(state)["sless"]["url"], SUB, SECRET)


def files_of(folder: Path) -> dict[str, str | bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def deploy(state: Path, wait: float = 900) -> None:
    t = tenant(state)
    database = _load(state)["pg"]["url"]
    for name, (runtime, needs_db, timeout) in SPECS.items():
        start = time.monotonic()
        env = {"DATABASE_URL": database} if needs_db else {}
        if t.api("GET", f"/functions/{name}").status_code == 200:
            uploaded = t.upload(name, files_of(FUNCTIONS / name)).json()  # the same code again rebuilds nothing
            t.wait_phase(name, ("Ready",), wait, code_hash=uploaded.get("code_hash"))
        else:
            t.deploy(name, runtime, files_of(FUNCTIONS / name), wait=wait, timeout_sec=timeout, env_vars=env,
                     memory_mb=256)  # fmt: skip
        log(f"{name} ({runtime}): Ready in {time.monotonic() - start:.1f}s")


@dataclass
class Case:
    name: str
    calls: int = 0
    ok: int = 0
    deliberate: int = 0
    errors: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    elapsed: float = 0.0
    note: str = ""

    def row(self) -> str:
        p50 = statistics.median(self.latencies) if self.latencies else 0.0
        top = max(self.latencies) if self.latencies else 0.0
        rate = self.calls / self.elapsed if self.elapsed else 0.0
        return (f"{self.name:<22} {self.calls:>5} {self.ok:>5} {self.deliberate:>10} {len(self.errors):>6} "
                f"{p50:>8.3f} {top:>8.3f} {rate:>8.1f}  {self.note}")  # fmt: skip


def call(t: Tenant, name: str, body: dict[str, Any], timeout: float = 120) -> tuple[int, Any, float]:
    start = time.monotonic()
    try:
        resp = requests.post(t.fn_url(name), json=body, timeout=timeout)
    except requests.RequestException as exc:
        return 0, repr(exc), time.monotonic() - start
    try:
        payload: Any = resp.json()
    except ValueError:
        payload = resp.text[:300]
    return resp.status_code, payload, time.monotonic() - start


def run_case(t: Tenant, name: str, body: dict[str, Any], calls: int, parallel: int, expect: int = 200,
             check: Callable[[Any], bool] | None = None, label: str | None = None) -> Case:  # fmt: skip
    """CALLS calls of NAME, PARALLEL at a time; EXPECT is the status every call must answer."""
    case = Case(label or name)
    start = time.monotonic()
    with ThreadPoolExecutor(parallel) as pool:
        results = list(pool.map(lambda _: call(t, name, body), range(calls)))
    case.elapsed = time.monotonic() - start
    for status, payload, latency in results:
        case.calls += 1
        case.latencies.append(latency)
        if status == expect and (check is None or check(payload)):
            if expect == 200:
                case.ok += 1
            else:
                case.deliberate += 1
        else:
            case.errors.append(f"{status} {str(payload)[:200]}")
    return case


def run(state: Path, workers: int, duration: int) -> list[Case]:
    t = tenant(state)
    url = _load(state)["sless"]["url"]
    cases = [
        run_case(t, "slow", {"sec": 2}, 8, 8, label="slow (8 x 2 s at once)"),
        run_case(t, "bigloop", {"n": 2_000_000}, 8, 4, check=lambda p: p["n"] == 2_000_000),
        run_case(
            t,
            "divzero",
            {"d": 0},
            5,
            5,
            expect=500,
            check=lambda p: "ZeroDivisionError" in str(p),
            label="divzero crash",
        ),
        run_case(t, "divzero", {"d": 7}, 3, 1, check=lambda p: p["result"] == 6.0, label="divzero after crash"),
        run_case(t, "writer", {"rows": 10}, 10, 5, check=lambda p: p["inserted"] == 10),
        run_case(
            t, "go-fast", {}, 50, 10, check=lambda p: p["factorial20"] == 2432902008176640000 and p["fib20"] == 6765
        ),
        run_case(t, "go-nil", {}, 5, 5, expect=500, label="go-nil panic"),
        run_case(t, "go-nil", {"crash": False}, 3, 1, check=lambda p: p["name"] == "fine", label="go-nil after panic"),
        run_case(t, "js-async", {}, 20, 5, check=lambda p: p["count"] > 0 and p["version"].startswith("PostgreSQL")),
        run_case(
            t, "js-badenv", {}, 5, 5, expect=500, check=lambda p: "TypeError" in str(p), label="js-badenv TypeError"
        ),
    ]
    storm = Case(f"go-pgstorm {workers}x{duration}s")
    status, payload, latency = call(
        t, "go-pgstorm", {"workers": workers, "duration_sec": duration}, timeout=duration + 120
    )
    storm.calls, storm.elapsed, storm.latencies = 1, latency, [latency]
    if status == 200 and payload.get("err_ops") == 0 and payload.get("ok_ops", 0) > 0:
        storm.ok = 1
    else:
        storm.errors.append(f"{status} {str(payload)[:300]}")
    if isinstance(payload, dict):
        storm.note = (f"ops {payload.get('total_ops')} ok {payload.get('ok_ops')} err {payload.get('err_ops')} "
                      f"{payload.get('ops_per_sec', 0):.1f} ops/s")  # fmt: skip
    cases.append(storm)
    # after the crashes: the platform and every function are still healthy
    after = Case("platform after crashes")
    start = time.monotonic()
    health = requests.get(url + "/health", timeout=10)
    after.calls += 1
    after.ok += health.status_code == 200
    if health.status_code != 200:
        after.errors.append(f"/health {health.status_code}")
    for name in SPECS:
        record = t.api("GET", f"/functions/{name}", expect=200).json()
        after.calls += 1
        if record["phase"] == "Ready":
            after.ok += 1
        else:
            after.errors.append(f"{name} is {record['phase']}: {record.get('message')}")
    for name, body in (("go-fast", {}), ("slow", {"sec": 0}), ("bigloop", {"n": 1000})):
        status, payload, _ = call(t, name, body)
        after.calls += 1
        after.ok += status == 200
        if status != 200:
            after.errors.append(f"{name} {status} {str(payload)[:200]}")
    after.elapsed = time.monotonic() - start
    cases.append(after)
    return cases


def report(cases: list[Case]) -> str:
    head = (
        f"{'case':<22} {'calls':>5} {'ok':>5} {'deliberate':>10} {'errors':>6} {'p50 s':>8} {'max s':>8} {'calls/s':>8}"
    )
    lines = [head, "-" * len(head), *(c.row() for c in cases)]
    for c in cases:
        lines += [f"  {c.name}: {e}" for e in c.errors[:5]]
    ok = sum(c.ok for c in cases)
    bad = sum(len(c.errors) for c in cases)
    lines.append(f"{ok + sum(c.deliberate for c in cases)} passed, {bad} failed")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="stress.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("verb", choices=["up", "deploy", "run", "down"])
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--workers", type=int, default=int(os.environ.get("SLESS_STRESS_WORKERS", "20")))
    parser.add_argument("--duration", type=int, default=int(os.environ.get("SLESS_STRESS_DURATION", "60")))
    parser.add_argument("--report", type=Path)
    args = parser.parse_args(argv)
    state = args.state.resolve()
    if not 1 <= args.workers <= 200 or not 1 <= args.duration <= 600:
        parser.error("--workers must be 1..200 and --duration 1..600 (a bounded load)")
    try:
        if args.verb == "up":
            up(state)
        elif args.verb == "deploy":
            deploy(state)
        elif args.verb == "run":
            cases = run(state, args.workers, args.duration)
            text = report(cases)
            print(text)
            if args.report:
                args.report.write_text(text + "\n")
            return 1 if any(c.errors for c in cases) else 0
        else:
            down(state)
    except (RuntimeError, AssertionError, OSError, requests.RequestException) as exc:
        print(f"stress {args.verb}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
