"""Cost of the function sandbox: cold start and warm latency with bubblewrap vs without.

Run: ``.venv/bin/python -m bench.sandbox [--quick] [--baseline none|host-network]`` (needs wrk, bwrap, pasta,
Node 20 and Go; as root the sandbox also drops to a per-tenant uid, makes cgroups and gives each function a
network namespace of its own, as `sless up` does there).

Two `sless up` processes run side by side, one with ``SLESS_SANDBOX=bwrap`` and one as the baseline:
``SLESS_SANDBOX=off`` (``--baseline none``, the default: the whole sandbox's cost) or the same sandbox with
``SLESS_SANDBOX_NETWORK=host`` (``--baseline host-network``: what the functions' own network namespaces
cost), each serving the same trivial function in python3.11, nodejs20 and go1.23. Measured per runtime,
alternating between the two platforms so load falls on both alike:

- cold start: the first call after the function's process was stopped (its http trigger disabled and
  enabled again), through the proxy, median over the rounds; target <= 150 ms sandboxed;
- warm p50 and p99 at 1 keep-alive connection (wrk), and req/s at 32 connections; target: sandboxed p50
  within 10 % of the unsandboxed one.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import requests

from bench.common import Table, median, wrk
from tests.support.platform import SlessProcess, Tenant, start_sless

FUNCTIONS: dict[str, dict[str, str | bytes]] = {
    "python3.11": {"handler.py": "def handle(event):\n    return 'ok'\n"},
    "nodejs20": {"handler.js": "exports.handle = async (event) => 'ok';\n"},
    "go1.23": {"main.go": "package function\n\nimport \"context\"\n\n"
                          "func Handle(ctx context.Context, event map[string]any) (any, error) {\n"
                          "\treturn \"ok\", nil\n}\n"},
}
NAMES = {"python3.11": "py", "nodejs20": "node", "go1.23": "go"}
#: The baseline platform's environment and name, per --baseline.
BASELINES: dict[str, tuple[dict[str, str], str]] = {
    "none": ({"SLESS_SANDBOX": "off"}, "no sandbox"),
    "host-network": ({"SLESS_SANDBOX": "bwrap", "SLESS_SANDBOX_NETWORK": "host"}, "host network"),
}


def cold_start(tenant: Tenant, name: str, settle_sec: float = 0.0) -> float:
    """Seconds of the first call after the process was stopped (trigger off and on again, then ``settle_sec``
    for the platform's background work, such as a replacement warm spare, to finish first)."""
    tenant.api("PATCH", f"/triggers/{name}", json={"enabled": False}, expect=200)
    tenant.api("PATCH", f"/triggers/{name}", json={"enabled": True}, expect=200)
    time.sleep(settle_sec)
    started = time.perf_counter()
    resp = requests.get(tenant.fn_url(name), timeout=30)
    elapsed = time.perf_counter() - started
    if resp.status_code != 200:
        raise SystemExit(f"{name}: cold call failed: {resp.status_code} {resp.text[:300]}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="shorter loads (2 s) and fewer rounds")
    parser.add_argument("--baseline", choices=sorted(BASELINES), default="none",
                        help="the other platform: no sandbox (default), or the sandbox on the host's network")
    args = parser.parse_args()
    seconds, rounds = (2, 5) if args.quick else (5, 11)
    base_env, base = BASELINES[args.baseline]
    uid = "per-tenant uid, cgroups" if os.geteuid() == 0 else "user namespace"
    table = Table(f"function sandbox (bwrap, {uid}) vs {base}, loopback, " + time.strftime("%Y-%m-%d %H:%M"))
    with tempfile.TemporaryDirectory(prefix="sless-bench-sandbox-") as tmp:
        platforms: dict[str, SlessProcess] = {}
        try:
            for mode, env in (("bwrap", {"SLESS_SANDBOX": "bwrap"}), ("off", base_env)):
                platforms[mode] = start_sless(Path(tmp) / mode, env)
            tenants = {mode: Tenant(sp.url, "bench-sandbox") for mode, sp in platforms.items()}
            for runtime, files in FUNCTIONS.items():
                name = NAMES[runtime]
                print(f"{runtime}: deploying on both platforms...", file=sys.stderr)
                for tenant in tenants.values():
                    tenant.deploy(name, runtime, files)
                    requests.get(tenant.fn_url(name), timeout=30)
                print(f"{runtime}: {rounds} cold starts each...", file=sys.stderr)
                cold: dict[str, list[float]] = {"bwrap": [], "off": []}
                for _ in range(rounds):
                    for mode, tenant in tenants.items():
                        cold[mode].append(cold_start(tenant, name))
                sandboxed, plain = median(cold["bwrap"]) * 1000, median(cold["off"]) * 1000
                table.add(f"{runtime} cold start (median of {rounds})", sandboxed, "ms", plain, base,
                          "<=150 ms", sandboxed <= 150)
                print(f"{runtime}: warm load...", file=sys.stderr)
                for tenant in tenants.values():
                    requests.get(tenant.fn_url(name), timeout=30)
                    wrk(tenant.fn_url(name), 1, 1)  # warm-up
                warm = {mode: wrk(tenant.fn_url(name), 1, seconds) for mode, tenant in tenants.items()}
                busy = {mode: wrk(tenant.fn_url(name), 32, seconds) for mode, tenant in tenants.items()}
                ratio = warm["bwrap"].p50_ms / warm["off"].p50_ms
                table.add(f"{runtime} warm p50 at 1 conn", warm["bwrap"].p50_ms, "ms", warm["off"].p50_ms,
                          base, "ratio <=1.10", ratio <= 1.10)
                table.add(f"{runtime} warm p99 at 1 conn", warm["bwrap"].p99_ms, "ms", warm["off"].p99_ms,
                          base)
                table.add(f"{runtime} req/s at 32 conn", busy["bwrap"].rps, "req/s", busy["off"].rps, base)
                errors = {mode: warm[mode].errors + busy[mode].errors for mode in tenants}
                if any(errors.values()):
                    table.add(f"{runtime} errors under load (non-2xx, socket)", errors["bwrap"], "",
                              errors["off"], base)
        finally:
            for sp in platforms.values():
                sp.stop()
    table.print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
