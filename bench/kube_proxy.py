"""The ``/fn`` data path on Kubernetes: ``sless-api`` (gunicorn, 2 workers) in front of a real pod.

    flock /tmp/sless-realnode.lock .venv/bin/python -m bench.kube_proxy            # 3 rounds of 5 s
    flock /tmp/sless-realnode.lock .venv/bin/python -m bench.kube_proxy --quick    # 2 rounds of 3 s

Root, the real-node packages and warm caches (``scripts/install-realnode.sh``, ``tests/testbed/testbed build
--real-node``). Brings up the real-node test bed, S3 (moto) on its bridge, ``sless-api`` with
``SLESS_WORKERS=2`` (``--workers``) on the kubernetes backend and an operator; deploys a trivial Python function
behind an http trigger; then measures with wrk, in interleaved rounds:

- measured: ``GET /fn/{ns}/{name}`` through ``sless-api`` (the proxy resolves the function's Service and keeps
  pooled connections to it);
- baseline, in the same run: the function's pod called directly on its pod IP (the runtime alone).

Targets (project issue 16): >= 5,000 calls/s at 32 connections, added p50 at 1 connection <= 0.5 ms. The bed is
brought down at the end (also on failure).
"""

from __future__ import annotations

import argparse
import secrets
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import requests

from bench.common import Load, Table, median, wrk
from sless_core import crd
from tests.support.kube_operator import Operator
from tests.support.platform import Tenant
from tests.support.realnode import RealNode, real_node_bed
from tests.support.realnode_operator import api_server, build_namespace, operator_env, s3_server

TRIVIAL = "def handle(event):\n    return 'ok'\n"
FUNCTION = "trivial"
RUNTIME_PORT = 8080
SERVED_WAIT_SEC = 600


def deploy(tenant: Tenant) -> None:
    tenant.api("POST", "/functions", json={"name": FUNCTION, "runtime": "python3.11"}, expect=201)
    tenant.api("POST", "/triggers", json={"name": FUNCTION, "type": "http", "function": FUNCTION}, expect=201)
    tenant.upload(FUNCTION, {"handler.py": TRIVIAL})
    deadline = time.monotonic() + SERVED_WAIT_SEC
    while True:
        try:
            resp = requests.get(tenant.fn_url(FUNCTION), timeout=10)
            if resp.status_code == 200 and resp.text == "ok":
                return
            last = f"{resp.status_code} {resp.text[:200]!r}"
        except requests.RequestException as exc:
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() > deadline:
            raise SystemExit(f"the function was not served within {SERVED_WAIT_SEC}s; /fn last answered {last}")
        time.sleep(0.2)


def pod_url(real_node: RealNode, namespace: str) -> str:
    """The runtime of the function's (one) ready pod, on its pod IP."""
    pods = real_node.bed.get("pods", "-n", namespace, "-l", f"{crd.LABEL_FUNCTION}={FUNCTION}")["items"]
    ready = [p for p in pods if any(c["type"] == "Ready" and c["status"] == "True"
                                    for c in p.get("status", {}).get("conditions", []))]  # fmt: skip
    if not ready:
        raise SystemExit(f"no ready pod of {FUNCTION} in {namespace}")
    return f"http://{ready[0]['status']['podIP']}:{RUNTIME_PORT}/"


def run(args: argparse.Namespace) -> Table:
    table = Table(f"/fn on Kubernetes: sless-api ({args.workers} workers) vs the pod alone, real node, "
                  + time.strftime("%Y-%m-%d %H:%M"))
    with ExitStack() as stack:
        real_node = stack.enter_context(real_node_bed())
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-kube-proxy-")))
        s3 = stack.enter_context(s3_server(real_node, work))
        (work / "api").mkdir()
        url = stack.enter_context(api_server(real_node, s3, work / "api", {"SLESS_KUBE_CODE_FETCH": "true"},
                                             workers=args.workers))  # fmt: skip
        tenant = Tenant(url, f"bench-proxy-{secrets.token_hex(4)}")
        tenant.api("POST", "/ensure", expect=(200, 201))
        (work / "op").mkdir()
        op = Operator(real_node.bed, tenant.ns, build_namespace(real_node), work / "op",
                      extra_env=operator_env(real_node, s3)).start()
        stack.callback(op.stop)
        print("deploying the function...", file=sys.stderr)
        deploy(tenant)
        direct, proxied = pod_url(real_node, tenant.ns), tenant.fn_url(FUNCTION)
        wrk(proxied, 32, 1)  # warm-up: each worker's pool and the Service's conntrack entries
        wrk(direct, 32, 1)
        for conns in (1, 32):
            loads: dict[str, list[Load]] = {"via": [], "direct": []}
            for i in range(args.rounds):
                order = (("via", proxied), ("direct", direct)) if i % 2 == 0 else (("direct", direct), ("via", proxied))
                for name, target in order:
                    print(f"{conns} conn, round {i + 1}: {name}...", file=sys.stderr)
                    loads[name].append(wrk(target, conns, args.seconds))
            add_rows(table, conns, loads["via"], loads["direct"])
    return table


def add_rows(table: Table, conns: int, via: list[Load], direct: list[Load]) -> None:
    def med(loads: list[Load], key: str) -> float:
        return median([float(getattr(load, key)) for load in loads])

    for key, unit, label in (("p50_ms", "ms", "p50"), ("p99_ms", "ms", "p99"), ("rps", "req/s", "req/s")):
        table.add(f"{label} at {conns} conn via /fn", med(via, key), unit, med(direct, key), "pod direct")
    added = med(via, "p50_ms") - med(direct, "p50_ms")
    if conns == 1:
        table.add("added p50 at 1 conn", added, "ms", target="<=0.5 ms", ok=added <= 0.5)
    else:
        rps = med(via, "rps")
        table.add(f"req/s at {conns} conn via /fn (target)", rps, "req/s", target=">=5000 req/s", ok=rps >= 5000)
    errors = sum(load.errors for load in via), sum(load.errors for load in direct)
    if any(errors):
        table.add(f"errors at {conns} conn (via / direct)", errors[0], "", errors[1], "direct")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 3 s instead of 3 of 5 s")
    parser.add_argument("--workers", type=int, default=2, help="sless-api worker processes (default 2)")
    args = parser.parse_args(argv)
    args.rounds, args.seconds = (2, 3) if args.quick else (3, 5)
    print(f"load average at start: {Path('/proc/loadavg').read_text().split()[:3]}", file=sys.stderr)
    run(args).print()


if __name__ == "__main__":
    main()
