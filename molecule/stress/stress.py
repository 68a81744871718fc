#!/usr/bin/env python3
"""The stress functions of the original platform, with real runtimes: standalone, or as pods on the real node.

    stress.py up     --state DIR        a private PostgreSQL and `sless up` (invocation log in PostgreSQL)
    stress.py attach --state DIR --host ADDR --clients CIDR
                                        the platform installed on the test bed ($KUBECONFIG; Molecule
                                        scenario e2e-real) and a private PostgreSQL for the functions,
                                        listening on ADDR too, where pods in CIDR log in with a password
    stress.py deploy --state DIR        the nine functions of molecule/stress/functions, each with an http trigger
    stress.py run    --state DIR [--workers 20] [--duration 60] [--report FILE]
    stress.py down   --state DIR        stop what up or attach started (and delete attach's functions), delete DIR

`run` calls every function (bounded: a fixed number of calls per case, one PostgreSQL storm of
WORKERS x DURATION seconds), prints ok/error counts and throughput per case, and exits 1 when a
call failed that was not a deliberate crash, when a deliberate crash did not answer 500, or when
the platform is unhealthy afterwards (health, every function still Ready and answering; attached
to the cluster also: no platform pod restarted).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import secrets
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
from types import ModuleType
from typing import Any

import psycopg2
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
    # The stress functions write to this PostgreSQL too: from their own network namespaces they reach only the
    # host loopback ports listed here (and the API's own).
    sless = start_sless(state / "data", {"SLESS_DATABASE_URL": pg.url, "SLESS_IDLE_TIMEOUT_SEC": "3600",
                                         "SLESS_SANDBOX_HOST_PORTS": str(pg.port)})
    info["sless"] = {"pid": sless.proc.pid, "url": sless.url, "log": str(sless.log_path)}
    (state / "stress.json").write_text(json.dumps(info))
    log(f"sless up on {sless.url} (pid {sless.proc.pid})")


def _kube() -> ModuleType:
    """kubectl helpers against $KUBECONFIG (imported late: standalone runs need no cluster)."""
    from tests.install import e2e_installed

    return e2e_installed


def api_url() -> str:
    """The installed API at its Service's ClusterIP (kube-proxy's rules serve the node's own traffic too)."""
    kube = _kube()
    service = next(s for s in kube.get("services", "-n", kube.NS)["items"]
                   if s["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "api")  # fmt: skip
    return f"http://{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"


def attach(state: Path, host: str, clients: str) -> None:
    """The installed platform, and a PostgreSQL of the functions' own that pods reach at HOST.

    Its own cluster, not the platform's: the storm must not touch the invocation log's database, and
    the platform's pg_hba admits only the platform's user. Pods in CLIENTS log in as ``stress`` with
    a random password (scram-sha-256) to the database ``stress`` only; the superuser stays on loopback.
    """
    state.mkdir(parents=True, exist_ok=True)
    if (state / "stress.json").exists():
        raise RuntimeError(f"{state} already has a stress setup; `stress.py down --state {state}` first")
    network = ipaddress.ip_network(clients)  # refuses a malformed CIDR before anything starts
    ipaddress.ip_address(host)
    secret = _kube().secret_value("sless-jwt", "secret")
    info: dict[str, Any] = {"kube": True, "sless": {"url": api_url()}, "secret": secret}
    base = Path(tempfile.mkdtemp(prefix="sless-stress-pg-"))
    os.chmod(base, 0o755)  # noqa: S103  (the server runs as the postgres user and must reach its folder)
    pg = PostgresServer(base / "cluster", free_port(), database="stress", listen=f"127.0.0.1,{host}")
    (base / "cluster").mkdir()
    pg.init()
    with (pg.data_dir / "pg_hba.conf").open("a") as hba:
        hba.write(f"host stress stress {network} scram-sha-256\n")
    info["pg"] = {"base": str(base), "port": pg.port}
    (state / "stress.json").write_text(json.dumps(info))
    pg.start()
    pg.create_database()
    password = secrets.token_hex(16)
    conn = psycopg2.connect(pg.url)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("CREATE ROLE stress LOGIN PASSWORD %s", (password,))
            cur.execute("ALTER DATABASE stress OWNER TO stress")  # PostgreSQL 15: its public schema too
    finally:
        conn.close()
    info["pg"]["url"] = f"postgresql://stress:{password}@{host}:{pg.port}/stress"
    (state / "stress.json").write_text(json.dumps(info))
    log(f"API at {info['sless']['url']}; the functions' PostgreSQL on {host}:{pg.port} for {network}")


def down(state: Path) -> None:
    if not (state / "stress.json").exists():
        log(f"{state}: nothing runs")
        shutil.rmtree(state, ignore_errors=True)
        return
    info = _load(state)
    if info.get("kube"):  # a later attach starts over (its PostgreSQL has another password)
        t = tenant(state)
        try:
            for name in SPECS:
                t.api("DELETE", f"/functions/{name}")
        except requests.RequestException as exc:  # the platform is gone already
            log(f"the functions not deleted: {exc}")
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
    info = _load(state)
    return Tenant(info["sless"]["url"], SUB, info.get("secret", SECRET))


def files_of(folder: Path) -> dict[str, str | bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def deploy(state: Path, wait: float = 900) -> None:
    """Every function uploaded first, then waited for: their builds (kaniko pods on a cluster) run side by side."""
    t = tenant(state)
    database = _load(state)["pg"]["url"]
    start = time.monotonic()
    t.api("POST", "/ensure", expect=(200, 201))
    hashes: dict[str, str | None] = {}
    for name, (runtime, needs_db, timeout) in SPECS.items():
        env = {"DATABASE_URL": database} if needs_db else {}
        if t.api("GET", f"/functions/{name}").status_code != 200:
            t.api("POST", "/functions", json={"name": name, "runtime": runtime, "timeout_sec": timeout,
                                              "env_vars": env, "memory_mb": 256}, expect=201)  # fmt: skip
            t.api("POST", "/triggers", json={"name": name, "type": "http", "function": name}, expect=201)
        # the same code again rebuilds nothing
        hashes[name] = t.upload(name, files_of(FUNCTIONS / name)).json().get("code_hash")
    deadline = start + wait
    for name, (runtime, _, _) in SPECS.items():
        t.wait_phase(name, ("Ready",), max(1.0, deadline - time.monotonic()), code_hash=hashes[name])
        log(f"{name} ({runtime}): Ready {time.monotonic() - start:.1f}s after the first upload")


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


PLATFORM_PODS = "app.kubernetes.io/component in (api,operator,events)"


def pod_restarts(namespace: str, selector: str) -> dict[str, tuple[int, bool]]:
    """Pod (name/uid, so a replaced pod is another key) -> (its containers' restarts, Running and ready)."""
    kube = _kube()
    found: dict[str, tuple[int, bool]] = {}
    for pod in (kube.get("pods", "-n", namespace, "-l", selector) or {}).get("items", []):
        statuses = pod["status"].get("containerStatuses") or []
        ready = pod["status"].get("phase") == "Running" and bool(statuses) and all(c["ready"] for c in statuses)
        restarts = sum(int(c.get("restartCount", 0)) for c in statuses)
        found[f"{pod['metadata']['name']}/{pod['metadata']['uid']}"] = (restarts, ready)
    return found


def platform_pods_case(before: dict[str, tuple[int, bool]]) -> Case:
    """The platform's pods (API, operator, event dispatcher) are those of before the load, ready, none restarted."""
    case = Case("platform pods")
    start = time.monotonic()
    after = pod_restarts(_kube().NS, PLATFORM_PODS)
    case.calls = len(after)
    for pod, (restarts, ready) in sorted(after.items()):
        if pod in before and restarts == 0 and ready:
            case.ok += 1
        else:
            case.errors.append(f"{pod}: {restarts} restarts, {'ready' if ready else 'NOT ready'}"
                               + ("" if pod in before else ", new since the load began"))  # fmt: skip
    case.errors += [f"{pod} is gone" for pod in sorted(set(before) - set(after))]
    if not after:
        case.errors.append(f"no platform pod ({PLATFORM_PODS})")
    case.elapsed = time.monotonic() - start
    return case


def run(state: Path, workers: int, duration: int) -> list[Case]:
    t = tenant(state)
    info = _load(state)
    url = info["sless"]["url"]
    platform_before = pod_restarts(_kube().NS, PLATFORM_PODS) if info.get("kube") else {}
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
    if info.get("kube"):
        # a deliberate crash may restart its own function's container (told, not failed); never the platform's
        restarts = pod_restarts(t.ns, "sless.dev/component=function")
        after.note = f"function pods: {len(restarts)}, restarts {sum(r for r, _ in restarts.values())}"
        cases.append(platform_pods_case(platform_before))
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
    parser.add_argument("verb", choices=["up", "attach", "deploy", "run", "down"])
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--host", default="10.199.0.1", help="attach: an address of this machine that pods reach")
    parser.add_argument("--clients", default="10.199.0.0/24", help="attach: the pods' network")
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
        elif args.verb == "attach":
            attach(state, args.host, args.clients)
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
    except (RuntimeError, AssertionError, OSError, ValueError, requests.RequestException, psycopg2.Error) as exc:
        print(f"stress {args.verb}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
