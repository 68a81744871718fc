"""KEDA on the test bed: its operator and its metrics adapter as host processes, as in a cluster.

KEDA scales a Deployment through a ScaledObject: the operator makes the ScaledObject's HPA
(`keda-hpa-<name>`), scales between 0 and 1 itself, and serves its scalers' metrics over gRPC
(mutual TLS); the adapter is the `external.metrics.k8s.io` API server the HPA controller asks,
through the apiserver's aggregator, for more than one replica, and asks the operator in turn.

Here both run out of cluster against the bed's apiserver with its admin kubeconfig (built by
`build-keda.sh`, no container registry needed), recorded in the bed's pid files, so
`testbed down` stops them with the rest. Every port is picked free on 127.0.0.1:

- operator: controller-runtime metrics and health probes (`/readyz`), the gRPC metrics service;
  leader election off, cert rotation off (no webhooks, no patching of the APIService);
- adapter: its secure port (the aggregated API), its own `/metrics` (loopback by build-keda.sh's
  one source change: upstream binds every address), `--metrics-service-address` the operator's
  gRPC port.

Certificates come from the bed's CA (`pki/keda.{crt,key}`, server and client, SANs of KEDA's
Service names and 127.0.0.1): KEDA's cert folder holds them as `tls.crt`/`tls.key` with the bed's
`ca.crt`, as KEDA's own Secret would. The APIService `v1beta1.external.metrics.k8s.io` points at the
Service `keda/keda-metrics-apiserver` of type ExternalName `localhost`: with aggregator routing off
the aggregator dials `<externalName>:<APIService port>` (k8s.io/apiserver's ResolveCluster), a host
process on loopback, and verifies the adapter's cert against the APIService's caBundle for the name
`keda-metrics-apiserver.keda.svc`. (Routing to endpoints refuses ExternalName Services, and
EndpointSlices may not hold loopback addresses.) The apiserver authenticates to the adapter with the
front-proxy client cert (pki.py); the adapter reads the request-header settings from
`kube-system/extension-apiserver-authentication`.

KEDA's namespace is `keda` (`POD_NAMESPACE`, `KEDA_CLUSTER_OBJECT_NAMESPACE`); it watches every
namespace (`WATCH_NAMESPACE=""`). State: `keda.json` in the bed's folder (ports, log paths),
`keda/` (certs, an empty custom-CA folder), logs `keda-operator.log` and `keda-adapter.log`.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from . import ports, procs
from .kubectl import Kubectl, established, wait_for
from .pki import Pki, serving_and_client_leaf

BUILD_SH = Path(__file__).resolve().parent.parent / "build-keda.sh"
NOT_BUILT = 3
NAMESPACE = "keda"
OPERATOR = "keda-operator"
ADAPTER = "keda-adapter"
SERVICE = "keda-metrics-apiserver"  # the Service the APIService names, as in KEDA's manifests
APISERVICE = "v1beta1.external.metrics.k8s.io"
CRDS = (
    "scaledobjects.keda.sh", "scaledjobs.keda.sh", "triggerauthentications.keda.sh",
    "clustertriggerauthentications.keda.sh", "cloudeventsources.eventing.keda.sh",
    "clustercloudeventsources.eventing.keda.sh",
)  # fmt: skip
INFO = "keda.json"


def log(message: str) -> None:
    print(f"[testbed keda {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def build() -> Path:
    """Build (or find in the cache) keda-operator and keda-adapter; returns their folder (CRDs in crds/)."""
    proc = subprocess.run(["bash", str(BUILD_SH)], stdout=subprocess.PIPE, stderr=sys.stderr, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{BUILD_SH} failed with exit code {proc.returncode}")
    folder = Path(proc.stdout.strip().splitlines()[-1])
    missing = [b for b in (OPERATOR, ADAPTER) if not (folder / b).is_file()]
    if missing:
        raise RuntimeError(f"{folder} lacks {', '.join(missing)}")
    return folder


def is_built() -> bool:
    """Whether build-keda.sh would find both binaries in its cache (builds nothing)."""
    proc = subprocess.run(["bash", str(BUILD_SH), "--check"], capture_output=True, text=True, check=False)
    if proc.returncode not in (0, NOT_BUILT):
        raise RuntimeError(f"{BUILD_SH} --check failed: {proc.stderr.strip()}")
    return proc.returncode == 0


def _env_json(state: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((state / "env.json").read_text()))
    except FileNotFoundError:
        raise RuntimeError(f"{state} holds no test bed (no env.json); run `testbed up --state {state}`") from None


def running(state: Path) -> dict[str, Any] | None:
    """KEDA's record in STATE when both its processes still run, else None."""
    try:
        info = dict(json.loads((state / INFO).read_text()))
    except (FileNotFoundError, ValueError):
        return None
    alive = all(procs.alive(p) for p in procs.recorded(state) if p.name in (OPERATOR, ADAPTER))
    names = {p.name for p in procs.recorded(state)}
    return info if alive and {OPERATOR, ADAPTER} <= names else None


def certs(state: Path) -> Path:
    """KEDA's cert folder (ca.crt, tls.crt, tls.key), made once from the bed's CA."""
    folder = state / "keda" / "certs"
    if (folder / "tls.key").exists():
        return folder
    pki = Pki(state / "pki")
    names = (f"{OPERATOR}.{NAMESPACE}.svc", f"{OPERATOR}.{NAMESPACE}.svc.cluster.local",
             f"{SERVICE}.{NAMESPACE}.svc", f"{SERVICE}.{NAMESPACE}.svc.cluster.local", "localhost")  # fmt: skip
    serving_and_client_leaf(pki, "keda", "/O=keda/CN=keda-operator", names, ("127.0.0.1",))
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(pki.ca_crt, folder / "ca.crt")
    shutil.copyfile(pki.path("keda.crt"), folder / "tls.crt")
    shutil.copyfile(pki.path("keda.key"), folder / "tls.key")
    (folder / "tls.key").chmod(0o600)
    return folder


def argv(folder: Path, state: Path, cert_dir: Path, port: dict[str, int]) -> dict[str, list[str]]:
    """The two command lines; the flags are KEDA v2.20's (cmd/operator, cmd/adapter, custom-metrics-apiserver)."""
    kubeconfig = str(state / "kubeconfig")
    logging = ["--zap-log-level=info", "--zap-encoder=console", "--zap-time-encoding=rfc3339"]
    return {
        OPERATOR: [
            str(folder / OPERATOR), f"--kubeconfig={kubeconfig}", "--leader-elect=false",
            f"--metrics-bind-address=127.0.0.1:{port['operator_metrics']}",
            f"--health-probe-bind-address=127.0.0.1:{port['operator_health']}",
            f"--metrics-service-bind-address=127.0.0.1:{port['operator_grpc']}",
            f"--cert-dir={cert_dir}", "--enable-cert-rotation=false",
            "--enable-webhook-patching=false", "--enable-apiservice-patching=false",
            f"--ca-dir={state / 'keda' / 'custom-ca'}", *logging,
        ],
        ADAPTER: [
            str(folder / ADAPTER), f"--kubeconfig={kubeconfig}", f"--lister-kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={port['adapter']}",
            f"--tls-cert-file={cert_dir / 'tls.crt'}", f"--tls-private-key-file={cert_dir / 'tls.key'}",
            f"--cert-dir={cert_dir}", f"--port={port['adapter_metrics']}",
            f"--metrics-service-address=127.0.0.1:{port['operator_grpc']}", *logging,
        ],
    }  # fmt: skip


NAMESPACE_OBJECT = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}


def objects(ca_bundle: str, adapter_port: int) -> list[dict[str, Any]]:
    """The ExternalName Service for the adapter on loopback and the APIService that names it."""
    return [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": SERVICE, "namespace": NAMESPACE,
                                                             "labels": {"app": SERVICE}},
         "spec": {"type": "ExternalName", "externalName": "localhost",
                  "ports": [{"name": "https", "port": adapter_port, "protocol": "TCP"}]}},
        {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": APISERVICE},
         "spec": {"group": "external.metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100,
                  "versionPriority": 100, "caBundle": ca_bundle,
                  "service": {"name": SERVICE, "namespace": NAMESPACE, "port": adapter_port}}},
    ]  # fmt: skip


def _http_status(url: str, ctx: ssl.SSLContext | None = None) -> int:
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return 0


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


def _available(kubectl: Kubectl) -> bool:
    service = kubectl.get_json("apiservice", APISERVICE) or {}
    conditions = (service.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Available" and c.get("status") == "True" for c in conditions)


def _abort(state: Path, started: list[procs.Started]) -> str | None:
    for proc in started:
        if not procs.alive(proc):
            logfile = state / f"{proc.name}.log"
            return f"{proc.name} exited; last lines of {logfile}:\n{procs.log_tail(state, proc.name)}"
    return None


def _start(state: Path, kubectl: Kubectl, commands: dict[str, list[str]], env: dict[str, str],
           port: dict[str, int], cert_dir: Path, timeout: float, started: list[procs.Started],
           timings: dict[str, float]) -> None:  # fmt: skip
    """Operator ready, then the adapter, then its APIService Available; STARTED collects the processes."""
    abort = lambda: _abort(state, started)  # noqa: E731
    mark = time.monotonic()
    started.append(procs.start(OPERATOR, commands[OPERATOR], state, env=env))
    health = f"http://127.0.0.1:{port['operator_health']}/readyz"
    wait_for("keda-operator /readyz", lambda: _http_status(health) == 200, timeout, abort=abort)
    wait_for("keda-operator's gRPC metrics service", lambda: _listening(port["operator_grpc"]), timeout, abort=abort)
    timings["operator ready"] = round(time.monotonic() - mark, 2)

    mark = time.monotonic()
    started.append(procs.start(ADAPTER, commands[ADAPTER], state, env=env))
    ctx = ssl.create_default_context(cafile=str(cert_dir / "ca.crt"))
    readyz = f"https://127.0.0.1:{port['adapter']}/readyz"
    wait_for("keda-adapter /readyz", lambda: _http_status(readyz, ctx) == 200, timeout, abort=abort)
    timings["adapter ready"] = round(time.monotonic() - mark, 2)

    mark = time.monotonic()
    bundle = base64.b64encode((cert_dir / "ca.crt").read_bytes()).decode()
    kubectl.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects(bundle, port["adapter"])}))
    wait_for(f"APIService {APISERVICE} Available", lambda: _available(kubectl), timeout, abort=abort)
    timings["APIService Available"] = round(time.monotonic() - mark, 2)


def up(state: Path, timeout: float = 120.0) -> dict[str, Any]:
    """Start KEDA on the bed in STATE (idempotent: a running KEDA is kept); returns its record (keda.json)."""
    state = state.resolve()
    current = running(state)
    if current:
        log(f"KEDA already runs on {state}")
        return current
    env_json = _env_json(state)
    if env_json.get("existing"):
        raise RuntimeError("the bed reuses an existing cluster (SLESS_TESTBED_EXISTING=1): install KEDA there")
    if any(p.name in (OPERATOR, ADAPTER) for p in procs.recorded(state)):
        raise RuntimeError(f"a KEDA process on {state} exited; see {state}/keda-*.log (`testbed down` and up again)")
    t0 = time.monotonic()
    timings: dict[str, float] = {}
    folder = build()
    timings["build (cache check)"] = round(time.monotonic() - t0, 2)
    env = env_json["env"]
    kubectl = Kubectl(str(Path(env["SLESS_TESTBED_BIN"]) / "kubectl"), env["KUBECONFIG"])
    taken = set(env_json.get("ports", {}).values())
    names = ("operator_metrics", "operator_health", "operator_grpc", "adapter", "adapter_metrics")
    port = dict(zip(names, ports.free_ports(len(names), taken), strict=True))
    cert_dir = certs(state)
    (state / "keda" / "custom-ca").mkdir(exist_ok=True)
    commands = argv(folder, state, cert_dir, port)
    proc_env = os.environ | {"KUBECONFIG": env["KUBECONFIG"], "WATCH_NAMESPACE": "", "POD_NAMESPACE": NAMESPACE,
                             "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE}  # fmt: skip

    mark = time.monotonic()
    kubectl.check("apply", "--server-side", "--force-conflicts", "-f", str(folder / "crds"), timeout=120)
    kubectl.apply(json.dumps(NAMESPACE_OBJECT))
    wait_for("KEDA CRDs Established", lambda: all(established(kubectl.get_json("crd", n)) for n in CRDS), timeout)
    timings["CRDs Established"] = round(time.monotonic() - mark, 2)

    started: list[procs.Started] = []
    try:
        _start(state, kubectl, commands, proc_env, port, cert_dir, timeout, started, timings)
    except BaseException:
        # an APIService whose server is gone fails every discovery (kubectl, the namespace and garbage
        # collectors), so a failed start leaves none behind, nor processes or pid files
        log("KEDA's start failed; removing its APIService and stopping what was started")
        kubectl.run("delete", "apiservice", APISERVICE, "--ignore-not-found", "--wait=false")
        procs.stop(started)
        for proc in started:
            (state / "pids" / f"{proc.name}.json").unlink(missing_ok=True)
        raise
    timings["keda total"] = round(time.monotonic() - t0, 2)

    info = {
        "namespace": NAMESPACE, "bin_dir": str(folder), "ports": port, "cert_dir": str(cert_dir),
        "operator_log": str(state / f"{OPERATOR}.log"), "adapter_log": str(state / f"{ADAPTER}.log"),
        "apiservice": APISERVICE, "service": SERVICE, "timings": timings,
    }  # fmt: skip
    (state / INFO).write_text(json.dumps(info, indent=2) + "\n")
    log(f"KEDA up in {timings['keda total']:.1f}s: {json.dumps(timings)}")
    return info
