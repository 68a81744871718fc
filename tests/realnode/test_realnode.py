"""Pods really run on the test bed's real node: runtime image, Services, DNS, in-cluster builds.

These are the platform's assumptions about a cluster, checked without the platform: the python
runtime image runs under Pod Security `restricted` and answers through a ClusterIP; cluster DNS
resolves Services; kaniko builds and pushes an image to the in-cluster registry and a pod runs it.
"""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.realnode import HANDLER, RESTRICTED, RealNode, http_get, pod_ready, restricted_security, runtime_pod

pytestmark = [pytest.mark.realnode, pytest.mark.timeout(1800)]


def _namespace(real_node: RealNode, labels: dict[str, str]) -> Iterator[str]:
    bed = real_node.bed
    name = f"rn-{secrets.token_hex(4)}"
    bed.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
    try:
        yield name
    finally:
        bed.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def namespace(real_node: RealNode) -> Iterator[str]:
    """A fresh namespace with Pod Security `restricted` enforced, like a tenant's."""
    yield from _namespace(real_node, RESTRICTED)


@pytest.fixture
def build_namespace(real_node: RealNode) -> Iterator[str]:
    """A fresh namespace without Pod Security labels: kaniko runs as root, like the platform's builds."""
    yield from _namespace(real_node, {})


def wait_ready(real_node: RealNode, namespace: str, name: str, timeout: float = 120) -> tuple[dict[str, Any], float]:
    start = time.monotonic()
    pod = real_node.bed.wait(f"pod {name} Ready", lambda: pod_ready(real_node.bed, namespace, name), timeout=timeout)
    return pod, time.monotonic() - start


def test_python_runtime_pod_is_ready_under_restricted_and_answers_through_its_cluster_ip(
    real_node: RealNode, namespace: str
) -> None:
    bed = real_node.bed
    bed.apply(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "code", "namespace": namespace},
         "data": {"handler.py": HANDLER}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "hello", "namespace": namespace},
         "spec": {"selector": {"app": "hello"}, "ports": [{"port": 80, "targetPort": 8080}]}},
    )  # fmt: skip
    pod = runtime_pod("hello", real_node.image("sless/python3.11"), {"app": "hello"}, "code")
    bed.kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(pod))
    ready, seconds = wait_ready(real_node, namespace, "hello")
    print(f"python runtime pod Ready in {seconds:.1f}s")
    assert ready["spec"]["nodeName"] == bed.info["real_node"]["node"]

    cluster_ip = bed.get("service", "hello", "-n", namespace)["spec"]["clusterIP"]
    # kube-proxy may need a sync after the endpoints appear: retry briefly
    answer = bed.wait("the Service answers", lambda: _try_get(f"http://{cluster_ip}/"), timeout=30)
    status, body = answer
    assert status == 200, body
    assert json.loads(body) == {"hello": "real node", "method": "GET"}


def test_a_cluster_ip_kube_proxy_has_not_programmed_goes_to_the_bridge_not_out_of_the_host(
    real_node: RealNode,
) -> None:
    """A host client dialling a Service before its DNAT exists must fail, not reach whatever the
    default route leads to (a network answering every address would hand it a stray 404 connection)."""
    unallocated = "10.96.255.254"  # in the Service CIDR; the bed allocates from its low end
    route = subprocess.run(["ip", "route", "get", unallocated], capture_output=True, text=True, check=True)
    assert "dev slessbr0" in route.stdout, route.stdout
    with pytest.raises(OSError):
        socket.create_connection((unallocated, 80), timeout=5).close()


def test_nodejs_runtime_pod_runs_on_the_local_node_base_under_restricted(real_node: RealNode, namespace: str) -> None:
    """The nodejs20 image is built on the test bed's stand-in for node:20-slim (the host's Node)."""
    bed = real_node.bed
    handler = 'exports.handle = async (event) => ({ hello: "real node", method: event._method });\n'
    bed.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "code", "namespace": namespace},
               "data": {"handler.js": handler}})  # fmt: skip
    pod = runtime_pod("hello-node", real_node.image("sless/nodejs20"), {"app": "hello-node"}, "code")
    bed.kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(pod))
    ready, seconds = wait_ready(real_node, namespace, "hello-node")
    print(f"nodejs runtime pod Ready in {seconds:.1f}s")
    status, body = http_get(f"http://{ready['status']['podIP']}:8080/")
    assert status == 200, body
    assert json.loads(body) == {"hello": "real node", "method": "GET"}


def _try_get(url: str) -> tuple[int, str] | None:
    try:
        return http_get(url, timeout=3)
    except OSError:
        return None


def test_cluster_dns_resolves_a_service_from_a_pod(real_node: RealNode, namespace: str) -> None:
    bed = real_node.bed
    bed.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "target", "namespace": namespace},
               "spec": {"selector": {"app": "none"}, "ports": [{"port": 80}]}})  # fmt: skip
    cluster_ip = bed.get("service", "target", "-n", namespace)["spec"]["clusterIP"]
    pod_sec, ctr_sec = restricted_security()
    lookup = (
        "import socket, sys\n"
        f"print(socket.gethostbyname('target.{namespace}.svc.cluster.local'))\n"
        "print(socket.gethostbyname('target'))\n"  # the search path of the pod's resolv.conf
    )
    bed.kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "lookup"},
        "spec": {"restartPolicy": "Never", "securityContext": pod_sec, "containers": [{
            "name": "lookup", "image": real_node.image("sless/python3.11"), "securityContext": ctr_sec,
            "command": ["python3", "-c", lookup]}]},
    }))  # fmt: skip

    def finished() -> str | None:
        phase = (bed.get("pod", "lookup", "-n", namespace) or {}).get("status", {}).get("phase")
        return phase if phase in ("Succeeded", "Failed") else None

    phase = bed.wait("the lookup pod finished", finished, timeout=120)
    logs = bed.kubectl("logs", "-n", namespace, "lookup").stdout.split()
    assert phase == "Succeeded", logs
    assert logs == [cluster_ip, cluster_ip]


def test_kaniko_job_builds_and_pushes_an_image_that_a_pod_then_runs(real_node: RealNode, build_namespace: str) -> None:
    namespace = build_namespace
    bed = real_node.bed
    base = real_node.image("sless/python3.11")
    target = f"{real_node.registry}/test/hello-{namespace}:v1"
    dockerfile = f"FROM {base}\nCOPY handler.py /app/function/handler.py\n"
    bed.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "context", "namespace": namespace},
               "data": {"Dockerfile": dockerfile, "handler.py": HANDLER}})  # fmt: skip
    job = {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "build", "namespace": namespace},
        "spec": {"backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never",
            # ConfigMap files are symlinks; kaniko would copy the links, so copy the files first
            "initContainers": [{"name": "context", "image": base, "command": ["cp", "-L", "/src/Dockerfile",
                                "/src/handler.py", "/workspace/"],
                                "volumeMounts": [{"name": "src", "mountPath": "/src"},
                                                 {"name": "workspace", "mountPath": "/workspace"}],
                                "securityContext": {"runAsUser": 0}}],
            "containers": [{"name": "kaniko", "image": real_node.image("sless-testbed/kaniko-executor"),
                            "args": ["--context=dir:///workspace", "--dockerfile=/workspace/Dockerfile",
                                     f"--destination={target}", "--insecure", "--insecure-pull",
                                     "--skip-tls-verify", "--skip-tls-verify-pull"],
                            "volumeMounts": [{"name": "workspace", "mountPath": "/workspace"}]}],
            "volumes": [{"name": "src", "configMap": {"name": "context"}}, {"name": "workspace", "emptyDir": {}}],
        }}},
    }  # fmt: skip
    start = time.monotonic()
    bed.apply(job)

    def done() -> str | None:
        status = (bed.get("job", "build", "-n", namespace) or {}).get("status", {})
        for cond in status.get("conditions", []):
            if cond["type"] in ("Complete", "Failed") and cond["status"] == "True":
                return str(cond["type"])
        return None

    outcome = bed.wait("the kaniko Job finished", done, timeout=300)
    logs = bed.kubectl("logs", "-n", namespace, "job/build", "-c", "kaniko", check=False).stdout
    assert outcome == "Complete", logs[-3000:]
    print(f"kaniko build + push in {time.monotonic() - start:.1f}s")

    pod = runtime_pod("built", target, {"app": "built"}, None)
    pod["metadata"]["namespace"] = namespace
    pod["spec"]["containers"][0]["securityContext"] |= {"runAsUser": 1000}
    bed.kubectl("apply", "-f", "-", stdin=json.dumps(pod))
    ready, seconds = wait_ready(real_node, namespace, "built")
    print(f"built image pod Ready in {seconds:.1f}s")
    status, body = http_get(f"http://{ready['status']['podIP']}:8080/hello")
    assert status == 200, body
    assert json.loads(body) == {"hello": "real node", "method": "GET"}


def test_a_pod_reaches_the_apiserver_with_its_service_account(real_node: RealNode, namespace: str) -> None:
    """In-cluster clients work: the `kubernetes` Service leads to the apiserver, whose certificate
    names it, and the pod's ServiceAccount token is what it is allowed as (one ConfigMap, no more)."""
    bed = real_node.bed
    bed.apply(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader", "namespace": namespace}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "visible", "namespace": namespace},
         "data": {"word": "from-the-apiserver"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "read-visible", "namespace": namespace},
         "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["visible"], "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "read-visible", "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-visible"},
         "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}]},
    )  # fmt: skip
    client = (
        "import json, os, ssl, urllib.request, urllib.error\n"
        "sa = '/var/run/secrets/kubernetes.io/serviceaccount'\n"
        "ctx = ssl.create_default_context(cafile=sa + '/ca.crt')\n"
        "token = open(sa + '/token').read()\n"
        "ns = open(sa + '/namespace').read()\n"
        "def get(host, path):\n"
        "    req = urllib.request.Request(f'https://{host}{path}', headers={'Authorization': 'Bearer ' + token})\n"
        "    try:\n"
        "        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:\n"
        "            return resp.status, json.load(resp)\n"
        "    except urllib.error.HTTPError as exc:\n"
        "        return exc.code, json.load(exc)\n"
        "env_host = os.environ['KUBERNETES_SERVICE_HOST'] + ':' + os.environ['KUBERNETES_SERVICE_PORT']\n"
        "code, cm = get('kubernetes.default.svc', f'/api/v1/namespaces/{ns}/configmaps/visible')\n"
        "print(json.dumps({'configmap': [code, cm.get('data')],\n"
        "                  'by_env': get(env_host, f'/api/v1/namespaces/{ns}/configmaps/visible')[0],\n"
        "                  'secrets': get('kubernetes.default.svc', f'/api/v1/namespaces/{ns}/secrets')[0]}))\n"
    )
    pod_sec, ctr_sec = restricted_security()
    bed.kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client"},
        "spec": {"restartPolicy": "Never", "serviceAccountName": "reader", "securityContext": pod_sec,
                 "containers": [{"name": "client", "image": real_node.image("sless/python3.11"),
                                 "securityContext": ctr_sec | {"runAsUser": 1000},
                                 "command": ["python3", "-c", client]}]},
    }))  # fmt: skip

    def finished() -> str | None:
        phase = (bed.get("pod", "client", "-n", namespace) or {}).get("status", {}).get("phase")
        return phase if phase in ("Succeeded", "Failed") else None

    phase = bed.wait("the client pod finished", finished, timeout=120)
    logs = bed.kubectl("logs", "-n", namespace, "client").stdout
    assert phase == "Succeeded", logs
    answer = json.loads(logs.strip().splitlines()[-1])
    assert answer == {"configmap": [200, {"word": "from-the-apiserver"}], "by_env": 200, "secrets": 403}
