"""A real node for the test bed: containerd + runc, kubelet, kube-proxy, CNI, CoreDNS, a registry.

kwok fakes pods; this runs them. Everything the node exposes listens on a private bridge
(``slessbr0``, 10.199.0.1/24, the pods' gateway) or on loopback: the registry and CoreDNS bind
the bridge IP so pods reach them, the kubelet serves the apiserver there too. kube-proxy
(iptables) serves ClusterIPs, with NodePorts limited to the bridge IP so no rule ever matches
loopback traffic of other programs. State lives in the bed's folder; images (containerd's
content store, the registry's storage, buildah's storage) live in the cache, so a warm `up`
pulls nothing from the network.

Settings come from what this machine kind needs (see the repository's notes on a real node):
runc only (crun refuses hybrid cgroups), containerd with ``restrict_oom_score_adj`` (the VM
cannot lower oom_score_adj), cgroupfs with cgroup v1 allowed, swap allowed.

`down` removes what `up` made on the host: pods are deleted through the API first (so the kubelet
tears their networking down through CNI), then the processes stop, and a sweep removes what a
crash could leave: processes in the node's cgroups, containerd shims, kube-proxy's and CNI's
iptables rules, mounts, network namespaces, cgroups, the bridge and its veths, sysctls.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import gvisor, images, netpol, procs
from .kubectl import Kubectl, wait_for
from .pki import Pki, _leaf

BUILD_SH = Path(__file__).resolve().parent.parent / "build-realnode.sh"
NOT_BUILT = 3
BINARIES = ("coredns", "registry", "executor", "pause")
NODE = "sless-node-0"
BRIDGE = "slessbr0"
BRIDGE_MAC = "02:53:4c:45:53:01"  # locally administered
NETWORK = "sless-testbed"  # the CNI network name: its iptables comments carry it
SUBNET = "10.199.0.0/24"
NODE_IP = "10.199.0.1"
REGISTRY = f"{NODE_IP}:5000"
DNS_SERVICE_IP = "10.96.0.10"
KUBELET_PORT = 20250
CGROUP_ROOT = "sless-testbed"
CNI_BIN = "/usr/lib/cni"
CONTAINERD_ROOT = images.CACHE / "containerd-root"  # content store and snapshots survive `down`
#: inotify limits the node raises (to at least these) while it runs: containerd's CRI plugin watches the CNI
#: config with one, and the kubelet, the control planes of other test beds and the tests' own processes hold
#: more; with Linux's default of 128 instances per user a busy machine ran out, and containerd started without
#: its CRI plugin ("failed to create fsnotify watcher: too many open files").
INOTIFY_MINIMUMS = {"fs/inotify/max_user_instances": 8192, "fs/inotify/max_user_watches": 524288}
#: restored by `down` to what they were before `up`
SYSCTLS = ("net/ipv4/ip_forward", "net/bridge/bridge-nf-call-iptables", "net/ipv4/conf/all/route_localnet",
           *INOTIFY_MINIMUMS)
# folders containerd, libcni and the kubelet create outside the state folder; removed when empty
HOST_DIRS = ("/run/netns", "/var/lib/cni/results", "/var/lib/cni", "/var/log/containers", "/var/log/pods")
COMPONENTS = ("registry", "containerd", "coredns", "kubelet", "kube-proxy", netpol.NAME)
PAUSE_IMAGE = f"{REGISTRY}/sless-testbed/pause:3.10"


def log(message: str) -> None:
    print(f"[testbed-node {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def build() -> Path:
    """Build (or find in the cache) the node's extra binaries; returns their folder.

    gVisor (the optional runsc handler) builds in the background meanwhile, with caches of its own.
    """
    gvisor_build = gvisor.start_build()
    try:
        proc = subprocess.run(["bash", str(BUILD_SH)], stdout=subprocess.PIPE, stderr=sys.stderr, text=True,
                              check=False)  # fmt: skip
    finally:
        gvisor.finish_build(gvisor_build)
    if proc.returncode != 0:
        raise RuntimeError(f"{BUILD_SH} failed with exit code {proc.returncode}")
    folder = Path(proc.stdout.strip().splitlines()[-1])
    missing = [b for b in BINARIES if not (folder / b).is_file()]
    if missing:
        raise RuntimeError(f"{folder} lacks {', '.join(missing)}")
    return folder


def is_built() -> bool:
    proc = subprocess.run(["bash", str(BUILD_SH), "--check"], capture_output=True, text=True, check=False)
    return proc.returncode == 0


def _run(*argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {proc.stderr.strip()}")
    return proc


def preflight() -> None:
    """Fail early, with the fix, when the host cannot run a node (or one already runs)."""
    if os.geteuid() != 0:
        raise RuntimeError("a real node needs root (network, mounts, cgroups)")
    needed = {"containerd": "containerd", "runc": "runc", "iptables": "iptables", "buildah": "buildah",
              "debootstrap": "debootstrap", "ctr": "containerd", "ipset": "ipset"}  # fmt: skip
    missing = sorted({pkg for exe, pkg in needed.items() if not _which(exe)})
    if not Path(CNI_BIN, "bridge").exists():
        missing.append("containernetworking-plugins")
    if missing:
        raise RuntimeError(f"missing packages {', '.join(missing)}: run scripts/install-realnode.sh")
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        raise RuntimeError(f"bridge {BRIDGE} exists: a real node runs already (one per machine), "
                           "or a previous `down` did not finish; run `testbed down` on its state folder")  # fmt: skip


def _which(exe: str) -> bool:
    return any(Path(d, exe).is_file() for d in [*os.environ.get("PATH", "").split(":"), "/usr/sbin", "/sbin"])


# --- host state -----------------------------------------------------------------------------
def _read_sysctl(name: str) -> str | None:
    try:
        return Path("/proc/sys", name).read_text().strip()
    except OSError:
        return None


def _cgroup_dirs() -> list[Path]:
    """The node's cgroup root in every mounted hierarchy (v1 controllers and the v2 mount)."""
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if fields[2] in ("cgroup", "cgroup2"):
            found.append(Path(fields[1]) / CGROUP_ROOT)
    return found


def setup_host(state: Path) -> None:
    """Record what `down` must restore, then make the bridge and the cgroup root."""
    before = {
        "sysctls": {name: _read_sysctl(name) for name in SYSCTLS},
        "netns": sorted(p.name for p in Path("/run/netns").glob("*")) if Path("/run/netns").exists() else [],
        "absent_dirs": [d for d in HOST_DIRS if not Path(d).exists()],
    }
    (state / "realnode-host.json").write_text(json.dumps(before, indent=2) + "\n")
    for name, minimum in INOTIFY_MINIMUMS.items():
        current = _read_sysctl(name)
        if current is not None and int(current) < minimum:
            Path("/proc/sys", name).write_text(str(minimum))
    # A fixed MAC: a bridge without one takes the lowest MAC of its ports, so it changes whenever a
    # pod's veth comes or goes, and pods that cached the old one in ARP lose the node for ~30-60 s.
    _run("ip", "link", "add", BRIDGE, "address", BRIDGE_MAC, "type", "bridge")
    _run("ip", "addr", "add", f"{NODE_IP}/24", "dev", BRIDGE)
    _run("ip", "link", "set", BRIDGE, "up")
    # The Service CIDR is routed to the bridge as well (the route goes with the bridge at `down`). Without
    # it a host process that dials a ClusterIP before kube-proxy has programmed its DNAT leaves through
    # the default route, where a network may answer for any address (an empty 404 here), and a
    # keep-alive client then reuses that stray connection for good. On the bridge such an early dial
    # finds no host and fails, so the client dials again once the Service is programmed.
    from .cluster import SERVICE_CIDR  # cluster imports this module: a top-level import would be circular

    _run("ip", "route", "add", SERVICE_CIDR, "dev", BRIDGE)
    for cg in _cgroup_dirs():
        cg.mkdir(exist_ok=True)
        for name in ("cpuset.cpus", "cpuset.mems"):  # a new v1 cpuset cgroup starts empty: no task fits
            if (cg / name).exists() and not (cg / name).read_text().strip():
                (cg / name).write_text((cg.parent / name).read_text())


def _mounts_under(*roots: Path) -> list[str]:
    prefixes = [str(r).rstrip("/") + "/" for r in roots]
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        target = line.split()[1].replace("\\040", " ")
        if any(target.startswith(p) for p in prefixes):
            found.append(target)
    return sorted(set(found), key=lambda t: t.count("/"), reverse=True)


def _kill_cgroup_procs() -> int:
    """SIGKILL every process left in the node's cgroups (containers whose shim died)."""
    pids: set[int] = set()
    for cg in _cgroup_dirs():
        if cg.exists():
            for procs_file in cg.rglob("cgroup.procs"):
                try:
                    pids |= {int(p) for p in procs_file.read_text().split()}
                except OSError:
                    continue
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


def _shims(state: Path) -> list[int]:
    """containerd shims serving this node's containerd (they run in their own sessions)."""
    sock = str(state / "containerd" / "containerd.sock")
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        shim = cmdline[0].endswith((b"containerd-shim-runc-v2", gvisor.SHIM.encode()))
        if cmdline and shim and sock.encode() in cmdline:
            found.append(int(proc.name))
    return found


def _rmdir_tree(root: Path) -> None:
    if not root.exists():
        return
    for sub in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            sub.rmdir()
    try:
        root.rmdir()
    except OSError as exc:
        log(f"could not remove cgroup {root}: {exc}")


def _remove_cni_results() -> None:
    """libcni's cached results of pods that never got a CNI DEL: ours and their loopback's."""
    results = Path("/var/lib/cni/results")
    if not results.exists():
        return
    for result in results.glob(f"{NETWORK}-*"):
        container = result.name.removeprefix(f"{NETWORK}-").rsplit("-", 1)[0]
        (results / f"cni-loopback-{container}-lo").unlink(missing_ok=True)
        result.unlink(missing_ok=True)


def _iptables_sweep() -> list[str]:
    """Remove the node's iptables rules and chains: CNI-* (CNI plugins), KUBE-* (kubelet, kube-proxy).

    `up` refuses to start when such chains exist (`cni_chains`), so every one found here is
    ours. Rules in built-in chains that jump to them or mention the subnet, bridge or network
    go first, then the chains themselves (flushed first: chains may refer to each other).
    """
    removed = []
    for binary in ("iptables", "ip6tables"):
        for table in ("nat", "filter", "mangle"):
            dump = _run(f"{binary}-save", "-t", table, check=False).stdout
            rules = [line for line in dump.splitlines() if line.startswith("-A ")]
            chains = [line[1:].split()[0] for line in dump.splitlines() if line.startswith((":CNI-", ":KUBE-"))]
            subnet = SUBNET.rsplit(".", 1)[0] + "."
            for rule in rules:
                words = rule.split()
                jumps_cni = any(w.startswith(("CNI-", "KUBE-")) for w in words[2:])
                ours = jumps_cni or NETWORK in rule or subnet in rule or BRIDGE in rule
                if ours and not words[1].startswith(("CNI-", "KUBE-")):
                    _run("sh", "-c", f"{binary} -t {table} -D {rule[3:]}", check=False)
                    removed.append(f"{binary} {table} {rule}")
            for chain in chains:
                _run(binary, "-t", table, "-F", chain, check=False)
            for chain in chains:
                if _run(binary, "-t", table, "-X", chain, check=False).returncode == 0:
                    removed.append(f"{binary} {table} chain {chain}")
    return removed


def cni_chains() -> list[str]:
    """CNI-* chains present now (any table, IPv4): `up` refuses to share them with another user."""
    found = []
    for table in ("nat", "filter"):
        dump = _run("iptables-save", "-t", table, check=False).stdout
        found += [line[1:].split()[0] for line in dump.splitlines() if line.startswith((":CNI-", ":KUBE-"))]
    return found


# --- configuration files --------------------------------------------------------------------
def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def cni_config(state: Path) -> Path:
    conf = {
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "plugins": [
            {
                "type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": True, "hairpinMode": True,
                "ipam": {
                    "type": "host-local", "dataDir": str(state / "cni-ipam"),
                    "ranges": [[{"subnet": SUBNET, "gateway": NODE_IP}]], "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
            {"type": "firewall", "backend": "iptables"},
        ],
    }  # fmt: skip
    return _write(state / "cni" / "net.d" / "10-sless-testbed.conflist", json.dumps(conf, indent=2) + "\n")


def containerd_config(state: Path, gvisor_bin: Path | None = None) -> Path:
    """containerd's config; with GVISOR_BIN also the ``runsc`` runtime handler (gVisor, systrap)."""
    base = state / "containerd"
    runsc = gvisor.containerd_runtime(cri_key(), gvisor.shim_config(base, gvisor_bin)) if gvisor_bin else ""
    hosts = base / "certs.d" / REGISTRY / "hosts.toml"
    _write(hosts, f'server = "http://{REGISTRY}"\n\n[host."http://{REGISTRY}"]\n'
                  '  capabilities = ["pull", "resolve", "push"]\n  skip_verify = true\n')  # fmt: skip
    cri = cri_key()
    text = f"""version = 2
root = "{CONTAINERD_ROOT}"
state = "{base / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{base / "containerd.sock"}"
[ttrpc]
  address = "{base / "containerd.sock.ttrpc"}"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{images.CACHE / "containerd-opt"}"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "/usr/bin/runc"
        Root = "{base / "runc"}"
{runsc}  [{cri}.cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{state / "cni" / "net.d"}"
    max_conf_num = 1
  [{cri}.registry]
    config_path = "{base / "certs.d"}"
"""
    return _write(base / "config.toml", text)


def cri_key() -> str:
    return 'plugins."io.containerd.grpc.v1.cri"'


def kubelet_config(state: Path, pki: Pki, healthz_port: int) -> Path:
    conf = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": NODE_IP, "port": KUBELET_PORT, "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": healthz_port,
        "tlsCertFile": str(pki.path("kubelet.crt")), "tlsPrivateKeyFile": str(pki.path("kubelet.key")),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                           "x509": {"clientCAFile": str(pki.ca_crt)}},
        "authorization": {"mode": "AlwaysAllow"},
        "cgroupDriver": "cgroupfs", "cgroupRoot": f"/{CGROUP_ROOT}", "failCgroupV1": False,
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{state / 'containerd' / 'containerd.sock'}",
        "clusterDNS": [DNS_SERVICE_IP], "clusterDomain": "cluster.local",
        "resolvConf": "/etc/resolv.conf",
        "podCIDR": SUBNET, "maxPods": 60,
        "volumePluginDir": str(state / "kubelet-plugins"),
        "podLogsDir": str(state / "pod-logs"),
        "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                         "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 99, "imageGCLowThresholdPercent": 98,
        "serializeImagePulls": False, "registerNode": True,
        "nodeStatusUpdateFrequency": "5s", "syncFrequency": "10s",
        "fileCheckFrequency": "20s", "httpCheckFrequency": "20s",
    }  # fmt: skip
    return _write(state / "kubelet" / "config.json", json.dumps(conf, indent=2) + "\n")


def kube_proxy_config(state: Path, healthz_port: int, metrics_port: int) -> Path:
    conf = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(state / "kubeconfig")},
        "mode": "iptables", "hostnameOverride": NODE, "clusterCIDR": SUBNET,
        "bindAddress": "127.0.0.1",
        "healthzBindAddress": f"127.0.0.1:{healthz_port}", "metricsBindAddress": f"127.0.0.1:{metrics_port}",
        # NodePorts only on the bridge: never a rule for 127.0.0.1, never route_localnet
        "nodePortAddresses": [f"{NODE_IP}/32"],
        # leave the host's conntrack sysctls alone (0 = do not set)
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "iptables": {"masqueradeAll": False, "localhostNodePorts": False},
    }  # fmt: skip
    return _write(state / "kube-proxy.json", json.dumps(conf, indent=2) + "\n")


def corefile(state: Path) -> Path:
    text = f""".:53 {{
    bind {NODE_IP}
    errors
    health 127.0.0.1:{{$HEALTH_PORT}}
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {state / "kubeconfig"}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    forward . /etc/resolv.conf
    cache 10
    loop
}}
"""
    return _write(state / "Corefile", text)


def registry_config(state: Path) -> Path:
    text = f"""version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {images.REGISTRY_STORAGE}
  delete:
    enabled: true
http:
  addr: {{ADDR}}
"""
    return _write(state / "registry.yml", text)


def dns_objects() -> str:
    """kube-dns: a selectorless Service whose EndpointSlice names CoreDNS on the bridge IP."""
    ports = [{"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
        "spec": {"clusterIP": DNS_SERVICE_IP, "ports": [p | {"targetPort": 53} for p in ports]},
    }  # fmt: skip
    slice_ = {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "kube-dns-coredns", "namespace": "kube-system",
                     "labels": {"kubernetes.io/service-name": "kube-dns",
                                "endpointslice.kubernetes.io/managed-by": "sless-testbed"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [NODE_IP], "conditions": {"ready": True}}],
        "ports": ports,
    }  # fmt: skip
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": [service, slice_]})


# --- up -------------------------------------------------------------------------------------
@dataclass
class NodeInfo:
    """What tests need to know about the node."""

    registry: str
    node: str
    node_ip: str
    dns_ip: str
    images: dict[str, str]
    gvisor: str = ""  # the folder of runsc and its shim when containerd has the runsc handler, else ""


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def start_registry(state: Path, realnode_bin: Path, addr: str, name: str = "registry") -> procs.Started:
    config = state / f"{name}.yml"
    config.write_text(registry_config(state).read_text().replace("{ADDR}", addr))
    env = os.environ | {"OTEL_TRACES_EXPORTER": "none", "OTEL_SDK_DISABLED": "true"}
    started = procs.start(name, [str(realnode_bin / "registry"), "serve", str(config)], state, env=env)
    wait_for(f"{name} /v2/", lambda: _http_ok(f"http://{addr}/v2/"), 30,
             abort=lambda: None if procs.alive(started) else procs.log_tail(state, name))  # fmt: skip
    return started


def prebuild_images(state: Path, bin_dir: Path, realnode_bin: Path, port: int) -> dict[str, float]:
    """Build and push every image with a registry on loopback (no bridge, no node): warms the cache."""
    images.REGISTRY_STORAGE.mkdir(parents=True, exist_ok=True)
    reg = start_registry(state, realnode_bin, f"127.0.0.1:{port}", "registry-prebuild")
    try:
        return images.ensure(bin_dir, realnode_bin, f"127.0.0.1:{port}")
    finally:
        procs.stop([reg])
        (state / "pids" / "registry-prebuild.json").unlink(missing_ok=True)


def prepare(state: Path) -> Path:
    """Before the control plane starts: the node's binaries, the host checks, the bridge.

    The bridge comes first because the apiserver serves on its address. Returns the folder of
    the node's binaries.
    """
    realnode_bin = build()
    netpol.build()  # a cold build happens here, before the control plane starts; `up` then finds it cached
    preflight()
    leftovers = cni_chains() + netpol.ipsets()
    if leftovers:
        raise RuntimeError(f"iptables/ipset already has CNI/KUBE chains or sets ({', '.join(leftovers[:5])}): "
                           "another node or a leftover; `down` removes ours only when it made all of them")  # fmt: skip
    (state / "realnode.json").write_text(json.dumps({"node": NODE, "bridge": BRIDGE}) + "\n")
    setup_host(state)
    return realnode_bin


def up(state: Path, bin_dir: Path, realnode_bin: Path, kubectl: Kubectl, pki: Pki, free: list[int],
       timeout: float, started: list[procs.Started], timings: dict[str, float]) -> NodeInfo:  # fmt: skip
    """Start the node's processes into STATE (`prepare` ran; the control plane already answers)."""
    t0 = time.monotonic()

    def mark(step: str, since: float) -> float:
        now = time.monotonic()
        timings[step] = round(now - since, 2)
        log(f"{step}: {timings[step]:.2f}s")
        return now

    t = t0

    started.append(start_registry(state, realnode_bin, REGISTRY))
    built = images.ensure(bin_dir, realnode_bin, REGISTRY)
    if built:
        timings.update({f"image {k}": v for k, v in built.items()})
    t = mark("node: registry + images", t)

    cni_config(state)
    gvisor_bin = gvisor.built()
    config = containerd_config(state, gvisor_bin)
    sock = state / "containerd" / "containerd.sock"
    died = lambda: next((f"{p.name} exited:\n{procs.log_tail(state, p.name)}"  # noqa: E731
                         for p in started if not procs.alive(p)), None)  # fmt: skip
    started.append(start_containerd(state, config, gvisor_bin, abort=died))
    bed_refs = [f"{REGISTRY}/{i.ref}" for i in images.Builder(bin_dir, realnode_bin, REGISTRY).images()]
    for ref in forget_stale_images(sock, bed_refs):
        log(f"containerd forgot {ref}: the registry serves a newer build")
    t = mark("node: containerd", t)

    health_port, kubelet_healthz, proxy_healthz, proxy_metrics = free[:4]
    core = corefile(state)
    core.write_text(core.read_text().replace("{$HEALTH_PORT}", str(health_port)))
    started.append(procs.start("coredns", [str(realnode_bin / "coredns"), "-conf", str(core)], state))
    kubectl.apply(dns_objects())

    _leaf("kubelet", f"/CN=system:node:{NODE}/O=system:nodes",
          f"subjectAltName=IP:{NODE_IP},IP:127.0.0.1,DNS:{NODE}\nextendedKeyUsage=serverAuth\n"
          "keyUsage=critical,digitalSignature,keyEncipherment", pki.dir)  # fmt: skip
    for leftover in [*pki.dir.glob("*.csr"), *pki.dir.glob("*.ext")]:
        leftover.unlink()
    kconf = kubelet_config(state, pki, kubelet_healthz)
    (state / "pod-logs").mkdir(exist_ok=True)
    started.append(procs.start("kubelet", [
        str(bin_dir / "kubelet"), f"--config={kconf}", f"--kubeconfig={state / 'kubeconfig'}",
        f"--hostname-override={NODE}", f"--node-ip={NODE_IP}", f"--root-dir={state / 'kubelet'}",
        f"--cert-dir={state / 'kubelet' / 'pki'}", "--v=1",
    ], state))  # fmt: skip
    pconf = kube_proxy_config(state, proxy_healthz, proxy_metrics)
    started.append(procs.start("kube-proxy", [str(bin_dir / "kube-proxy"), f"--config={pconf}"], state))
    wait_for(f"node {NODE} Ready", lambda: _node_ready(kubectl), timeout, abort=died)
    wait_for("coredns /health", lambda: _http_ok(f"http://127.0.0.1:{health_port}/health"), 30, abort=died)
    wait_for("kube-proxy /healthz", lambda: _http_ok(f"http://127.0.0.1:{proxy_healthz}/healthz"), timeout,
             abort=died)  # fmt: skip
    t = mark("node: kubelet Ready, kube-proxy, coredns", t)
    from .cluster import SERVICE_CIDR  # cluster imports this module: a top-level import would be circular

    started.append(netpol.start(netpol.build(), state, NODE, SERVICE_CIDR, timeout))
    mark("node: NetworkPolicy firewall (kube-router)", t)
    timings["node total"] = round(time.monotonic() - t0, 2)
    refs = {ref.split(":")[0]: f"{REGISTRY}/{ref}" for ref in (i.ref for i in images.Builder(
        bin_dir, realnode_bin, REGISTRY).images())}  # fmt: skip
    return NodeInfo(REGISTRY, NODE, NODE_IP, DNS_SERVICE_IP, refs, str(gvisor_bin or ""))


def cri_status(sock: Path) -> str:
    """The status containerd gives its CRI plugin: "ok", "error" (it did not load: the kubelet would exit
    with "unknown service runtime.v1.RuntimeService"), or "" before containerd answers."""
    listing = _run("ctr", "--address", str(sock), "plugins", "ls", check=False, timeout=30).stdout
    for words in (line.split() for line in listing.splitlines()):
        if len(words) >= 4 and words[:2] == ["io.containerd.grpc.v1", "cri"]:
            return words[-1]
    return ""


def start_containerd(state: Path, config: Path, gvisor_bin: Path | None, abort: Callable[[], str | None],
                     attempts: int = 2) -> procs.Started:  # fmt: skip
    """containerd on CONFIG, answering with its CRI plugin loaded. A CRI plugin that failed to load is a
    start that failed: its log is shown and containerd starts once more before the node gives up."""
    sock = state / "containerd" / "containerd.sock"
    binary = shutil.which("containerd") or "/usr/bin/containerd"
    for attempt in range(1, attempts + 1):
        proc = procs.start("containerd", [binary, "--config", str(config)], state,
                           env=gvisor.containerd_env(state / "containerd", gvisor_bin))  # fmt: skip
        gone = lambda proc=proc: abort() or (None if procs.alive(proc) else  # noqa: E731
                                             f"containerd exited:\n{procs.log_tail(state, 'containerd')}")  # fmt: skip
        wait_for("containerd socket", sock.exists, 30, abort=gone)
        wait_for("containerd's CRI plugin status", lambda: cri_status(sock) != "", 30, abort=gone)
        status = cri_status(sock)
        if status == "ok":
            return proc
        log(f"containerd's CRI plugin: {status} (start {attempt} of {attempts}); its log:\n"
            f"{procs.log_tail(state, 'containerd', lines=40)}")  # fmt: skip
        procs.stop([proc], grace=10)
        sock.unlink(missing_ok=True)
    raise RuntimeError(f"containerd's CRI plugin did not load in {attempts} starts (see containerd.log)")


def forget_stale_images(sock: Path, refs: list[str]) -> list[str]:
    """Remove from containerd's store the bed's images whose tag the registry now serves rebuilt.

    Their tags (``:testbed``) are fixed while their content follows the code, and containerd's
    store outlives `down`: without this a pod with ``IfNotPresent`` would run the previous build.
    """
    listing = _run("ctr", "--address", str(sock), "-n", "k8s.io", "images", "ls", check=False, timeout=30).stdout
    held = {words[0]: words[2] for words in (line.split() for line in listing.splitlines()[1:]) if len(words) > 2}
    stale = [ref for ref in refs if ref in held and images.registry_digest(REGISTRY, ref.split("/", 1)[1]) not in
             (None, held[ref])]  # fmt: skip
    for ref in stale:
        _run("ctr", "--address", str(sock), "-n", "k8s.io", "images", "rm", ref, check=False, timeout=30)
    return stale


def _node_ready(kubectl: Kubectl) -> bool:
    node = kubectl.get_json("node", NODE)
    conditions = (node or {}).get("status", {}).get("conditions", [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


# --- down -----------------------------------------------------------------------------------
def drain(kubectl: Kubectl, timeout: float = 60) -> None:
    """Delete every workload and pod through the API, so the kubelet stops them (CNI DEL included)."""
    kinds = "deployments,replicasets,statefulsets,daemonsets,jobs,cronjobs"
    kubectl.run("delete", kinds, "--all", "--all-namespaces", "--wait=false", timeout=60)
    kubectl.run("delete", "pods", "--all", "--all-namespaces", "--grace-period=1", "--wait=false", timeout=60)

    def none_left() -> bool:
        pods = kubectl.get_json("pods", "--all-namespaces", "--field-selector", f"spec.nodeName={NODE}")
        return not (pods or {}).get("items")

    try:
        wait_for("the node's pods gone", none_left, timeout)
    except TimeoutError:
        kubectl.run("delete", "pods", "--all", "--all-namespaces", "--grace-period=0", "--force", timeout=60)
        log("pods still there after drain: forced")


def _sandboxes_gone(state: Path) -> bool:
    sock = state / "containerd" / "containerd.sock"
    if not sock.exists():
        return True
    tasks = _run("ctr", "--address", str(sock), "-n", "k8s.io", "tasks", "ls", "-q", check=False, timeout=20)
    return tasks.returncode != 0 or not tasks.stdout.strip()  # no answer: containerd is gone, the sweep follows


def down(state: Path, kubectl: Kubectl | None, apiserver_alive: bool) -> list[str]:
    """Stop the node and remove everything it made on the host; returns what the sweep found."""
    start = time.monotonic()
    recorded = {p.name: p for p in procs.recorded(state)}
    # a drain needs the kubelet and containerd to stop the pods; after a crash the sweep does it
    node_alive = all(name in recorded and procs.alive(recorded[name]) for name in ("kubelet", "containerd"))
    if apiserver_alive and kubectl is not None and node_alive:
        try:
            drain(kubectl)
            wait_for("containerd tasks gone", lambda: _sandboxes_gone(state), 30)
        except (RuntimeError, TimeoutError, OSError, subprocess.TimeoutExpired) as exc:
            log(f"drain incomplete ({exc}); the sweep cleans up")
    ours = [recorded[name] for name in reversed(COMPONENTS) if name in recorded]
    procs.stop([p for p in ours if p.name != "containerd"], grace=10)
    found: list[str] = []
    killed = _kill_cgroup_procs()
    if killed:
        found.append(f"{killed} processes left in the node's cgroups")
    procs.stop([p for p in ours if p.name == "containerd"], grace=10)
    for pid in _shims(state):
        found.append(f"shim {pid}")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for p in ours:
        (state / "pids" / f"{p.name}.json").unlink(missing_ok=True)
    kube_proxy = Path(os.environ.get("SLESS_TESTBED_BIN", "")) / "kube-proxy"
    bin_dir = (
        json.loads((state / "env.json").read_text())["env"].get("SLESS_TESTBED_BIN")
        if (state / "env.json").exists()
        else None
    )
    if bin_dir:
        kube_proxy = Path(bin_dir) / "kube-proxy"
    if kube_proxy.is_file():
        _run(str(kube_proxy), "--cleanup", "--proxy-mode=iptables", check=False, timeout=60)
    found += _iptables_sweep()
    found += netpol.sweep()
    host = json.loads((state / "realnode-host.json").read_text()) if (state / "realnode-host.json").exists() else {}
    before_netns = set(host.get("netns", []))
    for target in _mounts_under(state, CONTAINERD_ROOT, Path("/run/netns"), Path("/var/run/netns")):
        if target.startswith(("/run/netns/", "/var/run/netns/")) and Path(target).name in before_netns:
            continue
        if _run("umount", target, check=False).returncode != 0:
            _run("umount", "-l", target, check=False)
        found.append(f"mount {target}")
    for netns in Path("/run/netns").glob("cni-*") if Path("/run/netns").exists() else []:
        if netns.name not in before_netns:
            netns.unlink(missing_ok=True)
    for cg in _cgroup_dirs():
        _rmdir_tree(cg)
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        links = json.loads(_run("ip", "-j", "link", "show", "master", BRIDGE, check=False).stdout or "[]")
        for link in links:
            _run("ip", "link", "delete", link["ifname"], check=False)
        _run("ip", "link", "delete", BRIDGE, check=False)
    for name, value in host.get("sysctls", {}).items():
        if value is not None and _read_sysctl(name) != value:
            Path("/proc/sys", name).write_text(value)
    for link in Path("/var/log/containers").glob("*.log") if Path("/var/log/containers").exists() else []:
        if str(state) in os.path.realpath(link) or not link.exists():
            link.unlink(missing_ok=True)
    _remove_cni_results()
    for folder in host.get("absent_dirs", []):  # listed deepest first
        with contextlib.suppress(OSError):
            Path(folder).rmdir()
    for item in found:
        log(f"swept: {item}")
    log(f"node down in {time.monotonic() - start:.1f}s")
    return found
