"""Operator at scale: N Functions created at once -> all Ready, on the kwok test bed.

    .venv/bin/python bench/operator_scale.py [--n 1000] [--tenants 10] [--timeout 300]

What it does (bounded: at most --n Functions, at most --timeout seconds of waiting):
1. starts a fresh test bed (``tests/testbed/testbed up``) unless ``SLESS_TESTBED_EXISTING=1``
   and ``KUBECONFIG`` point at a running one, applies the CRDs and adds kwok nodes with room for
   every function pod plus the build pods;
2. starts ``sless-operator`` (cluster-wide, its own build namespace) as a subprocess;
3. creates N Functions with code (spread over --tenants tenant namespaces) as fast as the
   apiserver takes them (32 requests in flight), and polls them once a second;
4. prints a table: time until every Function was created, built and Ready, and the operator's
   peak RSS (``VmHWM`` of /proc/<pid>/status) and CPU time; then stops and removes everything.

Every Function really goes through the operator's full path: a kaniko build Job (completed by
kwok), then a Deployment (ReplicaSet, scheduled pod made Ready by kwok) and a Service. Targets
from the brief: all Ready in < 60 s with < 150 MB operator RSS, on 2 cores.
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/ is sys.path[0] when run as a script; keep it off the path so that no sibling module can
# ever shadow a standard library module of the same name.
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    del sys.path[0]

import argparse
import asyncio
import itertools
import json
import os
import secrets
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from typing import Any

import kopf

from sless_core import crd
from sless_operator.kube import Kube, api_path

ROOT = Path(__file__).resolve().parents[1]
TESTBED = ROOT / "tests" / "testbed" / "testbed"
CRDS = ROOT / "charts" / "sless" / "crds"
BUILD_NS = "sless-build-bench"
PODS_PER_NODE = 250


def run(*argv: str, env: dict[str, str], stdin: str | None = None, timeout: float = 120) -> str:
    proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {proc.stderr.strip()[-2000:]}")
    return proc.stdout


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS/VmHWM in kB, and CPU seconds (utime + stime) of PID."""
    values: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0])
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        values["cpu_ticks"] = int(fields[11]) + int(fields[12])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return values


def start_bed(state: Path) -> dict[str, str]:
    env = dict(os.environ)
    run(sys.executable, str(TESTBED), "up", "--state", str(state), env=env, timeout=600)
    exported: dict[str, str] = json.loads((state / "env.json").read_text())["env"]
    env.update({k: v for k, v in exported.items() if k != "PATH_PREPEND"})
    if exported.get("PATH_PREPEND"):
        env["PATH"] = exported["PATH_PREPEND"] + os.pathsep + env.get("PATH", "")
    return env


def add_nodes(env: dict[str, str], pods: int) -> list[str]:
    """kwok nodes with room for PODS pods (kwok manages every node)."""
    count = max(1, -(-pods // PODS_PER_NODE))
    names = [f"bench-node-{i}" for i in range(count)]
    resources = {"cpu": "1000", "memory": "4Ti", "pods": str(PODS_PER_NODE)}
    nodes = [{
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                     "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok"}},
        "status": {"allocatable": resources, "capacity": resources},
    } for name in names]  # fmt: skip
    run("kubectl", "apply", "-f", "-", env=env, stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes}))
    run("kubectl", "wait", "--for=condition=Ready", "--timeout=120s", *[f"node/{n}" for n in names], env=env,
        timeout=150)  # fmt: skip
    return names


def function_body(ns: str, name: str) -> dict[str, Any]:
    code = secrets.token_hex(32)
    return {
        "apiVersion": crd.API_VERSION, "kind": "Function",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"runtime": "python3.11", "codeHash": code, "contextKey": f"contexts/{ns}/{name}/1.tar.gz"},
    }  # fmt: skip


async def create_all(kube: Kube, bodies: list[dict[str, Any]], concurrency: int = 32) -> None:
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)

    async def worker() -> None:
        while not queue.empty():
            body = queue.get_nowait()
            ns = body["metadata"]["namespace"]
            await kube.create(api_path(crd.API_VERSION, crd.FUNCTION_PLURAL, ns), body)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def phases(kube: Kube, tenants: list[str]) -> tuple[dict[str, int], int]:
    """Functions of the TENANTS per phase, and how many have an image of their current code."""
    counts: dict[str, int] = {}
    built = 0
    lists = await asyncio.gather(*(kube.list(api_path(crd.API_VERSION, crd.FUNCTION_PLURAL, ns)) for ns in tenants))
    for item in (item for items in lists for item in items):
        status = item.get("status") or {}
        phase = status.get("phase") or "(none)"
        counts[phase] = counts.get(phase, 0) + 1
        built += status.get("codeHash") == item["spec"].get("codeHash")
    return counts, built


async def bench(args: argparse.Namespace, env: dict[str, str], log_path: Path) -> dict[str, Any]:
    info = kopf.login_with_kubeconfig(settings=kopf.OperatorSettings())
    assert info is not None, "no kubeconfig"
    kube = Kube(concurrency=32)
    await kube.connect(info)
    tenants = [f"sless-{secrets.token_hex(8)}" for _ in range(args.tenants)]
    for ns in tenants:
        await kube.create(api_path("v1", "namespaces"), {"apiVersion": "v1", "kind": "Namespace",
                                                         "metadata": {"name": ns}})  # fmt: skip
    op_env = {**env, "SLESS_BUILD_NAMESPACE": BUILD_NS, "SLESS_REGISTRY": "registry.bench.invalid/sless",
              "SLESS_TENANT_QUOTA_PODS": str(args.n * 2), "SLESS_TENANT_QUOTA_MEMORY": "4Ti",
              "SLESS_TENANT_QUOTA_CPU": "4000"}  # fmt: skip
    command = [str(Path(sys.executable).parent / "sless-operator"), "--quiet"]
    if args.profile:  # cProfile's own overhead inflates CPU time and RSS: not for the table
        command = [sys.executable, "-m", "cProfile", "-o", args.profile, "-m", "sless_operator.main", "--quiet"]
    with open(log_path, "wb") as log:
        operator = subprocess.Popen(command, env=op_env, stdout=log, stderr=subprocess.STDOUT)
    result: dict[str, Any] = {"n": args.n, "tenants": args.tenants, "timeline": []}
    try:
        await asyncio.sleep(3)  # the operator logs in and starts its watches
        bodies = [function_body(tenants[i % len(tenants)], f"fn-{i:05d}") for i in range(args.n)]
        start = time.monotonic()
        await create_all(kube, bodies)
        result["created_s"] = time.monotonic() - start
        deadline = start + args.timeout
        while time.monotonic() < deadline:
            counts, built = await phases(kube, tenants)
            elapsed = time.monotonic() - start
            result["timeline"].append((round(elapsed, 1), counts, proc_status(operator.pid).get("VmRSS", 0)))
            if built == args.n and "built_s" not in result:
                result["built_s"] = elapsed
            if counts.get("Ready", 0) == args.n:
                result["ready_s"] = elapsed
                break
            if operator.poll() is not None:
                raise RuntimeError(f"the operator exited with {operator.returncode}; see {log_path}")
            await asyncio.sleep(1)
        result["final"] = (await phases(kube, tenants))[0]
        status = proc_status(operator.pid)
        result["vmhwm_mb"] = status.get("VmHWM", 0) / 1024
        result["rss_mb"] = status.get("VmRSS", 0) / 1024
        result["cpu_s"] = status.get("cpu_ticks", 0) / os.sysconf("SC_CLK_TCK")
        result["attribution"] = await attribution(kube, tenants)
    finally:
        operator.terminate()
        try:
            operator.wait(timeout=30)
        except subprocess.TimeoutExpired:
            operator.kill()
        await kube.close()
    result["tenant_namespaces"] = tenants
    return result


def _ts(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def _condition_time(obj: dict[str, Any], kind: str) -> float | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return _ts(cond.get("lastTransitionTime"))
    return None


async def attribution(kube: Kube, tenants: list[str]) -> dict[str, tuple[float, float, int]]:
    """Where the time went, per Function, from the objects' own timestamps (1 s resolution).

    operator: Function created -> build Job created; build Job complete -> Deployment created;
    Deployment Available -> Function Ready. cluster (controllers, scheduler, kwok): build Job
    created -> complete; Deployment created -> Available.
    """
    jobs = {(j["metadata"]["labels"].get(crd.LABEL_NAMESPACE), j["metadata"]["labels"].get(crd.LABEL_FUNCTION)): j
            for j in await kube.list(api_path("batch/v1", "jobs", BUILD_NS))}  # fmt: skip
    keys = (
        "op: Function -> build Job",
        "cluster: build Job -> complete",
        "op: build complete -> Deployment",
        "cluster: Deployment -> Available",
        "op: Available -> Function Ready",
    )
    spans: dict[str, list[float]] = {k: [] for k in keys}
    for ns in tenants:
        deps = {d["metadata"]["name"]: d for d in await kube.list(api_path("apps/v1", "deployments", ns))}
        for fn in await kube.list(api_path(crd.API_VERSION, crd.FUNCTION_PLURAL, ns)):
            name = fn["metadata"]["name"]
            job, dep = jobs.get((ns, name)), deps.get(name)
            points = [
                _ts(fn["metadata"]["creationTimestamp"]),
                _ts(job["metadata"]["creationTimestamp"]) if job else None,
                _ts((job.get("status") or {}).get("completionTime")) if job else None,
                _ts(dep["metadata"]["creationTimestamp"]) if dep else None,
                _condition_time(dep, "Available") if dep else None,
                _condition_time(fn, "Ready"),
            ]
            for key, (a, b) in zip(spans, itertools.pairwise(points), strict=True):
                if a is not None and b is not None:
                    spans[key].append(max(0.0, b - a))
    result = {}
    for key, values in spans.items():
        values.sort()
        if values:
            result[key] = (values[len(values) // 2], values[min(len(values) - 1, int(len(values) * 0.95))], len(values))
    return result


def print_table(r: dict[str, Any]) -> None:
    ready = r.get("ready_s")
    print()
    print(f"{'metric':<42} {'value':>12} {'target':>10}")
    print("-" * 66)
    print(f"{'Functions (tenant namespaces)':<42} {r['n']:>7} ({r['tenants']:>2}) {'':>10}")
    print(f"{'all created (s)':<42} {r['created_s']:>12.1f} {'':>10}")
    built = r.get("built_s")
    print(f"{'all built: build Job complete, image set (s)':<42} {built if built is None else round(built, 1)!s:>12}")
    ready_text = f"{ready:.1f}" if ready is not None else f"> {r['timeline'][-1][0]:.0f}"
    print(f"{'all Ready (s)':<42} {ready_text:>12} {'< 60':>10}")
    print(f"{'operator peak RSS, VmHWM (MB)':<42} {r['vmhwm_mb']:>12.1f} {'< 150':>10}")
    print(f"{'operator RSS at the end (MB)':<42} {r['rss_mb']:>12.1f} {'':>10}")
    print(f"{'operator CPU time (s)':<42} {r['cpu_s']:>12.1f} {'':>10}")
    print(f"{'final phases':<42} {json.dumps(r['final']):>12}")
    if r.get("attribution"):
        print()
        print(f"{'where the time went (per Function, s)':<42} {'median':>8} {'p95':>8} {'n':>6}")
        for key, (median, p95, n) in r["attribution"].items():
            print(f"  {key:<40} {median:>8.0f} {p95:>8.0f} {n:>6}")
    print()
    print("timeline (s: phases, operator RSS MB)")
    step = max(1, len(r["timeline"]) // 15)
    for elapsed, counts, rss in r["timeline"][::step] + r["timeline"][-1:]:
        print(f"  {elapsed:>6.1f}: {json.dumps(counts, sort_keys=True):<70} {rss / 1024:6.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1000, help="Functions to create (max 5000)")
    parser.add_argument("--tenants", type=int, default=10, help="tenant namespaces to spread them over")
    parser.add_argument("--timeout", type=float, default=300, help="seconds to wait for all Ready (max 1800)")
    parser.add_argument("--profile", metavar="FILE", help="run the operator under cProfile, stats into FILE")
    parser.add_argument("--keep", action="store_true", help="leave the objects (and a started test bed) behind")
    args = parser.parse_args()
    args.n = max(1, min(args.n, 5000))
    args.timeout = max(10, min(args.timeout, 1800))
    existing = os.environ.get("SLESS_TESTBED_EXISTING") == "1"
    state = Path(tempfile.mkdtemp(prefix="sless-bench-bed-"))
    work = Path(tempfile.mkdtemp(prefix="sless-bench-"))
    t0 = time.monotonic()
    env = dict(os.environ) if existing else start_bed(state)
    print(f"test bed {'reused' if existing else 'up'} in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    nodes: list[str] = []
    result: dict[str, Any] = {}
    try:
        os.environ["KUBECONFIG"] = env["KUBECONFIG"]
        run("kubectl", "apply", "-f", str(CRDS), env=env)
        run("kubectl", "wait", "--for=condition=Established", "--timeout=60s", "crd/functions.sless.dev", env=env)
        nodes = add_nodes(env, args.n * 2)
        result = asyncio.run(bench(args, env, work / "operator.log"))
        print_table(result)
        print(f"\noperator log: {work / 'operator.log'}", file=sys.stderr)
    finally:
        if args.keep:
            print(f"kept: KUBECONFIG={env['KUBECONFIG']} tenants={result.get('tenant_namespaces')}", file=sys.stderr)
        elif existing:
            for ns in result.get("tenant_namespaces", []):
                for kind in ("functions.sless.dev",):
                    names = run("kubectl", "-n", ns, "get", kind, "-o", "name", env=env).split()
                    for name in names:
                        run("kubectl", "-n", ns, "patch", name, "--type=merge", "-p",
                            '{"metadata":{"finalizers":null}}', env=env)  # fmt: skip
                run("kubectl", "delete", "namespace", ns, "--wait=false", env=env)
            run("kubectl", "delete", "namespace", BUILD_NS, "--wait=false", "--ignore-not-found", env=env)
            if nodes:
                run("kubectl", "delete", "node", *nodes, "--wait=false", env=env)
        else:
            subprocess.run([sys.executable, str(TESTBED), "down", "--state", str(state)], capture_output=True,
                           timeout=180, check=False)  # fmt: skip
    return 0 if result.get("ready_s") is not None else 1


if __name__ == "__main__":
    sys.exit(main())
