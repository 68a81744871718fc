"""Operator at scale: N Functions created at once -> all Ready, on the kwok test bed.

    .venv/bin/python bench/operator_scale.py [--n 1000] [--tenants 10] [--timeout 300] [--scaled | --compare]

What it does (bounded: at most --n Functions, at most --timeout seconds of waiting):
1. starts a fresh test bed (``tests/testbed/testbed up``) unless ``SLESS_TESTBED_EXISTING=1``
   and ``KUBECONFIG`` point at a running one, applies the CRDs, waits until the controller-manager
   counts them in quotas (the tenant quota limits them), and adds kwok nodes with room for every
   function pod plus the build pods;
2. starts ``sless-operator`` (cluster-wide, its own build namespace) as a subprocess;
3. creates N Functions with code (spread over --tenants tenant namespaces) as fast as the
   apiserver takes them (32 requests in flight), and polls them once a second;
4. prints a table: time until every Function was created, built and Ready, and the operator's
   peak RSS (``VmHWM`` of /proc/<pid>/status) and CPU time; then stops and removes everything.

Every Function really goes through the operator's full path: a kaniko build Job (completed by
kwok), then a Deployment (ReplicaSet, scheduled pod made Ready by kwok) and a Service. Targets
from the brief: all Ready in < 60 s with < 150 MB operator RSS, on 2 cores.

``--scaled``: every Function has ``spec.scale`` ({min: 0, max: 3, target: 10, idleSec: 300}), so the
operator also writes a KEDA ScaledObject per Function, and the bed runs a real KEDA (operator and
metrics adapter: ``testbed up --keda``; with ``SLESS_TESTBED_EXISTING=1`` the cluster's own KEDA, which
must be there) and a real ``sless-scaler`` on loopback that every ScaledObject's external-push trigger
names (``SLESS_SCALER_ADDRESS``). Also measured: the time until every ScaledObject exists (the
operator's work) and until every one has its HPA ``keda-hpa-<name>`` (KEDA's), and the KEDA operator's
RSS and CPU at the end (its pid from the bed's ``pids/keda-operator.json``; not known on an existing
cluster). The wait ends when every Function is Ready and every HPA exists, or at --timeout.
``--compare``: the fixed (unscaled) run, then the scaled one, each on a fresh bed (or one after the
other on the existing cluster), and both side by side with the machine's load average.
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
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import kopf

from sless_core import crd
from sless_operator.kube import Kube, api_path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # for bench.* and tests.support.scaler (a real sless-scaler on a free loopback port)
    sys.path.append(str(ROOT))

from bench import apiserver_cost  # noqa: E402 - importable once ROOT is on the path

TESTBED = ROOT / "tests" / "testbed" / "testbed"
CRDS = ROOT / "charts" / "sless" / "crds"
BUILD_NS = "sless-build-bench"
PODS_PER_NODE = 250
SCALE = {"min": 0, "max": 3, "target": 10, "idleSec": 300}
KEDA_API = "keda.sh/v1alpha1"
HPA_API = "autoscaling/v2"
HPA_PREFIX = "keda-hpa-"  # KEDA's name for a ScaledObject's HPA


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


def start_bed(state: Path, keda: bool) -> dict[str, str]:
    env = dict(os.environ)
    run(sys.executable, str(TESTBED), "up", "--state", str(state), *(["--keda"] if keda else []), env=env,
        timeout=900)  # fmt: skip
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


def wait_counted(env: dict[str, str], timeout: float = 120) -> None:
    """Until the controller-manager counts the custom resources in quotas (as tests/support/quotas.py waits).

    The operator gives each tenant a quota on ``count/functions.sless.dev`` and its siblings; the quota
    controller counts a custom resource only once it has discovered the CRD (every 30 s), and until then
    the API server refuses creates there ("status unknown for quota"). A fresh probe quota shows when.
    """
    keys = [f"count/{plural}.{crd.GROUP}" for plural in (crd.FUNCTION_PLURAL, crd.TRIGGER_PLURAL, crd.JOB_PLURAL)]
    namespace = f"quota-probe-{secrets.token_hex(4)}"
    run("kubectl", "create", "namespace", namespace, env=env)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            name = f"probe-{secrets.token_hex(3)}"  # a quota synced before the discovery stays uncounted: a new one
            quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name, "namespace": namespace},
                     "spec": {"hard": dict.fromkeys(keys, "1")}}  # fmt: skip
            run("kubectl", "apply", "-f", "-", env=env, stdin=json.dumps(quota))
            for _ in range(8):
                got = json.loads(run("kubectl", "-n", namespace, "get", "resourcequota", name, "-o", "json", env=env))
                if all(key in ((got.get("status") or {}).get("used") or {}) for key in keys):
                    return
                time.sleep(0.5)
        raise RuntimeError(f"the controller-manager did not count {keys} within {timeout:.0f}s")
    finally:
        run("kubectl", "delete", "namespace", namespace, "--wait=false", env=env)


def keda_pid(state: Path) -> int | None:
    """The KEDA operator's pid as the bed recorded it (bedlib/procs.py), or None."""
    try:
        return int(json.loads((state / "pids" / "keda-operator.json").read_text())["pid"])
    except (FileNotFoundError, ValueError, KeyError):
        return None


def existing_keda(env: dict[str, str]) -> None:
    """On an existing cluster: its KEDA must serve ScaledObjects and the external metrics API."""
    run("kubectl", "get", "crd", "scaledobjects.keda.sh", env=env)
    conditions = json.loads(run("kubectl", "get", "apiservice", "v1beta1.external.metrics.k8s.io", "-o", "json",
                                env=env)).get("status", {}).get("conditions") or []  # fmt: skip
    if not any(c.get("type") == "Available" and c.get("status") == "True" for c in conditions):
        raise RuntimeError("the existing cluster's KEDA metrics APIService is not Available")


def code_fields(ns: str, name: str, fetched: bool, version: int = 1) -> dict[str, str]:
    """A Function's code: fetched at pod start (``codeKey``, today's path for code without dependencies) or built
    into an image by a kaniko Job (``contextKey``)."""
    code = secrets.token_hex(32)
    if fetched:
        return {"codeHash": code, "codeKey": f"code/{ns}/{name}/{version}.tar.gz", "codeSha256": code}
    return {"codeHash": code, "contextKey": f"contexts/{ns}/{name}/{version}.tar.gz"}


def function_body(ns: str, name: str, scaled: bool = False, fetched: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"runtime": "python3.11", **code_fields(ns, name, fetched)}
    if scaled:
        spec["scale"] = dict(SCALE)
    return {"apiVersion": crd.API_VERSION, "kind": "Function", "metadata": {"name": name, "namespace": ns},
            "spec": spec}  # fmt: skip


async def each(bodies: list[dict[str, Any]], action: Callable[[dict[str, Any]], Awaitable[object]],
               concurrency: int = 32) -> None:
    """ACTION on every one of BODIES, CONCURRENCY requests in flight (as fast as the API server takes them)."""
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)

    async def worker() -> None:
        while not queue.empty():
            await action(queue.get_nowait())

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def function_path(body: dict[str, Any], named: bool = True) -> str:
    meta = body["metadata"]
    return api_path(crd.API_VERSION, crd.FUNCTION_PLURAL, meta["namespace"], meta["name"] if named else None)


def trigger_body(function: dict[str, Any]) -> dict[str, Any]:
    meta = function["metadata"]
    return {"apiVersion": crd.API_VERSION, "kind": "Trigger",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "spec": {"type": "http", "function": meta["name"], "enabled": True}}  # fmt: skip


def route_table(env: dict[str, str]) -> dict[str, float]:
    """One API worker's route table loaded from the cluster, measured in a process of its own (bench.route_memory)."""
    out = run(sys.executable, "-m", "bench.route_memory", env={**env, "PYTHONPATH": str(ROOT)}, timeout=900)
    measured: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return measured


async def create_all(kube: Kube, bodies: list[dict[str, Any]]) -> None:
    await each(bodies, lambda body: kube.create(function_path(body, named=False), body))


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


async def autoscalers(kube: Kube, tenants: list[str]) -> tuple[int, int]:
    """ScaledObjects (the operator's) and KEDA's HPAs in the TENANTS."""
    sos = await asyncio.gather(*(kube.list(api_path(KEDA_API, "scaledobjects", ns)) for ns in tenants))
    hpas = await asyncio.gather(*(kube.list(api_path(HPA_API, "horizontalpodautoscalers", ns)) for ns in tenants))
    return sum(map(len, sos)), sum(h["metadata"]["name"].startswith(HPA_PREFIX) for items in hpas for h in items)


async def bench(args: argparse.Namespace, env: dict[str, str], log_path: Path, scaled: bool = False,
                scaler_address: str | None = None, keda: int | None = None) -> dict[str, Any]:  # fmt: skip
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
              "SLESS_TENANT_QUOTA_CPU": "4000", "SLESS_TENANT_QUOTA_FUNCTIONS": str(args.n),
              # signing a code URL asks S3 nothing: a key and an endpoint no pod reaches (kwok starts no container)
              "SLESS_S3_ENDPOINT": "http://127.0.0.1:9", "SLESS_S3_ACCESS_KEY": "bench-access",
              "SLESS_S3_SECRET_KEY": "bench-secret-key"}  # fmt: skip
    if scaler_address:
        op_env["SLESS_SCALER_ADDRESS"] = scaler_address
    command = [str(Path(sys.executable).parent / "sless-operator"), "--quiet"]
    if args.profile:  # cProfile's own overhead inflates CPU time and RSS: not for the table
        command = [sys.executable, "-m", "cProfile", "-o", args.profile, "-m", "sless_operator.main", "--quiet"]
    with open(log_path, "wb") as log:
        operator = subprocess.Popen(command, env=op_env, stdout=log, stderr=subprocess.STDOUT)
    result: dict[str, Any] = {"n": args.n, "tenants": args.tenants, "scaled": scaled, "timeline": [],
                              "load_start": os.getloadavg()}  # fmt: skip
    try:
        await asyncio.sleep(3)  # the operator logs in and starts its watches
        fetched = args.path == "fetched"
        bodies = [function_body(tenants[i % len(tenants)], f"fn-{i:05d}", scaled, fetched) for i in range(args.n)]
        before = await apiserver_cost.sample(kube)
        start = time.monotonic()
        await create_all(kube, bodies)
        if args.triggers:  # an http trigger each: every Function is a route in the API's table
            await each(bodies, lambda body: kube.create(
                api_path(crd.API_VERSION, crd.TRIGGER_PLURAL, body["metadata"]["namespace"]), trigger_body(body)))
        result["created_s"] = time.monotonic() - start
        deadline = start + args.timeout
        while time.monotonic() < deadline:
            counts, built = await phases(kube, tenants)
            elapsed = time.monotonic() - start
            result["timeline"].append((round(elapsed, 1), counts, proc_status(operator.pid).get("VmRSS", 0)))
            if built == args.n and "built_s" not in result:
                result["built_s"] = elapsed
            if counts.get("Ready", 0) == args.n and "ready_s" not in result:
                result["ready_s"] = elapsed
            if scaled:
                sos, hpas = await autoscalers(kube, tenants)
                result["autoscalers"] = (sos, hpas)
                if sos == args.n and "scaled_objects_s" not in result:
                    result["scaled_objects_s"] = elapsed
                if hpas == args.n and "hpas_s" not in result:
                    result["hpas_s"] = time.monotonic() - start
            if "ready_s" in result and (not scaled or "hpas_s" in result):
                break
            if operator.poll() is not None:
                raise RuntimeError(f"the operator exited with {operator.returncode}; see {log_path}")
            await asyncio.sleep(1)
        result["final"] = (await phases(kube, tenants))[0]
        after = await apiserver_cost.sample(kube)
        result["create_requests"] = after[0].since(before[0])
        result["storage_bytes"] = (before[1], after[1])
        result["objects"] = await apiserver_cost.objects(kube, tenants)
        if "ready_s" in result:
            result["route_table"] = route_table(env)
        result["attribution"] = await attribution(kube, tenants, scaled)  # before the lifecycle deletes them
        if args.lifecycle and "ready_s" in result:
            await lifecycle(kube, bodies, tenants, args, result, operator)
        status = proc_status(operator.pid)
        result["vmhwm_mb"] = status.get("VmHWM", 0) / 1024
        result["rss_mb"] = status.get("VmRSS", 0) / 1024
        result["cpu_s"] = status.get("cpu_ticks", 0) / os.sysconf("SC_CLK_TCK")
        if scaled:
            result["autoscalers"] = await autoscalers(kube, tenants)
            if keda is not None:
                status = proc_status(keda)
                result["keda"] = (status.get("VmRSS", 0) / 1024, status.get("VmHWM", 0) / 1024,
                                  status.get("cpu_ticks", 0) / os.sysconf("SC_CLK_TCK"))  # fmt: skip
        result["load_end"] = os.getloadavg()
    finally:
        operator.terminate()
        try:
            operator.wait(timeout=30)
        except subprocess.TimeoutExpired:
            operator.kill()
        await kube.close()
    result["tenant_namespaces"] = tenants
    return result


async def lifecycle(kube: Kube, bodies: list[dict[str, Any]], tenants: list[str], args: argparse.Namespace,
                    result: dict[str, Any], operator: subprocess.Popen[bytes]) -> None:
    """After all are Ready: new code for every Function (a rollout each) until all serve it, then every Function
    deleted until none is left (the operator's finalizer removes its children), each timed with its requests."""
    fetched = args.path == "fetched"
    wanted: dict[tuple[str, str], str] = {}

    async def update(body: dict[str, Any]) -> None:
        meta = body["metadata"]
        code = code_fields(meta["namespace"], meta["name"], fetched, version=2)
        wanted[(meta["namespace"], meta["name"])] = code["codeHash"]
        await kube.patch(function_path(body), {"spec": code})

    async def served() -> int:
        lists = await asyncio.gather(*(kube.list(api_path(crd.API_VERSION, crd.FUNCTION_PLURAL, ns)) for ns in tenants))
        return sum(1 for items in lists for fn in items
                   if (fn.get("status") or {}).get("phase") == "Ready"
                   and (fn.get("status") or {}).get("codeHash") == wanted.get((fn["metadata"]["namespace"],
                                                                              fn["metadata"]["name"])))  # fmt: skip

    async def remaining() -> int:
        lists = await asyncio.gather(*(kube.list(api_path(crd.API_VERSION, crd.FUNCTION_PLURAL, ns)) for ns in tenants))
        return sum(map(len, lists))

    for phase, action, done in (("update", update, lambda n: n == args.n),
                                ("delete", lambda body: kube.delete(function_path(body)), lambda n: n == 0)):
        before = await apiserver_cost.sample(kube)
        start = time.monotonic()
        await each(bodies, action)
        probe = served if phase == "update" else remaining
        while time.monotonic() - start < args.timeout:
            if done(await probe()):
                result[f"{phase}_s"] = time.monotonic() - start
                break
            if operator.poll() is not None:
                raise RuntimeError(f"the operator exited with {operator.returncode}")
            await asyncio.sleep(1)
        result[f"{phase}_requests"] = (await apiserver_cost.sample(kube))[0].since(before[0])
        if f"{phase}_s" not in result:
            return  # the next phase would measure this one's leftovers


def _ts(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def _condition_time(obj: dict[str, Any], kind: str) -> float | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return _ts(cond.get("lastTransitionTime"))
    return None


async def attribution(kube: Kube, tenants: list[str], scaled: bool = False) -> dict[str, tuple[float, float, int]]:
    """Where the time went, per Function, from the objects' own timestamps (1 s resolution).

    operator: Function created -> build Job created; build Job complete -> Deployment created;
    Deployment Available -> Function Ready. cluster (controllers, scheduler, kwok): build Job
    created -> complete; Deployment created -> Available. SCALED: also the operator's Function
    created -> ScaledObject created, and KEDA's ScaledObject created -> its HPA created.
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
    extra: dict[str, list[float]] = {"op: Function -> ScaledObject": [], "KEDA: ScaledObject -> HPA": []}
    for ns in tenants:
        deps = {d["metadata"]["name"]: d for d in await kube.list(api_path("apps/v1", "deployments", ns))}
        sos: dict[str, dict[str, Any]] = {}
        hpas: dict[str, dict[str, Any]] = {}
        if scaled:
            sos = {o["metadata"]["name"]: o for o in await kube.list(api_path(KEDA_API, "scaledobjects", ns))}
            hpas = {
                h["metadata"]["name"]: h for h in await kube.list(api_path(HPA_API, "horizontalpodautoscalers", ns))
            }
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
            so, hpa = sos.get(name), hpas.get(HPA_PREFIX + name)
            so_at = _ts(so["metadata"]["creationTimestamp"]) if so else None
            if so_at is not None and points[0] is not None:
                extra["op: Function -> ScaledObject"].append(max(0.0, so_at - points[0]))
            hpa_at = _ts(hpa["metadata"]["creationTimestamp"]) if hpa else None
            if so_at is not None and hpa_at is not None:
                extra["KEDA: ScaledObject -> HPA"].append(max(0.0, hpa_at - so_at))
    if scaled:
        spans.update(extra)
    result = {}
    for key, values in spans.items():
        values.sort()
        if values:
            result[key] = (values[len(values) // 2], values[min(len(values) - 1, int(len(values) * 0.95))], len(values))
    return result


def _seconds(value: float | None, r: dict[str, Any]) -> str:
    return f"{value:.1f}" if value is not None else f"> {r['timeline'][-1][0]:.0f}"


def print_table(r: dict[str, Any]) -> None:
    ready = r.get("ready_s")
    print()
    print(f"== {r['n']} Functions, {'scaled (KEDA ScaledObject each)' if r.get('scaled') else 'fixed replicas'}")
    print(f"{'metric':<42} {'value':>12} {'target':>10}")
    print("-" * 66)
    print(f"{'Functions (tenant namespaces)':<42} {r['n']:>7} ({r['tenants']:>2}) {'':>10}")
    print(f"{'all created (s)':<42} {r['created_s']:>12.1f} {'':>10}")
    built = r.get("built_s")
    label = "all with their code: image built or URL set (s)"
    print(f"{label:<42} {built if built is None else round(built, 1)!s:>12}")
    ready_text = f"{ready:.1f}" if ready is not None else f"> {r['timeline'][-1][0]:.0f}"
    print(f"{'all Ready (s)':<42} {ready_text:>12} {'< 60':>10}")
    print(f"{'operator peak RSS, VmHWM (MB)':<42} {r['vmhwm_mb']:>12.1f} {'< 150':>10}")
    print(f"{'operator RSS at the end (MB)':<42} {r['rss_mb']:>12.1f} {'':>10}")
    print(f"{'operator CPU time (s)':<42} {r['cpu_s']:>12.1f} {'':>10}")
    print(f"{'final phases':<42} {json.dumps(r['final']):>12}")
    if r.get("scaled"):
        sos, hpas = r.get("autoscalers", (0, 0))
        print(f"{'all ScaledObjects (operator) (s)':<42} {_seconds(r.get('scaled_objects_s'), r):>12}")
        print(f"{'all HPAs (KEDA) (s)':<42} {_seconds(r.get('hpas_s'), r):>12}")
        print(f"{'ScaledObjects / HPAs at the end':<42} {f'{sos} / {hpas}':>12}")
        keda = r.get("keda")
        text = f"{keda[0]:.1f} ({keda[1]:.1f})" if keda else "n/a"
        print(f"{'KEDA operator RSS at the end (peak) (MB)':<42} {text:>12}")
        print(f"{'KEDA operator CPU time (s)':<42} {f'{keda[2]:.1f}' if keda else 'n/a':>12}")
        if r.get("scaler_rss_mb") is not None:
            print(f"{'sless-scaler RSS at the end (MB)':<42} {r['scaler_rss_mb']:>12.1f}")
    print_costs(r)
    print(f"{'load average, start -> end (1 min)':<42} {r['load_start'][0]:>5.1f} -> {r['load_end'][0]:<5.1f}")
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


def print_costs(r: dict[str, Any]) -> None:
    """API server requests per Function in each phase, objects per Function, and the storage's growth."""
    n = r["n"]
    for phase in ("create", "update", "delete"):
        requests: apiserver_cost.Requests | None = r.get(f"{phase}_requests")
        if phase != "create":
            taken = r.get(f"{phase}_s")
            label = f"all {'serving new code' if phase == 'update' else 'deleted'} after {phase} (s)"
            print(f"{label:<42} {'-' if taken is None else f'{taken:.1f}':>12}")
        if requests is None:
            continue
        top = sorted(requests.by_resource.items(), key=lambda kv: -kv[1])[:4]
        detail = ", ".join(f"{name} {count / n:.1f}" for name, count in top)
        print(f"{f'API server requests per Function, {phase}':<42} {requests.total / n:>12.1f}   ({detail})")
    table = r.get("route_table")
    if table:
        per = table["held_bytes"] / n / 1024
        print(f"{'route table per Function, one worker (KB)':<42} {per:>12.2f}   (heap held after loading "
              f"{table['routes']:.0f} routes in {table['loaded_s']:.1f} s; RSS growth "
              f"{table['rss_growth_kb'] / n:.2f} KB per Function)")  # fmt: skip
    counts = {kind: count for kind, count in (r.get("objects") or {}).items() if count}
    if counts:
        per = sum(counts.values()) / n
        detail = ", ".join(f"{kind} {count / n:.2f}" for kind, count in counts.items())
        print(f"{'objects per Function, tenant namespaces':<42} {per:>12.2f}   ({detail})")
    before, after = r.get("storage_bytes") or (None, None)
    if before is not None and after is not None:
        print(f"{'storage (etcd) growth per Function (KB)':<42} {(after - before) / n / 1024:>12.1f}"
              f"   ({before / 2**20:.1f} -> {after / 2**20:.1f} MB)")  # fmt: skip


def print_compare(fixed: dict[str, Any], scaled: dict[str, Any]) -> None:
    """The scaled run against the fixed one: value | baseline (same run) | ratio."""
    rows = [
        ("all created (s)", scaled.get("created_s"), fixed.get("created_s")),
        ("all Ready (s)", scaled.get("ready_s"), fixed.get("ready_s")),
        ("all ScaledObjects, operator (s)", scaled.get("scaled_objects_s"), None),
        ("all HPAs, KEDA (s)", scaled.get("hpas_s"), None),
        ("operator peak RSS, VmHWM (MB)", scaled.get("vmhwm_mb"), fixed.get("vmhwm_mb")),
        ("operator CPU time (s)", scaled.get("cpu_s"), fixed.get("cpu_s")),
        ("KEDA operator RSS at the end (MB)", (scaled.get("keda") or (None,))[0], None),
    ]
    print()
    print(f"== scaled vs fixed, {scaled['n']} Functions")
    print(f"{'measure':<36} {'scaled':>10} {'fixed (same run)':>18} {'ratio':>8}")
    print("-" * 75)
    for label, value, base in rows:
        ratio = f"{value / base:.2f}x" if value is not None and base else "-"
        print(f"{label:<36} {'-' if value is None else f'{value:.1f}':>10} "
              f"{'-' if base is None else f'{base:.1f}':>18} {ratio:>8}")  # fmt: skip
    loads = [f"{r['load_start'][0]:.1f} -> {r['load_end'][0]:.1f}" for r in (fixed, scaled)]
    print(f"load average (1 min), fixed run: {loads[0]}, scaled run: {loads[1]} ({os.cpu_count()} cores)")


def cleanup(env: dict[str, str], result: dict[str, Any], nodes: list[str]) -> None:
    """Remove what a run made on an existing cluster (KEDA's ScaledObjects and HPAs go with their namespaces)."""
    for ns in result.get("tenant_namespaces", []):
        for name in run("kubectl", "-n", ns, "get", "functions.sless.dev", "-o", "name", env=env).split():
            run("kubectl", "-n", ns, "patch", name, "--type=merge", "-p", '{"metadata":{"finalizers":null}}', env=env)
        run("kubectl", "delete", "namespace", ns, "--wait=false", env=env)
    run("kubectl", "delete", "namespace", BUILD_NS, "--wait=false", "--ignore-not-found", env=env)
    if nodes:
        run("kubectl", "delete", "node", *nodes, "--wait=false", env=env)


def variant(args: argparse.Namespace, scaled: bool) -> dict[str, Any]:
    """One measured run: its own bed (unless an existing cluster), KEDA and sless-scaler when SCALED."""
    existing = os.environ.get("SLESS_TESTBED_EXISTING") == "1"
    state = Path(tempfile.mkdtemp(prefix="sless-bench-bed-"))
    work = Path(tempfile.mkdtemp(prefix="sless-bench-"))
    t0 = time.monotonic()
    env = dict(os.environ) if existing else start_bed(state, keda=scaled)
    print(f"test bed {'reused' if existing else 'up'}{' with KEDA' if scaled else ''} in {time.monotonic() - t0:.1f}s",
          file=sys.stderr)  # fmt: skip
    nodes: list[str] = []
    result: dict[str, Any] = {}
    scaler = None
    try:
        os.environ["KUBECONFIG"] = env["KUBECONFIG"]
        run("kubectl", "apply", "-f", str(CRDS), env=env)
        kinds = [f"crd/{p}.{crd.GROUP}" for p in (crd.FUNCTION_PLURAL, crd.TRIGGER_PLURAL, crd.JOB_PLURAL)]
        run("kubectl", "wait", "--for=condition=Established", "--timeout=60s", *kinds, env=env)
        wait_counted(env)
        nodes = add_nodes(env, args.n * 2)
        address, keda = None, None
        if scaled:
            from tests.support import scaler as scalers  # a test helper: only when scaled

            if existing:
                existing_keda(env)
            keda = None if existing else keda_pid(state)
            scaler = scalers.start(work, SLESS_LOG_LEVEL="INFO")
            address = scaler.address
        result = asyncio.run(bench(args, env, work / "operator.log", scaled, address, keda))
        if scaler is not None:
            result["scaler_rss_mb"] = proc_status(scaler.proc.pid).get("VmRSS", 0) / 1024
        print_table(result)
        print(f"\noperator log: {work / 'operator.log'}", file=sys.stderr)
    finally:
        if scaler is not None:
            scalers.stop(scaler)
        if args.keep:
            print(f"kept: KUBECONFIG={env['KUBECONFIG']} tenants={result.get('tenant_namespaces')}", file=sys.stderr)
        elif existing:
            cleanup(env, result, nodes)
        else:
            subprocess.run([sys.executable, str(TESTBED), "down", "--state", str(state)], capture_output=True,
                           timeout=180, check=False)  # fmt: skip
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1000, help="Functions to create (max 10000)")
    parser.add_argument("--path", choices=("fetched", "built"), default="fetched",
                        help="code fetched at pod start (today's path without dependencies) or built by kaniko")
    parser.add_argument("--triggers", action="store_true", help="an http trigger per Function (a route each)")
    parser.add_argument("--lifecycle", action="store_true",
                        help="then new code for every Function until all serve it, then delete them all")
    parser.add_argument("--tenants", type=int, default=10, help="tenant namespaces to spread them over")
    parser.add_argument("--timeout", type=float, default=300, help="seconds to wait for each phase (max 3600)")
    parser.add_argument("--profile", metavar="FILE", help="run the operator under cProfile, stats into FILE")
    parser.add_argument("--keep", action="store_true", help="leave the objects (and a started test bed) behind")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--scaled", action="store_true", help="every Function with spec.scale, a real KEDA and scaler")
    mode.add_argument("--compare", action="store_true", help="the fixed run, then the scaled one, side by side")
    args = parser.parse_args()
    args.n = max(1, min(args.n, 10000))
    args.timeout = max(10, min(args.timeout, 3600))
    if args.compare and args.keep:
        parser.error("--keep with --compare would leave the first run's objects in the second run's way")
    results = [variant(args, scaled) for scaled in ((False, True) if args.compare else (args.scaled,))]
    if args.compare:
        print_compare(*results)
    complete = all(r.get("ready_s") is not None and (not r.get("scaled") or r.get("hpas_s") is not None)
                   for r in results)  # fmt: skip
    return 0 if complete else 1


if __name__ == "__main__":
    sys.exit(main())
