"""Scale from zero on Kubernetes (the real node, a real KEDA): a call at zero -> its answer, many at once, a burst.

    flock /tmp/sless-realnode.lock .venv/bin/python -m bench.scale_from_zero [--n 8] [--fleet 25]
    flock /tmp/sless-realnode.lock .venv/bin/python -m bench.scale_from_zero --quick

Root, the real-node packages and warm caches (``scripts/install-realnode.sh``, ``tests/testbed/testbed build
--real-node``) and KEDA built (``tests/testbed/build-keda.sh``). Brings up the real-node test bed and on it the
elastic platform of tests/realnode/test_realnode_scaling.py (``tests.support.elastic``): KEDA, ``sless-scaler``,
the API (activator, ``SLESS_KUBE_ROUTING=endpoints``) and an operator. Every function has
``scale: {min 0, max 3, target 2, idle_sec 5}``; its code is fetched at pod start (no build).

1. one function at zero, per runtime (python3.11, nodejs20): each sample waits until the Deployment has 0
   replicas and no pod is left, then times one ``GET /fn/...``; the baseline is the same function's warm call
   (median of 5 calls right after). Target: p95 <= 1.5 s (Knative's CI holds its cold start to 2 s).
2. FLEET python functions at zero called at once (a thread each): p50/p95 of their time to answer, against the
   one-function p50 of step 1.
3. a 10x burst: one function with 1 steady caller (1 pod), then 10 callers: the time until 3 pods are ready and
   each has answered calls (at most 60 s), then 1 caller again until it is back to 1 pod; every failed call of
   the burst and the scale-in is counted.
4. where a cold call's time went (median over step 1's samples): the scaler hearing of the waiting call, the
   Deployment's replicas 1, the pod created, the pod ready (kubectl watches' arrival times), the answer, and the
   API's own record of the activation (``phases_ms.start``).

Every load is bounded in count and time and goes to the API on loopback. The bed is brought down at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import requests

from bench.common import Table, median, percentile
from tests.support.elastic import ElasticPlatform, elastic_platform
from tests.support.poll import until
from tests.support.realnode import real_node_bed

SCALE = {"min": 0, "max": 3, "target": 2, "idle_sec": 5}
RUNTIMES = ("python3.11", "nodejs20")
TARGET_SEC = 1.5
KNATIVE_SEC = 2.0
WARM_CALLS = 5
CALL_TIMEOUT = 90
ZERO_WAIT_SEC = 240
BURST_CALLERS = 10
BURST_SEC = 60
SCALE_IN_SEC = 180
BURST_PODS = 3

#: Say which pod answered.
HANDLERS: dict[str, dict[str, str | bytes]] = {
    "python3.11": {"handler.py": "import socket\n\ndef handle(event):\n    return {'pod': socket.gethostname()}\n"},
    "nodejs20": {"handler.js": "const os = require('os');\nexports.handle = async () => ({ pod: os.hostname() });\n"},
}
#: Each call holds its pod 50 ms, so that callers are calls in flight (the metric) most of the time.
SLEEPY: dict[str, str | bytes] = {"handler.py": "import socket, time\n\ndef handle(event):\n"
                                                "    time.sleep(0.05)\n    return {'pod': socket.gethostname()}\n"}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def single_name(runtime: str) -> str:
    return {"python3.11": "cold-py", "nodejs20": "cold-node"}[runtime]


class Watch:
    """``kubectl get -w`` of the tenant's Deployments and function pods: each event's arrival time (wall clock),
    so that the moments of a cold start can be read after the fact without polling."""

    DEPLOYMENTS = '{.metadata.name}{"|"}{.spec.replicas}{"\\n"}'
    #: name|function|Ready|deletionTimestamp|fetch-code's end|the runtime container started
    PODS = ('{.metadata.name}{"|"}{.metadata.labels.sless\\.dev/function}{"|"}'
            '{.status.conditions[?(@.type=="Ready")].status}{"|"}{.metadata.deletionTimestamp}{"|"}'
            '{.status.initContainerStatuses[*].state.terminated.reason}{"|"}{.status.containerStatuses[*].started}'
            '{"\\n"}')  # fmt: skip

    def __init__(self, e: ElasticPlatform, follow: tuple[str, ...] = ()) -> None:
        self.events: list[tuple[float, str, list[str]]] = []  # (time.time(), "deploy"|"pod", fields)
        self.procs: list[subprocess.Popen[str]] = []
        self.follow, self.followed = follow, set[str]()
        # pod -> (function, when its runtime logged that it had fetched its code: the kubelet's log timestamp)
        self.code_fetched: dict[str, tuple[str, float]] = {}
        self.bed, self.ns = bed, ns = e.real_node.bed, e.tenant.ns
        for kind, what, template in (("deploy", ["deployments"], self.DEPLOYMENTS),
                                     ("pod", ["pods", "-l", "sless.dev/component=function"], self.PODS)):  # fmt: skip
            argv = ["kubectl", "get", *what, "-n", ns, "-w", "-o", f"jsonpath={template}"]
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=bed.env)
            self.procs.append(proc)
            threading.Thread(target=self._read, args=(kind, proc), daemon=True).start()

    def _read(self, kind: str, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            fields = line.rstrip("\n").split("|")
            self.events.append((time.time(), kind, fields))
            # a followed function's runtime container runs: its log says when its code was there
            if kind == "pod" and len(fields) >= 6 and fields[1] in self.follow and fields[5] == "true" \
                    and fields[0] not in self.followed:  # fmt: skip
                self.followed.add(fields[0])
                threading.Thread(target=self._code_fetched, args=(fields[0], fields[1]), daemon=True).start()

    def _code_fetched(self, pod: str, function: str) -> None:
        """The time of the runtime's "code archive ... unpacked into" line (sless_fetch), read from its log once the
        container runs: one ``kubectl logs`` per pod, its timestamp the kubelet's, so reading late costs nothing."""
        argv = ["kubectl", "logs", "-f", "--timestamps", "-n", self.ns, pod, "-c", "function"]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=self.bed.env)
        self.procs.append(proc)
        assert proc.stdout is not None
        for line in proc.stdout:
            stamp, _, message = line.partition(" ")
            if message.startswith("code archive ") and " unpacked into " in message:
                self.code_fetched[pod] = (function, rfc3339(stamp))
                break
        proc.terminate()

    def fetched(self, function: str, after: float, until_: float) -> float | None:
        """When a pod of FUNCTION first had its code, between AFTER and UNTIL_ (a runtime that fetches it itself)."""
        found = [at for fn, at in list(self.code_fetched.values()) if fn == function and after <= at <= until_]
        return min(found, default=None)

    def first(self, after: float, until_: float, match: Callable[[str, list[str]], bool]) -> float | None:
        for at, kind, fields in list(self.events):
            if after <= at <= until_ and match(kind, fields):
                return at
        return None

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


@dataclass
class Cold:
    """One call at zero: when it was sent (wall clock), how long until its answer, and its request id."""

    function: str
    sent: float
    took: float
    status: int
    request_id: str
    warm: list[float] = field(default_factory=list)


def call(url: str, request_id: str | None = None, session: requests.Session | None = None) -> tuple[int, float]:
    headers = {"X-Request-Id": request_id} if request_id else {}
    start = time.monotonic()
    try:
        resp = (session or requests).get(url, headers=headers, timeout=CALL_TIMEOUT)
        status = resp.status_code
    except requests.RequestException:
        status = 0
    return status, time.monotonic() - start


def at_zero(e: ElasticPlatform, functions: list[str]) -> bool:
    """Every one of FUNCTIONS has 0 replicas asked for and no pod left (not even a leaving one)."""
    replicas = e.all_replicas()
    if any(replicas.get(f, -1) != 0 for f in functions):
        return False
    left = {p["metadata"].get("labels", {}).get("sless.dev/function") for p in e.pods()}
    return not left & set(functions)


def wait_zero(e: ElasticPlatform, functions: list[str]) -> None:
    until(f"{len(functions)} function(s) at zero", lambda: at_zero(e, functions), ZERO_WAIT_SEC, 0.5)


def measure_single(e: ElasticPlatform, runtimes: list[str], n: int) -> dict[str, list[Cold]]:
    """N rounds: both functions at zero, then one cold call and WARM_CALLS warm calls to each in turn."""
    samples: dict[str, list[Cold]] = {r: [] for r in runtimes}
    names = [single_name(r) for r in runtimes]
    for i in range(n):
        wait_zero(e, names)
        for runtime in runtimes:
            fn = single_name(runtime)
            rid = f"bench-cold-{fn}-{i}"
            sent = time.time()
            status, took = call(e.tenant.fn_url(fn), rid)
            cold = Cold(fn, sent, took, status, rid)
            with requests.Session() as session:
                cold.warm = [call(e.tenant.fn_url(fn), session=session)[1] for _ in range(WARM_CALLS)]
            samples[runtime].append(cold)
            log(f"{runtime} sample {i + 1}/{n}: at zero -> {status} in {took * 1000:.0f} ms, "
                f"warm median {median(cold.warm) * 1000:.1f} ms")
    return samples


def deploy_fleet(e: ElasticPlatform, count: int) -> list[str]:
    """COUNT python functions, created and uploaded one after another, then waited for together."""
    names = [f"fleet-{i:02d}" for i in range(count)]
    tenant = e.tenant
    for name in names:
        tenant.api("POST", "/functions", json={"name": name, "runtime": "python3.11", "scale": SCALE}, expect=201)
        tenant.upload(name, HANDLERS["python3.11"])
        tenant.api("POST", "/triggers", json={"name": name, "type": "http", "function": name}, expect=201)
    for name in names:
        tenant.wait_phase(name, ("Ready",), 600)
    return names


def measure_fleet(e: ElasticPlatform, names: list[str]) -> tuple[list[Cold], int]:
    """All NAMES at zero, then one call to each at once (a thread each): the calls answered 200, the failed count."""
    wait_zero(e, names)
    barrier = threading.Barrier(len(names))
    results: dict[str, Cold] = {}

    def one(name: str) -> None:
        url, rid = e.tenant.fn_url(name), f"bench-fleet-{name}"
        barrier.wait()
        sent = time.time()
        status, took = call(url, rid)
        results[name] = Cold(name, sent, took, status, rid)

    threads = [threading.Thread(target=one, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=CALL_TIMEOUT + 30)
    answered = [c for c in results.values() if c.status == 200]
    failed = len(names) - len(answered)
    log(f"{len(names)} at once: " + " ".join(f"{c.took:.2f}" for c in sorted(answered, key=lambda c: c.took))
        + f" s; {failed} failed")  # fmt: skip
    return answered, failed


@dataclass
class Callers:
    """Threads calling URL back to back, each answer kept as (monotonic time, status, pod or error)."""

    url: str
    answers: list[tuple[float, int, str]] = field(default_factory=list)
    threads: list[tuple[threading.Thread, threading.Event]] = field(default_factory=list)

    def add(self, count: int) -> None:
        for _ in range(count):
            stop = threading.Event()
            thread = threading.Thread(target=self._call, args=(stop,), daemon=True)
            thread.start()
            self.threads.append((thread, stop))

    def remove(self, count: int) -> None:
        leaving, self.threads = self.threads[-count:], self.threads[:-count]
        for _, stop in leaving:
            stop.set()
        for thread, _ in leaving:
            thread.join(timeout=CALL_TIMEOUT + 5)

    def _call(self, stop: threading.Event) -> None:
        with requests.Session() as session:
            while not stop.is_set():
                try:
                    resp = session.get(self.url, timeout=CALL_TIMEOUT)
                    who = resp.json().get("pod", "?") if resp.status_code == 200 else resp.text[:200]
                    self.answers.append((time.monotonic(), resp.status_code, str(who)))
                except (requests.RequestException, ValueError) as exc:
                    self.answers.append((time.monotonic(), 0, repr(exc)[:200]))

    def failed(self, since: float) -> list[tuple[float, int, str]]:
        return [a for a in list(self.answers) if a[0] >= since and a[1] != 200]


@dataclass
class Burst:
    to_pods: float | None  # None: not within BURST_SEC
    scale_in: float | None  # seconds from the burst's end until 1 pod again; None: not within SCALE_IN_SEC
    calls: int
    failed: list[tuple[float, int, str]]
    steady_pods: int


def measure_burst(e: ElasticPlatform) -> Burst:
    fn = "burst"
    callers = Callers(e.tenant.fn_url(fn))
    callers.add(1)
    start = time.monotonic()
    try:
        until("1 caller served by 1 ready pod", lambda: len(e.pods(fn, ready_only=True)) == 1 and e.replicas(fn) == 1,
              180, 0.5)  # fmt: skip
        time.sleep(5)  # steady: 1 caller, 1 pod
        steady_pods = len(e.pods(fn, ready_only=True))
        log(f"burst: 1 caller steady on {steady_pods} pod(s); {BURST_CALLERS} callers now")
        burst_start = time.monotonic()
        callers.add(BURST_CALLERS - 1)
        to_pods: float | None = None
        while time.monotonic() - burst_start < BURST_SEC:
            ready = {p["metadata"]["name"] for p in e.pods(fn, ready_only=True)}
            answered = {who for t, status, who in list(callers.answers) if t >= burst_start and status == 200}
            if len(ready) >= BURST_PODS and ready <= answered:
                to_pods = time.monotonic() - burst_start
                break
            time.sleep(0.25)
        took = f"{to_pods:.1f} s" if to_pods is not None else f"more than {BURST_SEC} s"
        log(f"burst: {BURST_PODS} pods ready and answering after {took}; 1 caller again")
        callers.remove(BURST_CALLERS - 1)
        calm = time.monotonic()
        scale_in: float | None = None
        while time.monotonic() - calm < SCALE_IN_SEC:
            if e.replicas(fn) == 1 and len(e.pods(fn)) == 1:
                scale_in = time.monotonic() - calm
                break
            time.sleep(0.5)
        took = f"{scale_in:.1f} s" if scale_in is not None else f"more than {SCALE_IN_SEC} s"
        log(f"burst: back to 1 pod after {took}")
    finally:
        callers.remove(len(callers.threads))
    answers = [a for a in callers.answers if a[0] >= start]
    return Burst(to_pods, scale_in, len(answers), callers.failed(start), steady_pods)


def rfc3339(stamp: str) -> float:
    """Seconds since the epoch of an RFC 3339 time with up to nanoseconds (``kubectl logs --timestamps``)."""
    head, dot, rest = stamp.partition(".")
    if dot:
        digits = "".join(c for c in rest if c.isdigit())
        stamp = f"{head}.{digits[:6]}{rest[len(digits):]}"
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def scaler_heard(e: ElasticPlatform, ns: str, fn: str, after: float) -> float | None:
    """When the scaler logged the function's activity changing (its first waiting call), after AFTER."""
    for line in e.scaler.lines():
        msg = str(line.get("msg", ""))
        if not msg.startswith("activity changed") or ns not in msg or repr(fn) not in msg:
            continue
        at = datetime.fromisoformat(str(line["ts"]).replace("Z", "+00:00")).timestamp()
        if at >= after - 0.002:
            return at
    return None


def breakdown(e: ElasticPlatform, watch: Watch, samples: list[Cold]) -> dict[str, list[float]]:
    """Per cold call: seconds from the call to each moment the watches and the scaler's log saw."""
    ns = e.tenant.ns
    out: dict[str, list[float]] = {}
    records: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + 30  # records are written in batches, a moment after the answer
    while time.monotonic() < deadline and not all(s.request_id in records for s in samples):
        for fn in sorted({s.function for s in samples if s.request_id not in records}):
            items = e.tenant.api("GET", f"/functions/{fn}/invocations?limit=100", expect=200).json()["items"]
            records |= {r["request_id"]: r for r in items if r.get("request_id")}
        time.sleep(0.5)
    for s in samples:
        end = s.sent + s.took
        fn = s.function
        def deployment_up(kind: str, f: list[str], fn: str = fn) -> bool:
            return kind == "deploy" and f[0] == fn and len(f) > 1 and f[1] not in ("", "0")

        def pod_seen(kind: str, f: list[str], fn: str = fn) -> bool:
            return kind == "pod" and len(f) >= 6 and f[1] == fn

        def code_fetched(kind: str, f: list[str]) -> bool:
            return pod_seen(kind, f) and f[4] == "Completed"

        def runtime_started(kind: str, f: list[str]) -> bool:
            return pod_seen(kind, f) and f[5] == "true"

        def pod_ready(kind: str, f: list[str]) -> bool:
            return pod_seen(kind, f) and f[2] == "True"

        moments: dict[str, float | None] = {
            "scaler hears the waiting call": scaler_heard(e, ns, fn, s.sent),
            "Deployment replicas >= 1": watch.first(s.sent, end + 5, deployment_up),
            "pod created": watch.first(s.sent, end + 5, pod_seen),
            "fetch-code (init container) done": watch.first(s.sent, end + 5, code_fetched),
            # the log line's own time: the kubelet reports the container started at its next look (PLEG), which
            # can come after the runtime has fetched its code; the one-function samples only (a log read per pod)
            "the runtime has its code (its fetch's log line)": watch.fetched(fn, s.sent, end + 5),
            "runtime container started": watch.first(s.sent, end + 5, runtime_started),
            "pod ready": watch.first(s.sent, end + 5, pod_ready),
            "answered": end,
        }
        for what, at in moments.items():
            if at is not None:
                out.setdefault(what, []).append(at - s.sent)
        record = records.get(s.request_id)
        if record and (record.get("phases_ms") or {}).get("start") is not None:
            out.setdefault("API record: activation (phases_ms.start)", []).append(record["phases_ms"]["start"] / 1000)
            out.setdefault("API record: cold", []).append(1.0 if record.get("cold") else 0.0)
    return out


def run(args: argparse.Namespace) -> None:
    load_start = os.getloadavg()
    started = time.monotonic()
    with ExitStack() as stack:
        real_node = stack.enter_context(real_node_bed())
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-scale-")))
        e = stack.enter_context(elastic_platform(real_node, work, tenant_prefix="bench-scale"))
        log(f"platform up after {time.monotonic() - started:.0f} s; deploying")
        for runtime in args.runtimes:
            e.deploy(single_name(runtime), runtime, HANDLERS[runtime], scale=SCALE)
        e.deploy("burst", "python3.11", SLEEPY, scale=SCALE)
        watch = Watch(e, follow=tuple(single_name(r) for r in args.runtimes))
        stack.callback(watch.stop)
        single = measure_single(e, list(args.runtimes), args.n)
        phases = {r: breakdown(e, watch, single[r]) for r in args.runtimes}
        log(f"deploying {args.fleet} functions")
        fleet_names = deploy_fleet(e, args.fleet)
        fleet, fleet_failed = measure_fleet(e, fleet_names)
        if fleet:
            phases[f"{args.fleet} at once"] = breakdown(e, watch, fleet)
        burst = measure_burst(e)
        load_end = os.getloadavg()
        report(args, single, fleet, fleet_failed, burst, phases, load_start, load_end)
        if args.dump:
            dump(e, work, Path(args.dump))


def dump(e: ElasticPlatform, work: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    bed = e.real_node.bed
    for what in ("pods", "events", "deployments", "hpa", "scaledobjects.keda.sh"):
        (out / f"{what}.json").write_text(bed.kubectl("get", what, "-n", e.tenant.ns, "-o", "json", check=False).stdout)
    for path in [*work.glob("*.log"), e.keda.operator_log, e.keda.adapter_log]:
        if path is not None and path.exists():
            (out / path.name).write_bytes(path.read_bytes())
    print(f"objects and logs in {out}", file=sys.stderr)


def report(args: argparse.Namespace, single: dict[str, list[Cold]], fleet: list[Cold], fleet_failed: int,
           burst: Burst, phases: dict[str, dict[str, list[float]]], load_start: tuple[float, ...],
           load_end: tuple[float, ...]) -> None:  # fmt: skip
    target = f"<= {TARGET_SEC * 1000:.0f} ms (Knative CI: {KNATIVE_SEC * 1000:.0f})"
    table = Table(f"scale from zero on the real node with KEDA (scale {json.dumps(SCALE)})")
    for runtime, samples in single.items():
        ok = [s.took * 1000 for s in samples if s.status == 200]
        warm = median([w * 1000 for s in samples for w in s.warm])
        failed = len(samples) - len(ok)
        label = f"{runtime}: call at zero -> answer"
        table.add(f"{label}, p50 (n={len(ok)})", median(ok), "ms", warm, "warm call, median")
        p95 = percentile(ok, 95)
        table.add(f"{label}, p95 (n={len(ok)})", p95, "ms", warm, "warm call, median", target, p95 <= TARGET_SEC * 1000)
        if failed:
            table.rows.append((f"{runtime}: calls at zero not answered 200", str(failed), "-", "-", "0", "MISSES"))
    one = [s.took * 1000 for s in single.get("python3.11", []) if s.status == 200]
    base = median(one) if one else None
    fleet_ms = [c.took * 1000 for c in fleet]
    label = f"{args.fleet} python3.11 functions at zero called at once"
    table.add(f"{label}, p50", median(fleet_ms), "ms", base, "one function at zero, p50")
    p95 = percentile(fleet_ms, 95)
    table.add(f"{label}, p95", p95, "ms", base, "one function at zero, p50", target, p95 <= TARGET_SEC * 1000)
    table.rows.append((f"{label}: not answered 200", str(fleet_failed), "-", "-", "0",
                       "meets" if fleet_failed == 0 else "MISSES"))  # fmt: skip
    to_pods = f"{burst.to_pods * 1000:.0f} ms" if burst.to_pods is not None else f"> {BURST_SEC} s"
    table.rows.append((f"burst 1 -> {BURST_CALLERS} callers: until {BURST_PODS} pods ready, each answered",
                       to_pods, f"{base:.0f} ms (one pod from zero, p50)" if base else "-",
                       f"{burst.to_pods * 1000 / base:.1f}x" if base and burst.to_pods is not None else "-",
                       f"<= {BURST_SEC} s", "meets" if burst.to_pods is not None else "MISSES"))  # fmt: skip
    scale_in = f"{burst.scale_in:.1f} s" if burst.scale_in is not None else f"> {SCALE_IN_SEC} s"
    table.rows.append(("burst over, 1 caller: back to 1 pod", scale_in, "-", "-", "-", "-"))
    table.rows.append((f"failed calls, burst and scale-in (of {burst.calls})", str(len(burst.failed)), "-", "-", "0",
                       "meets" if not burst.failed else "MISSES"))  # fmt: skip
    table.print()
    where = Table("where a call at zero's time went: ms after the call was sent (median over the samples)")
    for runtime, moments in phases.items():
        for what, values in moments.items():
            if what == "API record: cold":
                where.rows.append((f"{runtime}: recorded cold", f"{sum(values):.0f} of {len(values)}", "-", "-",
                                   "-", "-"))  # fmt: skip
                continue
            where.add(f"{runtime}: {what} (n={len(values)})", median(values) * 1000, "ms")
            if runtime.endswith("at once"):  # the spread: the last of them
                where.add(f"{runtime}: {what}, the last", max(values) * 1000, "ms")
    where.print()
    print("\nsamples, call at zero -> answer (ms):")
    for runtime, samples in single.items():
        print(f"  {runtime:10} " + " ".join(f"{s.took * 1000:.0f}" + ("" if s.status == 200 else f"[{s.status}]")
                                            for s in samples))  # fmt: skip
    print(f"  {'fleet':10} " + " ".join(f"{t:.0f}" for t in sorted(fleet_ms)))
    if burst.failed:
        print("failed burst calls (first 10): " + "; ".join(f"{status} {why}" for _, status, why in burst.failed[:10]))
    print(f"\nload average {load_start[0]:.1f} at start, {load_end[0]:.1f} at end; {os.cpu_count()} CPUs; "
          f"{time.strftime('%Y-%m-%d %H:%M %Z')}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=8, help="calls at zero per runtime")
    parser.add_argument("--fleet", type=int, default=25, help="functions at zero called at once")
    parser.add_argument("--runtimes", nargs="+", default=list(RUNTIMES), choices=RUNTIMES)
    parser.add_argument("--dump", metavar="DIR", help="keep the tenant's objects, events and the logs in DIR")
    parser.add_argument("--quick", action="store_true", help="--n 3 --fleet 10")
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.fleet = 3, 10
    if not 1 <= args.n <= 50:
        parser.error("--n must be between 1 and 50")
    if not 1 <= args.fleet <= 40:
        parser.error("--fleet must be between 1 and 40 (the tenant quota allows 50 pods)")
    run(args)


if __name__ == "__main__":
    main()
