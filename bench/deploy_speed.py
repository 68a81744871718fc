"""Deploy speed on Kubernetes (the real node): upload of a code-only change -> first 200 with the new code.

    flock /tmp/sless-realnode.lock .venv/bin/python -m bench.deploy_speed [--n 10] [--baseline-n 3] [--go-n 3]
    flock /tmp/sless-realnode.lock .venv/bin/python -m bench.deploy_speed --quick

Root, the real-node packages and warm caches (``scripts/install-realnode.sh``, ``tests/testbed/testbed build
--real-node``). Brings up the real-node test bed, S3 (moto) on its bridge, two API processes and two operators:

- measured: the platform as it is (``SLESS_KUBE_CODE_FETCH=true``: Python and Node pods fetch their code at
  start, a code-only change is a rollout; Go code compiles in a Job of the tenant namespace on the Go runtime
  image and the pods fetch the binary, no image build);
- baseline, in the same run: kaniko per change (``SLESS_KUBE_CODE_FETCH=false``, ``SLESS_BUILD_CACHE=false``),
  how every deploy went before.

For each runtime one function with an http trigger is deployed on each side, then changed N times (code only:
the handler returns a new number); each sample is the time from the upload request until ``GET /fn/...``
answers 200 with the new number. Medians per runtime and side; targets: <= 5 s for Python and Node, <= 15 s
for Go. The bed is brought down at the end (also on failure).
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import requests

from bench.common import Table, median
from tests.support.kube_operator import Operator
from tests.support.platform import Tenant
from tests.support.realnode import RealNode, real_node_bed
from tests.support.realnode_operator import api_server, build_namespace, operator_env, s3_server

RUNTIMES = ("python3.11", "nodejs20", "go1.23")
TARGET_SEC = {"python3.11": 5.0, "nodejs20": 5.0, "go1.23": 15.0}
WAIT_SEC = 600


def handler(runtime: str, number: int) -> dict[str, str | bytes]:
    """A handler answering ``{"n": NUMBER}``: each change is code only (no dependency manifest)."""
    if runtime == "python3.11":
        return {"handler.py": f"def handle(event):\n    return {{'n': {number}}}\n"}
    if runtime == "nodejs20":
        return {"handler.js": f"exports.handle = async () => ({{ n: {number} }});\n"}
    return {"handler.go": 'package function\n\nimport "context"\n\n'
            "func Handle(ctx context.Context, event map[string]any) (any, error) {\n"
            f'\treturn map[string]any{{"n": {number}}}, nil\n}}\n'}  # fmt: skip


@dataclass
class Side:
    """One API + operator + tenant: the measured platform or the baseline."""

    name: str
    tenant: Tenant
    op: Operator
    samples: dict[str, list[float]] = field(default_factory=dict)
    first_deploy: dict[str, float] = field(default_factory=dict)  # runtime -> create + upload -> first 200


def _last_answer(tenant: Tenant, function: str) -> tuple[int, str]:
    """What ``/fn`` answers now (status and the start of the body), so a timeout says why it was not served."""
    try:
        resp = requests.get(tenant.fn_url(function), timeout=10)
    except requests.RequestException as exc:
        return 0, f"{type(exc).__name__}: {exc}"
    return resp.status_code, resp.text[:300]


def _serves(answer: tuple[int, str], number: int) -> bool:
    status, body = answer
    try:
        return status == 200 and json.loads(body) == {"n": number}
    except ValueError:
        return False


def _until_served(side: Side, function: str, number: int) -> float:
    start = time.monotonic()
    side.tenant.upload(function, handler(function_runtime(function), number))
    deadline = start + WAIT_SEC
    while not _serves(answer := _last_answer(side.tenant, function), number):
        body = side.tenant.api("GET", f"/functions/{function}", expect=200).json()
        if body["phase"] == "Failed" and body["code_hash"]:
            raise RuntimeError(f"{side.name} {function}: {body['message'][-2000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{side.name} {function}: n={number} not served within {WAIT_SEC}s; "
                               f"/fn last answered {answer[0]} {answer[1]!r}; the function: {body}")
        time.sleep(0.1)
    return time.monotonic() - start


def function_runtime(function: str) -> str:
    return {"py": "python3.11", "node": "nodejs20", "go": "go1.23"}[function]


def function_name(runtime: str) -> str:
    return {"python3.11": "py", "nodejs20": "node", "go1.23": "go"}[runtime]


def deploy(side: Side, runtime: str) -> None:
    function = function_name(runtime)
    side.tenant.api("POST", "/functions", json={"name": function, "runtime": runtime}, expect=201)
    side.tenant.api("POST", "/triggers", json={"name": function, "type": "http", "function": function}, expect=201)
    took = _until_served(side, function, 0)
    side.first_deploy[runtime] = took
    print(f"{side.name}: {runtime} first deploy served in {took:.1f}s", file=sys.stderr)


def measure(side: Side, runtime: str, count: int, start_at: int) -> None:
    function = function_name(runtime)
    for i in range(count):
        took = _until_served(side, function, start_at + i)
        side.samples.setdefault(runtime, []).append(took)
        print(f"{side.name}: {runtime} change {i + 1}/{count}: {took:.2f}s", file=sys.stderr)


def start_side(stack: ExitStack, real_node: RealNode, s3: str, work: Path, name: str, fetch: bool) -> Side:
    api_work = work / f"api-{name}"
    api_work.mkdir(parents=True, exist_ok=True)
    url = stack.enter_context(api_server(real_node, s3, api_work, {"SLESS_KUBE_CODE_FETCH": str(fetch).lower()}))
    tenant = Tenant(url, f"bench-{name}-{secrets.token_hex(4)}")
    tenant.api("POST", "/ensure", expect=(200, 201))
    env = operator_env(real_node, s3) | {"SLESS_BUILD_CACHE": "true" if fetch else "false"}
    (work / f"op-{name}").mkdir(parents=True, exist_ok=True)
    op = Operator(real_node.bed, tenant.ns, build_namespace(real_node), work / f"op-{name}", extra_env=env).start()
    stack.callback(op.stop)
    return Side(name, tenant, op)


def run(args: argparse.Namespace) -> None:
    runtimes = [r for r in RUNTIMES if r in args.runtimes]
    with ExitStack() as stack:
        real_node = stack.enter_context(real_node_bed())
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-deploy-")))
        s3 = stack.enter_context(s3_server(real_node, work))
        fast = start_side(stack, real_node, s3, work, "fetch", fetch=True)
        base = start_side(stack, real_node, s3, work, "kaniko", fetch=False)
        failures: list[str] = []
        try:
            for runtime in runtimes:
                n = args.go_n if runtime == "go1.23" else args.n
                for side, count in ((fast, n), (base, args.baseline_n)):
                    try:
                        deploy(side, runtime)
                        measure(side, runtime, count, 1)
                    except RuntimeError as exc:  # one runtime's failure must not hide the others' figures
                        failures.append(str(exc))
                        print(f"FAILED: {exc}", file=sys.stderr)
        finally:
            if args.dump:
                dump(real_node, [fast, base], Path(args.dump))
        report(runtimes, fast, base)
        if failures:
            print("\nnot measured:\n" + "\n".join(f"  {line}" for line in failures))
            raise SystemExit(1)


def dump(real_node: RealNode, sides: list[Side], out: Path) -> None:
    """Each side's pods (JSON: scheduling and container start/finish times) and its build pods' logs with
    timestamps, so where a deploy's seconds went can be read afterwards."""
    out.mkdir(parents=True, exist_ok=True)
    bed = real_node.bed
    for side in sides:
        for ns in (side.tenant.ns, side.op.build_namespace):
            pods = bed.kubectl("get", "pods", "-n", ns, "-o", "json", check=False).stdout
            (out / f"{side.name}-{ns}-pods.json").write_text(pods)
            events = bed.kubectl("get", "events", "-n", ns, "-o", "json", check=False).stdout
            (out / f"{side.name}-{ns}-events.json").write_text(events)
            for name in bed.kubectl("get", "pods", "-n", ns, "-o", "name", check=False).stdout.split():
                logs = bed.kubectl("logs", "-n", ns, name, "--all-containers", "--timestamps", check=False)
                (out / f"{side.name}-{ns}-{name.split('/')[-1]}.log").write_text(logs.stdout + logs.stderr)
        (out / f"{side.name}-operator.log").write_bytes(side.op.log_path.read_bytes())
    print(f"pods, events and logs in {out}", file=sys.stderr)


def report(runtimes: list[str], fast: Side, base: Side) -> None:
    table = Table("code-only change on the real node: upload -> first 200 with the new code (median)")
    for runtime in runtimes:
        measured, kaniko = fast.samples.get(runtime, []), base.samples.get(runtime, [])
        if not measured:
            continue
        value, target = median(measured), TARGET_SEC[runtime]
        table.add(f"{runtime} (n={len(measured)}, baseline n={len(kaniko)})", value, "s", median(kaniko),
                  "kaniko per change", f"<= {target:g} s", value <= target)  # fmt: skip
    table.print()
    first = Table("first deploy on the real node: upload -> first 200 (one sample each; context)")
    for runtime in runtimes:
        if runtime in fast.first_deploy:
            how = "compile Job, binary fetched" if runtime == "go1.23" else "no build: the runtime base image"
            first.add(f"{runtime} ({how})", fast.first_deploy[runtime], "s", base.first_deploy.get(runtime),
                      "kaniko, no cache")
    first.print()
    print("\nsamples (s):")
    for side in (fast, base):
        for runtime in runtimes:
            print(f"  {side.name:7} {runtime:10} " + " ".join(f"{v:.2f}" for v in side.samples.get(runtime, [])))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=10, help="code-only changes per interpreted runtime (measured)")
    parser.add_argument("--go-n", type=int, default=3, help="code-only changes of the Go function (measured)")
    parser.add_argument("--baseline-n", type=int, default=3, help="changes per runtime on the kaniko baseline")
    parser.add_argument("--runtimes", nargs="+", default=list(RUNTIMES), choices=RUNTIMES)
    parser.add_argument("--dump", metavar="DIR", help="keep every pod's timeline and the build logs in DIR")
    parser.add_argument("--quick", action="store_true", help="--n 5 --go-n 2 --baseline-n 2")
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.go_n, args.baseline_n = 5, 2, 2
    for name in ("n", "go_n", "baseline_n"):
        if not 1 <= getattr(args, name) <= 50:
            parser.error(f"--{name.replace('_', '-')} must be between 1 and 50")
    run(args)


if __name__ == "__main__":
    main()
