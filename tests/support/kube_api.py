"""The API process on the Kubernetes backend, started against the test bed's API server, and the helpers that drive it.

The API runs as its own process (uvicorn, ``SLESS_BACKEND=kubernetes``) and reaches the API server through
:class:`Gate`, a TCP forwarder on loopback that counts the bytes the API sends and can cut the connection.
Used by the tests of tests/k8s, the contract tests' kubernetes backend and the installed platform's Vault tests:
each starts its own API process, so they share how to start one and read what it wrote, not a fixture.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests
import yaml

from sless_api.stores.code import S3CodeStore
from sless_core import crd
from tests.support.kube_operator import Operator
from tests.support.platform import SECRET, Tenant, make_zip
from tests.support.poll import until
from tests.support.quotas import wait_counted
from tests.support.services import S3Endpoint, free_port
from tests.support.testbed import Testbed

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "charts" / "sless" / "crds"
START_TIMEOUT = 60
HELLO = {"handler.py": "def handle(event):\n    return 'hello'\n"}


class Gate:
    """A TCP forwarder between the API process and the API server that counts and can cut traffic."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.open = True
        self.bytes_up = 0  # bytes the API sent to the API server
        self.connections = 0
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            if not self.open:
                conn.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                conn.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self.connections += 1
                self._socks |= {conn, upstream}
            threading.Thread(target=self._pump, args=(conn, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, conn, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, up: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if up:
                    with self._lock:
                        self.bytes_up += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                self._drop(sock)

    def _drop(self, sock: socket.socket) -> None:
        with self._lock:
            self._socks.discard(sock)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()

    def cut(self) -> None:
        """Refuse new connections and break every open one (the API server 'goes away')."""
        self.open = False
        with self._lock:
            socks = list(self._socks)
        for sock in socks:
            self._drop(sock)

    def restore(self) -> None:
        self.open = True

    def close(self) -> None:
        self._closed = True
        self.cut()
        self.listener.close()


def gated_kubeconfig(source: Path, dest: Path) -> tuple[Path, tuple[str, int]]:
    """A copy of SOURCE (a kubeconfig) with absolute paths, and the address of its current server."""
    config = yaml.safe_load(source.read_text())
    current = next(c for c in config["contexts"] if c["name"] == config["current-context"])["context"]["cluster"]
    cluster = next(c for c in config["clusters"] if c["name"] == current)["cluster"]
    url = urlsplit(cluster["server"])
    target = (url.hostname or "127.0.0.1", url.port or 443)
    entries = [(e["cluster"], "certificate-authority") for e in config.get("clusters") or []]
    entries += [(e["user"], k) for e in config.get("users") or [] for k in ("client-certificate", "client-key")]
    for section, key in entries:
        if key in section and not os.path.isabs(section[key]):
            section[key] = str(source.parent / section[key])
    dest.write_text(json.dumps(config))
    return dest, target


def point_at(kubeconfig: Path, gate: Gate) -> None:
    config = json.loads(kubeconfig.read_text())
    for entry in config["clusters"]:
        host = urlsplit(entry["cluster"]["server"]).hostname or ""
        if not host.replace(".", "").isdigit():
            entry["cluster"]["tls-server-name"] = host  # the gate's 127.0.0.1 is not in a real cluster's cert
        entry["cluster"]["server"] = f"https://127.0.0.1:{gate.port}"
    kubeconfig.write_text(json.dumps(config))


@dataclass
class KubeApi:
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    gate: Gate
    bed: Testbed
    s3: S3Endpoint

    def tenant(self, label: str = "t") -> Tenant:
        return Tenant(self.url, f"{label}-{uuid.uuid4()}")

    def store(self) -> S3CodeStore:
        return S3CodeStore(self.s3.endpoint, self.s3.access_key, self.s3.secret_key, self.s3.bucket)

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> bool:
        """SIGTERM; True when the API shut down cleanly (uvicorn re-raises the signal after its shutdown)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        clean = "Application shutdown complete" in self.log_tail(20)
        return clean and self.proc.returncode in (0, -signal.SIGTERM)


def apply_crds(bed: Testbed) -> None:
    """The chart's CRDs, Established and counted by the tenant quota (before the API watches them)."""
    bed.kubectl("apply", "-f", str(CRDS))
    bed.wait_established(*[f"{p}.{crd.GROUP}" for p in (crd.FUNCTION_PLURAL, crd.TRIGGER_PLURAL, crd.JOB_PLURAL)])
    wait_counted(bed)  # the tenant quota counts them


def start_api(bed: Testbed, s3: S3Endpoint, work: Path, extra_env: dict[str, str] | None = None,
              kubeconfig: Path | None = None, gate_open: bool = True) -> KubeApi:
    """The API process on a free loopback port, reaching the API server (as KUBECONFIG says) through a gate
    (closed from the start when not GATE_OPEN: the API server is away when the API starts)."""
    apply_crds(bed)
    work.mkdir(parents=True, exist_ok=True)
    kubeconfig, target = gated_kubeconfig(kubeconfig or bed.kubeconfig, work / "kubeconfig")
    gate = Gate(target)
    if not gate_open:
        gate.cut()
    point_at(kubeconfig, gate)
    port = free_port()
    env = {**bed.env, **s3.env(), "KUBECONFIG": str(kubeconfig), "SLESS_BACKEND": "kubernetes",
           "SLESS_JWT_SECRET": SECRET, "SLESS_DATA_DIR": str(work / "data"), "SLESS_MAX_TIMEOUT_SEC": "7200",
           "SLESS_KUBE_WATCH_TIMEOUT_SEC": "60", "SLESS_KUBE_REQUEST_TIMEOUT_SEC": "10", **(extra_env or {})}
    env.pop("SLESS_DATABASE_URL", None)
    if "SLESS_RABBITMQ_URL" not in (extra_env or {}):
        env.pop("SLESS_RABBITMQ_URL", None)
    log_path = work / "api.log"
    with log_path.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--factory", "sless_api.main.app:create_app", "--host", "127.0.0.1",
             "--port", str(port), "--log-level", "info"],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)
    api = KubeApi(f"http://127.0.0.1:{port}", proc, log_path, gate, bed, s3)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            gate.close()
            raise RuntimeError(f"the API exited with {proc.returncode}:\n{api.log_tail()}")
        try:
            if requests.get(api.url + "/health", timeout=1).status_code == 200:
                return api
        except requests.RequestException:
            pass
        time.sleep(0.1)
    api.stop()
    gate.close()
    raise RuntimeError(f"the API did not answer /health within {START_TIMEOUT}s:\n{api.log_tail()}")


def cr(bed: Testbed, plural: str, ns: str, name: str) -> dict[str, Any] | None:
    """The custom resource as the API server has it (None: gone)."""
    result: dict[str, Any] | None = bed.get(f"{plural}.{crd.GROUP}", name, "-n", ns)
    return result


def set_status(bed: Testbed, plural: str, ns: str, name: str, status: dict[str, Any]) -> None:
    """What the operator does: a merge patch of the status subresource."""
    bed.kubectl("patch", f"{plural}.{crd.GROUP}", name, "-n", ns, "--subresource=status", "--type=merge",
                "-p", json.dumps({"status": status}))


def zip_hash(files: dict[str, str | bytes]) -> tuple[bytes, str]:
    """A zip of FILES and its sha256, the code hash the API derives from an upload."""
    data = make_zip(files)
    return data, hashlib.sha256(data).hexdigest()


def upload_raw(t: Tenant, name: str, data: bytes) -> requests.Response:
    """POST DATA as NAME's code, whatever it holds (the caller checks the answer)."""
    return t.api("POST", f"/functions/{name}/upload", files={"code": ("code.zip", data, "application/zip")})


# the invoke proxy: routes from watches (no cluster DNS here, so a routable function answers 502)

READY = {"phase": "Ready", "message": "ready", "image": "registry.local/sless/fn:1"}


def invoke(t: Tenant, name: str, token: str | None = None, **kw: Any) -> requests.Response:
    """GET /fn/<NAME>/x?y=1 as a client would (with TOKEN as bearer for token triggers)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return requests.get(t.fn_url(name, "/x?y=1"), headers=headers, timeout=30, **kw)


def seconds_until(what: str, probe: Callable[[], bool], timeout: float = 20.0) -> float:
    """Seconds until PROBE holds (the route table's latency, which tests report); fail after TIMEOUT (generous:
    a shared, noisy machine) with the probe's last answer (:class:`status_is` keeps it)."""
    started = time.monotonic()
    try:
        until(what, probe, timeout, interval=0.05)
    except AssertionError as exc:
        raise AssertionError(f"{exc} (last: {getattr(probe, 'last', None)})") from None
    return time.monotonic() - started


class status_is:  # a predicate, named like one
    """A probe: the function answers CODE with TEXT in the body; remembers the last answer for the failure."""

    def __init__(self, t: Tenant, name: str, code: int, text: str = "") -> None:
        self.t, self.name, self.code, self.text = t, name, code, text
        self.last = ""

    def __call__(self) -> bool:
        resp = invoke(self.t, self.name)
        self.last = f"{resp.status_code} {resp.text[:200]}"
        return resp.status_code == self.code and self.text in resp.text


# a call's output, read from the function's pods' logs (kwok serves what Testbed.set_pod_logs set)

RESTRICTED = {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def function_pod(bed: Testbed, ns: str, function: str, pod: str, lines: list[str]) -> None:
    """A pod like the operator's (labels, container name) whose log holds LINES."""
    bed.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": pod, "namespace": ns,
        "labels": {crd.LABEL_FUNCTION: function, crd.LABEL_COMPONENT: "function"}},
        "spec": {"securityContext": RESTRICTED, "containers": [
            {"name": "function", "image": "registry.local/sless/fn:1", "securityContext": CONTAINER_SECURITY}]}})
    bed.set_pod_logs(ns, pod, lines, container="function")


def routable(api: KubeApi, t: Tenant, name: str) -> None:
    """NAME with an http trigger and a Ready status, once the API routes it (answers 502: no cluster DNS)."""
    t.api("POST", "/functions", json={"name": name, "runtime": "python3.11", "timeout_sec": 5}, expect=201)
    t.api("POST", "/triggers", json={"name": name, "type": "http", "function": name}, expect=201)
    set_status(api.bed, crd.FUNCTION_PLURAL, t.ns, name, READY)
    seconds_until("route appears", status_is(t, name, 502), timeout=30)


def call(t: Tenant, name: str, request_id: str) -> None:
    """One call to NAME with REQUEST_ID, recorded although it answers 502 (no cluster DNS here)."""
    resp = requests.get(t.fn_url(name), headers={"X-Request-Id": request_id}, timeout=30)
    assert resp.status_code == 502, resp.text  # no cluster DNS here: recorded all the same


def logs_of(t: Tenant, name: str, ident: str, expect: int = 200) -> Any:
    """The call IDENT's log lines through the API, waiting out the batched record (or EXPECT 404)."""
    deadline = time.monotonic() + 30
    while True:  # the record is written in batches
        resp = t.api("GET", f"/functions/{name}/invocations/{ident}/logs")
        if resp.status_code != 404 or expect == 404 or time.monotonic() > deadline:
            assert resp.status_code == expect, resp.text
            return resp.json()
        time.sleep(0.2)


# with a real operator

def wait_api(op: Operator, what: str, t: Tenant, rest: str, check: object, timeout: float = 120) -> dict:
    """Poll GET REST through the API until CHECK(body) holds; the operator's log on failure."""
    last: dict = {}

    def probe() -> bool:
        nonlocal last
        last = t.api("GET", rest, expect=200).json()
        return bool(check(last))  # type: ignore[operator]

    try:
        op.wait(what, probe, timeout)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nlast API answer: {last}") from None
    return last
