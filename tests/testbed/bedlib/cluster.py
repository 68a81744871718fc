"""Bring the test bed up and down: etcd, kube-apiserver, controller-manager, scheduler, kwok.

Every process listens on 127.0.0.1 only, on ports picked at start (other beds or services may
hold 6443/2379); with a real node the apiserver listens on the node's private bridge address
instead, where pods reach it through the `kubernetes` Service. All state (certs, etcd data,
logs, pid files) lives in one folder, so `down` can stop exactly what `up` started and delete
the rest.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import kwokconf, ports, procs, realnode
from .build import build, k8s_version
from .kubectl import Kubectl, established, wait_for
from .pki import FRONT_PROXY_CLIENT, Pki, make_pki, write_kubeconfig

NODE = "kwok-node-0"
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"  # first address of SERVICE_CIDR: the `kubernetes` Service
POD_CIDR = "10.244.0.0/16"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")


def log(message: str) -> None:
    print(f"[testbed {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@contextmanager
def timed(step: str, timings: dict[str, float]) -> Iterator[None]:
    start = time.monotonic()
    yield
    timings[step] = round(time.monotonic() - start, 2)
    log(f"{step}: {timings[step]:.2f}s")


@dataclass
class UpOptions:
    """What `testbed up` may be told; unset ports are picked free."""

    state: Path
    apiserver_port: int | None = None
    etcd_port: int | None = None
    owner_pid: int | None = None
    timeout: float = 180.0
    timings: dict[str, float] = field(default_factory=dict)
    real_node: bool = False  # a real kubelet node (realnode.py) instead of kwok's fake one


def exports(env: dict[str, str]) -> str:
    """Shell lines that put a caller into the test bed (`eval "$(testbed up ...)"`)."""
    lines = [f"export {key}={shlex.quote(value)}" for key, value in env.items() if key != "PATH_PREPEND"]
    if env.get("PATH_PREPEND"):
        lines.append(f'export PATH={shlex.quote(env["PATH_PREPEND"])}:"$PATH"')
    return "\n".join(lines) + "\n"


def save_env(state: Path, env: dict[str, str], extra: dict[str, Any]) -> None:
    (state / "env.json").write_text(json.dumps({"env": env, **extra}, indent=2) + "\n")
    (state / "env.sh").write_text(exports(env))


def load_env(state: Path) -> dict[str, str]:
    try:
        data = json.loads((state / "env.json").read_text())
    except FileNotFoundError:
        raise RuntimeError(f"{state} holds no test bed (no env.json); run `testbed up --state {state}`") from None
    return dict(data["env"])


def existing_mode() -> bool:
    return os.environ.get("SLESS_TESTBED_EXISTING") == "1"


def up_existing(state: Path) -> dict[str, str]:
    """Reuse the cluster in $KUBECONFIG: start nothing, just check that it answers."""
    kubeconfig = os.environ.get("KUBECONFIG")
    if not kubeconfig:
        raise RuntimeError("SLESS_TESTBED_EXISTING=1 needs KUBECONFIG")
    bin_dir = os.environ.get("SLESS_TESTBED_BIN", "")
    kubectl_bin = str(Path(bin_dir) / "kubectl") if bin_dir else (shutil.which("kubectl") or "")
    if not kubectl_bin or not Path(kubectl_bin).exists():
        raise RuntimeError("no kubectl: put it on PATH or set SLESS_TESTBED_BIN")
    kubectl = Kubectl(kubectl_bin, kubeconfig)
    ready = kubectl.run("get", "--raw", "/readyz")
    if ready.returncode != 0 or ready.stdout.strip() != "ok":
        raise RuntimeError(f"the cluster in {kubeconfig} is not ready: {ready.stdout.strip()} {ready.stderr.strip()}")
    version = json.loads(kubectl.check("version", "-o", "json"))["serverVersion"]["gitVersion"]
    log(f"reusing the cluster in {kubeconfig} (server {version})")
    env = {"KUBECONFIG": kubeconfig, "SLESS_TESTBED_STATE": str(state), "SLESS_TESTBED_EXISTING": "1"}
    if bin_dir:
        env |= {"SLESS_TESTBED_BIN": bin_dir, "PATH_PREPEND": bin_dir}
    state.mkdir(parents=True, exist_ok=True)
    save_env(state, env, {"existing": True, "server_version": version})
    return env


def _check_state_free(state: Path) -> None:
    if any(procs.alive(p) for p in procs.recorded(state)):
        raise RuntimeError(f"a test bed already runs in {state}; run `testbed down --state {state}` first")
    if state.exists() and any(state.iterdir()):
        raise RuntimeError(f"{state} is not empty; run `testbed down --state {state}` or choose another folder")


def _https_context(pki: Pki | None) -> ssl.SSLContext:
    if pki is None:  # components' self-signed serving certs: only liveness is checked
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    ctx = ssl.create_default_context(cafile=str(pki.ca_crt))
    ctx.load_cert_chain(str(pki.path("admin.crt")), str(pki.path("admin.key")))
    return ctx


def _get(url: str, ctx: ssl.SSLContext | None = None) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=5) as resp:
            return int(resp.status), resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return 0, ""


def _healthy(url: str, ctx: ssl.SSLContext) -> bool:
    return _get(url, ctx)[0] == 200


def _died(state: Path, started: list[procs.Started]) -> str | None:
    for proc in started:
        if procs.exited_early(proc):
            logfile = state / f"{proc.name}.log"
            return f"{proc.name} exited; last lines of {logfile}:\n{procs.log_tail(state, proc.name)}"
    return None


def _pick_ports(opts: UpOptions) -> dict[str, int]:
    asked = {"apiserver": opts.apiserver_port, "etcd": opts.etcd_port}
    for name, port in asked.items():
        if port is not None and not ports.port_free(port):
            raise RuntimeError(f"--{name}-port {port} is in use on 127.0.0.1")
    taken = {p for p in asked.values() if p is not None}
    free = iter(ports.free_ports(6, taken))
    return {
        "apiserver": opts.apiserver_port or next(free),
        "etcd": opts.etcd_port or next(free),
        "etcd_peer": next(free),
        "controller_manager": next(free),
        "scheduler": next(free),
        "kwok": next(free),
    }


def _argv(bin_dir: Path, state: Path, pki: Pki, port: dict[str, int], apiserver_ip: str) -> dict[str, list[str]]:
    kubeconfig = str(state / "kubeconfig")
    etcd_url = f"http://127.0.0.1:{port['etcd']}"
    peer_url = f"http://127.0.0.1:{port['etcd_peer']}"
    client_auth = [f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}"]
    return {
        "etcd": [
            str(bin_dir / "etcd"), "--name=testbed", f"--data-dir={state / 'etcd-data'}",
            f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=testbed={peer_url}", "--unsafe-no-fsync", "--log-level=warn",
        ],
        "kube-apiserver": [
            str(bin_dir / "kube-apiserver"), f"--etcd-servers={etcd_url}",
            f"--bind-address={apiserver_ip}", f"--advertise-address={apiserver_ip}",
            f"--secure-port={port['apiserver']}",
            f"--tls-cert-file={pki.path('apiserver.crt')}",
            f"--tls-private-key-file={pki.path('apiserver.key')}",
            f"--client-ca-file={pki.ca_crt}", "--authorization-mode=RBAC", "--allow-privileged=true",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}", f"--service-cluster-ip-range={SERVICE_CIDR}",
            # `kubectl logs` goes apiserver -> kwok's kubelet endpoint on the node's InternalIP
            f"--kubelet-certificate-authority={pki.ca_crt}", "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-client-certificate={pki.path('admin.crt')}",
            f"--kubelet-client-key={pki.path('admin.key')}",
            f"--cert-dir={state / 'apiserver-certs'}", "--profiling=false",
            # the aggregation layer (extension API servers such as KEDA's metrics adapter, keda.py): the
            # aggregator proxies as front-proxy-client, the extension servers trust its X-Remote-* headers.
            # Aggregator routing stays off (ClusterIP routing): that resolver also follows an ExternalName
            # Service, `localhost` for a host process; endpoint routing refuses ExternalName and EndpointSlices
            # refuse loopback addresses.
            f"--requestheader-client-ca-file={pki.front_proxy_ca_crt}",
            f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
            "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki.path(FRONT_PROXY_CLIENT + '.crt')}",
            f"--proxy-client-key-file={pki.path(FRONT_PROXY_CLIENT + '.key')}",
        ],
        "kube-controller-manager": [
            str(bin_dir / "kube-controller-manager"), f"--kubeconfig={kubeconfig}", *client_auth,
            "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={port['controller_manager']}",
            f"--cert-dir={state / 'kcm-certs'}", f"--root-ca-file={pki.ca_crt}",
            f"--service-account-private-key-file={pki.sa_key}", f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--kube-api-qps=100", "--kube-api-burst=200", "--profiling=false",
        ],
        "kube-scheduler": [
            str(bin_dir / "kube-scheduler"), f"--kubeconfig={kubeconfig}", *client_auth,
            "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={port['scheduler']}",
            f"--cert-dir={state / 'scheduler-certs'}", "--kube-api-qps=100", "--kube-api-burst=200",
            "--profiling=false",
        ],
        "kwok": [
            str(bin_dir / "kwok"), f"--kubeconfig={kubeconfig}", "--manage-all-nodes=true",
            f"--config={state / 'kwok.yaml'}", f"--enable-crds={kwokconf.ENABLED_CRDS}",
            f"--cidr={POD_CIDR}", "--node-ip=127.0.0.1", f"--node-port={port['kwok']}",
            f"--server-address=127.0.0.1:{port['kwok']}", f"--tls-cert-file={pki.path('kwok.crt')}",
            f"--tls-private-key-file={pki.path('kwok.key')}", "--node-lease-duration-seconds=40",
        ],
    }  # fmt: skip


def _node_ready(kubectl: Kubectl) -> bool:
    node = kubectl.get_json("node", NODE)
    conditions = (node or {}).get("status", {}).get("conditions", [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


PORT_ATTEMPTS = 3


def _port_race(exc: BaseException, opts: UpOptions) -> bool:
    """Whether a start failed only because another program bound a port between its choice and its use."""
    chosen = opts.apiserver_port is None and opts.etcd_port is None
    return chosen and isinstance(exc, RuntimeError) and "address already in use" in str(exc)


def up(opts: UpOptions) -> dict[str, str]:
    """Start the whole control plane in OPTS.state; returns the environment that reaches it."""
    state = opts.state.resolve()
    if existing_mode():
        return up_existing(state)
    t = opts.timings
    total = time.monotonic()
    with timed("build (cache check)", t):
        bin_dir = build()
    _check_state_free(state)
    for attempt in range(1, PORT_ATTEMPTS + 1):
        port = _pick_ports(opts)
        state.mkdir(parents=True, exist_ok=True)
        started: list[procs.Started] = []
        try:
            env = _start(opts, state, bin_dir, port, started)
            break
        except BaseException as exc:
            log(f"start failed; stopping what was started (logs stay in {state} until `testbed down`)")
            if (state / "realnode.json").exists():
                realnode.down(state, None, apiserver_alive=False)
            procs.stop(started)
            if attempt == PORT_ATTEMPTS or not _port_race(exc, opts):
                raise
            log(f"a port it picked was taken meanwhile ({exc}); starting over with other ports")
            shutil.rmtree(state)
    t["up total"] = round(time.monotonic() - total, 2)
    log(f"up in {t['up total']:.1f}s: {json.dumps(t)}")
    return env


def _start(
    opts: UpOptions, state: Path, bin_dir: Path, port: dict[str, int], started: list[procs.Started]
) -> dict[str, str]:
    t = opts.timings
    # With a real node the apiserver serves (and advertises, so the `kubernetes` Service's endpoint
    # is) the bridge address: pods reach it there, in-cluster clients work with their ServiceAccount.
    apiserver_ip = "127.0.0.1"
    realnode_bin = None
    if opts.real_node:
        with timed("node: build check, host setup", t):
            realnode_bin = realnode.prepare(state)
        apiserver_ip = realnode.NODE_IP
    with timed("certs + kubeconfig", t):
        pki = make_pki(state / "pki", SERVICE_IP, (apiserver_ip,) if opts.real_node else ())
        server = f"https://{apiserver_ip}:{port['apiserver']}"
        write_kubeconfig(state / "kubeconfig", pki, server)
        kwokconf.write_config(state)
    argv = _argv(bin_dir, state, pki, port, apiserver_ip)
    kubectl = Kubectl(str(bin_dir / "kubectl"), state / "kubeconfig")
    died = lambda: _died(state, started)  # noqa: E731

    with timed("etcd ready", t):
        started.append(procs.start("etcd", argv["etcd"], state))
        etcd_health = f"http://127.0.0.1:{port['etcd']}/health"
        wait_for("etcd /health", lambda: '"true"' in _get(etcd_health)[1], 60, abort=died)
    with timed("kube-apiserver ready", t):
        started.append(procs.start("kube-apiserver", argv["kube-apiserver"], state))
        ctx = _https_context(pki)
        wait_for(
            "kube-apiserver /readyz",
            lambda: _get(f"{server}/readyz", ctx)[0] == 200,
            opts.timeout,
            abort=died,
        )
    with timed("controller-manager + scheduler healthy", t):
        started.append(procs.start("kube-controller-manager", argv["kube-controller-manager"], state))
        started.append(procs.start("kube-scheduler", argv["kube-scheduler"], state))
        insecure = _https_context(None)
        for name in ("controller_manager", "scheduler"):
            healthy = functools.partial(_healthy, f"https://127.0.0.1:{port[name]}/healthz", insecure)
            wait_for(f"{name} /healthz", healthy, opts.timeout, abort=died)
    node: dict[str, Any] = {"node": NODE}
    if realnode_bin is not None:
        free = ports.free_ports(4, set(port.values()))
        info = realnode.up(state, bin_dir, realnode_bin, kubectl, pki, free, opts.timeout, started, t)
        node = {"node": info.node, "real_node": info.__dict__}
    else:
        _start_kwok(opts, state, bin_dir, kubectl, argv["kwok"], started)
    with timed("default ServiceAccount", t):
        has_sa = lambda: kubectl.get_json("sa", "default", "-n", "default") is not None  # noqa: E731
        wait_for("ServiceAccount default/default", has_sa, opts.timeout, abort=died)
    versions = json.loads(kubectl.check("version", "-o", "json"))
    want = k8s_version(bin_dir)
    got = (versions["clientVersion"]["gitVersion"], versions["serverVersion"]["gitVersion"])
    if got != (want, want):
        raise RuntimeError(f"kubectl/apiserver report {got}, expected {want} for both")

    env = {
        "KUBECONFIG": str(state / "kubeconfig"),
        "SLESS_TESTBED_STATE": str(state),
        "SLESS_TESTBED_BIN": str(bin_dir),
        "PATH_PREPEND": str(bin_dir),
    }
    if opts.real_node:
        env["SLESS_TESTBED_REGISTRY"] = realnode.REGISTRY
    extra = {"existing": False, "server": server, "server_version": got[1], **node, "ports": port,
             "timings": opts.timings}  # fmt: skip
    save_env(state, env, extra)
    if opts.owner_pid:
        _start_watchdog(state, opts.owner_pid)
    return env


def _start_kwok(opts: UpOptions, state: Path, bin_dir: Path, kubectl: Kubectl, argv: list[str],
                started: list[procs.Started]) -> None:  # fmt: skip
    """kwok as the node: its CRDs and stages, then the fake node, Ready."""
    t = opts.timings
    died = lambda: _died(state, started)  # noqa: E731
    with timed("kwok CRDs + stages", t):
        kubectl.apply(kwokconf.crds_manifest(bin_dir))
        wait_for("kwok CRDs Established",
                 lambda: all(established(kubectl.get_json("crd", name))
                             for name in ("stages.kwok.x-k8s.io", "logs.kwok.x-k8s.io")), 90, abort=died)  # fmt: skip
        kubectl.apply(kwokconf.stages_manifest(bin_dir))
    with timed("node Ready", t):
        started.append(procs.start("kwok", argv, state))
        kubectl.apply(json.dumps(kwokconf.fake_node(NODE)))
        wait_for(f"node {NODE} Ready", lambda: _node_ready(kubectl), opts.timeout, abort=died)


def _start_watchdog(state: Path, owner_pid: int) -> None:
    """A detached watcher runs `down` when OWNER_PID dies, so a killed test run leaks nothing."""
    script = Path(__file__).resolve().parent.parent / "testbed"
    argv = [sys.executable, str(script), "watch", "--state", str(state), "--pid", str(owner_pid)]
    watcher = procs.start("watchdog", argv, state)
    (state / "pids" / "watchdog.json").rename(state / "watchdog.json")
    log(f"watchdog pid {watcher.pid} stops the bed when pid {owner_pid} exits")


def down(state: Path, grace: float = 10.0) -> None:
    """Stop every process recorded in STATE (SIGTERM, then SIGKILL after GRACE) and delete STATE."""
    state = state.resolve()
    if not state.exists():
        log(f"{state} does not exist; nothing to stop")
        return
    watchdog = state / "watchdog.json"
    if watchdog.exists():
        data = json.loads(watchdog.read_text())
        if int(data["pid"]) != os.getpid():
            procs.stop([procs.Started("watchdog", int(data["pid"]), data["exe"])], grace=2)
    start = time.monotonic()
    if (state / "realnode.json").exists():
        _down_real_node(state)
    recorded = procs.recorded(state)
    # clients first, then the apiserver, then etcd: an apiserver that loses etcd first shuts down slowly
    last = ("kube-apiserver", "etcd")
    waves = [[p for p in recorded if p.name not in last]]
    waves += [[p for p in recorded if p.name == name] for name in last]
    killed = [name for wave in waves for name in procs.stop(wave, grace=grace)]
    if killed:
        log(f"needed SIGKILL: {', '.join(killed)}")
    still = [p.name for p in recorded if procs.alive(p)]
    if still:
        raise RuntimeError(f"could not stop {', '.join(still)}; {state} kept")
    shutil.rmtree(state, ignore_errors=True)
    log(f"down in {time.monotonic() - start:.1f}s ({len(recorded)} processes)")


def _down_real_node(state: Path) -> None:
    """The real node goes first, while the apiserver can still delete its pods."""
    kubectl = None
    alive = False
    try:
        env = load_env(state)
        kubectl = Kubectl(str(Path(env["SLESS_TESTBED_BIN"]) / "kubectl"), env["KUBECONFIG"])
        alive = kubectl.run("get", "--raw", "/readyz", timeout=10).returncode == 0
    except (RuntimeError, KeyError, OSError, subprocess.TimeoutExpired):
        pass
    realnode.down(state, kubectl, alive)
    (state / "realnode.json").unlink()


def watch(state: Path, owner_pid: int) -> None:
    """Run `down` once OWNER_PID is gone; exit quietly when STATE disappears first."""
    while state.exists():
        try:
            os.kill(owner_pid, 0)
        except ProcessLookupError:
            log(f"owner pid {owner_pid} is gone; stopping the test bed in {state}")
            down(state)
            return
        except PermissionError:
            pass
        time.sleep(1)
