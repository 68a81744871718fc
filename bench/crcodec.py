"""Custom resource codec benchmark: what decoding through ``sless_core.crcodec`` costs the watchers.

Run: ``.venv/bin/python -m bench.crcodec [--quick] [--count N]`` (no services; CPU only, one process).

Every Function and Trigger watch event, and every relist, goes through the codec (the API's route
table and the event dispatcher's trigger table, the operator's handlers and index). The proxy never
decodes (its lookups are dict reads), but a relist decodes every object of the cluster at once.
Measured on N deterministic objects (Functions with 0-20 environment variables, secrets and code keys;
http, cron and event Triggers), each against a baseline from the same run: ``json.loads`` of the same
objects, the parse every watch event costs before any decoding.

- decode per Function and per Trigger (``FunctionResource.from_cr``, ``TriggerResource.from_cr``);
- a route table relist (``RouteTable.replace``) of N Functions and N Triggers; target: under 2 s for
  5,000 of each, so a relist after a lost watch never holds the table's writers for long.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from bench.common import Table, median
from sless_api.backends.kube.routes import FUNCTIONS, TRIGGERS, RouteTable
from sless_core.crcodec import FunctionResource, TriggerResource

NS = "sless-0123456789abcdef"
ROUNDS = 3


def function_obj(i: int) -> dict[str, Any]:
    name = f"fn-{i}"
    return {"apiVersion": "sless.dev/v1alpha1", "kind": "Function",
            "metadata": {"name": name, "namespace": NS, "uid": f"u-{i}", "generation": 1 + i % 5,
                         "resourceVersion": str(1000 + i), "creationTimestamp": "2026-01-02T03:04:05Z"},
            "spec": {"runtime": ("python3.11", "nodejs20", "go1.23")[i % 3],
                     "entrypoint": "Handle" if i % 3 == 2 else "handler.handle", "memoryMb": 128, "timeoutSec": 30,
                     "envVars": {f"VAR_{k}": "v" * 40 for k in range(i % 21)},
                     "secrets": [{"name": "db", "key": "PASSWORD", "env": "DB_PASSWORD"}] if i % 4 == 0 else [],
                     "codeHash": f"{i:064x}", "codeKey": f"code/{NS}/{name}/1.tar.gz", "codeSha256": f"{i + 1:064x}",
                     "replicas": 1},
            "status": {"phase": "Ready", "image": f"registry/x:{i}", "codeHash": f"{i:064x}", "observedGeneration": 1,
                       "lastBuiltAt": "2026-01-02T03:05:00Z",
                       "conditions": [{"type": "Ready", "status": "True", "reason": "Deployed"}]}}  # fmt: skip


def trigger_obj(i: int) -> dict[str, Any]:
    kind = ("http", "cron", "event")[i % 3]
    spec: dict[str, Any] = {"type": kind, "function": f"fn-{i}", "enabled": True, "auth": "public"}
    if kind == "cron":
        spec["schedule"] = f"{i % 60} {i % 24} * * *"
    if kind == "event":
        spec["queue"] = f"queue.{i}"
    return {"apiVersion": "sless.dev/v1alpha1", "kind": "Trigger",
            "metadata": {"name": f"t-{i}", "namespace": NS, "uid": f"t-{i}", "generation": 1},
            "spec": spec, "status": {"message": "ready"}}  # fmt: skip


def timed(work: Callable[[], object]) -> float:
    """The median of ROUNDS runs of WORK, in seconds."""
    runs = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        work()
        runs.append(time.perf_counter() - start)
    return median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 objects of each kind instead of 5,000")
    parser.add_argument("--count", type=int, default=0, help="objects of each kind (default 5,000; 1,000 --quick)")
    args = parser.parse_args()
    count = args.count or (1000 if args.quick else 5000)
    functions = [function_obj(i) for i in range(count)]
    triggers = [trigger_obj(i) for i in range(count)]
    fn_text, trg_text = [json.dumps(o) for o in functions], [json.dumps(o) for o in triggers]

    table = Table(f"Custom resource codec ({count:,} Functions, {count:,} Triggers; median of {ROUNDS})")
    parse_fn = timed(lambda: [json.loads(t) for t in fn_text])
    decode_fn = timed(lambda: [FunctionResource.from_cr(o) for o in functions])
    table.add("decode one Function", decode_fn / count * 1e6, "us", parse_fn / count * 1e6, "json.loads of it")
    parse_trg = timed(lambda: [json.loads(t) for t in trg_text])
    decode_trg = timed(lambda: [TriggerResource.from_cr(o) for o in triggers])
    table.add("decode one Trigger", decode_trg / count * 1e6, "us", parse_trg / count * 1e6, "json.loads of it")

    def relist() -> None:
        routes = RouteTable()
        routes.replace(FUNCTIONS, functions)
        routes.replace(TRIGGERS, triggers)
        assert len(routes.routes()) == len(range(0, count, 3))  # every http trigger's function routes

    relist_sec = timed(relist)
    target = 2.0 * count / 5000
    table.add("route table relist", relist_sec * 1e3, "ms", (parse_fn + parse_trg) * 1e3, "json.loads of all",
              target=f"< {target * 1e3:.0f} ms", ok=relist_sec < target)  # fmt: skip
    table.print()


if __name__ == "__main__":
    main()
