"""Builds on a real kubelet: kaniko holds no credential, the push step pushes its tarball, a hostile install
script finds nothing to steal.

The dependency a function asks for is a package of the test's own (served from the bridge by a find-links
page, ``--no-index``: no public index needed) whose build backend is its install script: it runs as root
inside kaniko while ``pip install`` builds it, reads every file it can reach (and every process's
environment and command line) for the registry credential, and leaves what it found in the image
(``/sless-probe-report.json``). Everything else is real: S3 on moto, the build Job's three steps, the
registry (the test bed's, open; or one behind ``auth: htpasswd`` on the bridge), the operator and the API.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import gzip
import hashlib
import http.server
import io
import json
import secrets
import socket
import subprocess
import tarfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from sless_core import crd
from sless_core.buildcontext import code_tree_hash, make_build_context
from sless_core.models import FunctionSpec
from sless_operator import manifests
from sless_operator.config import OperatorConfig
from sless_operator.manifests import FunctionRef, Owner
from tests.support.kube_operator import Operator, strip_finalizers
from tests.support.platform import Tenant
from tests.support.realnode import RealNode
from tests.support.realnode_operator import ACCESS, BUCKET, SECRET_KEY, build_logs, build_namespace, operator_env

pytestmark = [pytest.mark.realnode, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
ACCEPT = ", ".join(["application/vnd.docker.distribution.manifest.v2+json",
                    "application/vnd.oci.image.manifest.v1+json"])  # fmt: skip
REPORT = "sless-probe-report.json"

# The probe's build backend (PEP 517, in the sdist itself: no build requirement to download). Importing it is
# the install script: it looks for MARKERS everywhere a build step can look, then builds a one-module wheel.
PROBE_BACKEND = r'''
import base64, hashlib, io, json, os, zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
# kept reversed and base64-encoded in the sdist, so the probe's own files never match
MARKERS = [base64.b64decode(m)[::-1] for m in json.loads(open(os.path.join(HERE, "markers.json")).read())]
SKIP = ("/proc", "/sys", "/dev", HERE)


def _matches(data):
    return [i for i, marker in enumerate(MARKERS) if marker in data]


def _scan():
    found, files = [], 0
    for top, dirs, names in os.walk("/", followlinks=False):
        dirs[:] = [d for d in dirs if os.path.join(top, d) not in SKIP]
        for name in names:
            path = os.path.join(top, name)
            try:
                if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) > 4 << 20:
                    continue
                with open(path, "rb") as handle:
                    data = handle.read()
            except OSError:
                continue
            files += 1
            found += [f"{path}#{i}" for i in _matches(data)]
    for pid in os.listdir("/proc"):
        for part in ("environ", "cmdline"):
            try:
                with open(f"/proc/{pid}/{part}", "rb") as handle:
                    found += [f"/proc/{pid}/{part}#{i}" for i in _matches(handle.read())]
            except OSError:
                pass
    report = {"found": found, "files": files, "uid": os.getuid()}
    with open("/" + "REPORT", "w") as out:
        json.dump(report, out)


_scan()


def _wheel(directory):
    name = "sless_probe-0.1-py3-none-any.whl"
    files = {"sless_probe.py": b"VERSION = '0.1'\n",
             "sless_probe-0.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: sless-probe\nVersion: 0.1\n",
             "sless_probe-0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: probe\nRoot-Is-Purelib: true\n"
                                                b"Tag: py3-none-any\n"}
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append("sless_probe-0.1.dist-info/RECORD,,")
    files["sless_probe-0.1.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    with zipfile.ZipFile(os.path.join(directory, name), "w") as whl:
        for path, data in files.items():
            whl.writestr(path, data)
    return name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory)


def get_requires_for_build_wheel(config_settings=None):
    return []
'''.replace("REPORT", REPORT)


def probe_sdist(markers: list[str]) -> bytes:
    """sless_probe-0.1.tar.gz: pyproject.toml naming the in-tree backend above, which scans for MARKERS (its report
    names each file found with ``#<index in MARKERS>``)."""
    hidden = [base64.b64encode(m.encode()[::-1]).decode() for m in markers]
    files = {
        "pyproject.toml": b'[build-system]\nrequires = []\nbuild-backend = "probe_backend"\nbackend-path = ["."]\n',
        "probe_backend.py": PROBE_BACKEND.encode(),
        "markers.json": json.dumps(hidden).encode(),
        "PKG-INFO": b"Metadata-Version: 2.1\nName: sless-probe\nVersion: 0.1\n",
    }
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"sless_probe-0.1/{name}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


def _bind_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def probe_index(real_node: RealNode, work: Path, markers: list[str]) -> Iterator[str]:
    """A find-links page on the bridge serving the probe; yields the requirements.txt that installs it."""
    folder = work / "probe-index"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sless_probe-0.1.tar.gz").write_bytes(probe_sdist(markers))
    (folder / "index.html").write_text('<a href="sless_probe-0.1.tar.gz">sless_probe-0.1.tar.gz</a>\n')

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(folder), **kwargs)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer((real_node.node_ip, 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    port = httpd.server_address[1]
    try:
        yield (f"--no-index\n--find-links http://{real_node.node_ip}:{port}/\n"
               f"--trusted-host {real_node.node_ip}\nsless-probe==0.1\n")  # fmt: skip
    finally:
        httpd.shutdown()
        httpd.server_close()


@contextlib.contextmanager
def login_registry(real_node: RealNode, work: Path, user: str, password: str) -> Iterator[str]:
    """The test bed's registry binary serving on the bridge behind ``auth: htpasswd`` (bcrypt); yields host:port."""
    found = subprocess.run(["bash", str(ROOT / "tests/testbed/build-realnode.sh"), "--check"], capture_output=True,
                           text=True, check=False, timeout=60)  # fmt: skip
    assert found.returncode == 0, "the real node's binaries are not built"
    with warnings.catch_warnings():  # the standard library's crypt: libxcrypt's bcrypt ($2b$)
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt

    hashed = crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))
    assert hashed and hashed.startswith("$2"), "this libcrypt makes no bcrypt hashes"
    work.mkdir(parents=True, exist_ok=True)
    (work / "htpasswd").write_text(f"{user}:{hashed}\n")
    addr = f"{real_node.node_ip}:{_bind_port(real_node.node_ip)}"
    (work / "storage").mkdir(exist_ok=True)
    config = work / "registry.yml"
    config.write_text(f"version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: true\n"
                      f"storage:\n  filesystem:\n    rootdirectory: {work / 'storage'}\nhttp:\n  addr: {addr}\n"
                      f"auth:\n  htpasswd:\n    realm: sless-test\n    path: {work / 'htpasswd'}\n")  # fmt: skip
    log = work / "registry.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([str(Path(found.stdout.strip()) / "registry"), "serve", str(config)], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip

    def up() -> bool:
        assert proc.poll() is None, log.read_text(errors="replace")[-2000:]
        try:
            return requests.get(f"http://{addr}/v2/", timeout=2).status_code == 401
        except requests.RequestException:
            return False

    try:
        real_node.bed.wait("the login registry answers", up, timeout=30)
        yield addr
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def image_report(registry: str, repository: str, tag: str, auth: tuple[str, str] | None) -> dict[str, Any]:
    """The probe's report inside the pushed image (read back through the registry's API)."""
    resp = requests.get(f"http://{registry}/v2/{repository}/manifests/{tag}", auth=auth, headers={"Accept": ACCEPT},
                        timeout=30)  # fmt: skip
    assert resp.status_code == 200, f"{resp.status_code} {resp.text[:300]}"
    report: dict[str, Any] | None = None
    for described in resp.json()["layers"]:
        blob = requests.get(f"http://{registry}/v2/{repository}/blobs/{described['digest']}", auth=auth, timeout=60)
        assert blob.status_code == 200 and hashlib.sha256(blob.content).hexdigest() == described["digest"][7:]
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob.content))) as layer:
            for member in layer.getmembers():
                if member.name.lstrip("./") == REPORT and member.isfile():
                    handle = layer.extractfile(member)
                    assert handle is not None
                    report = json.loads(handle.read())
    assert report is not None, "the probe's install script left no report: it did not run"
    return report


def _pod_of(real_node: RealNode, namespace: str, selector: str) -> dict[str, Any]:
    pods = (real_node.bed.get("pods", "-n", namespace, "-l", selector) or {}).get("items", [])
    assert pods, f"no build pod in {namespace}"
    return dict(pods[-1])


def _push_result(pod: dict[str, Any]) -> dict[str, Any]:
    """The push step's termination message (the push's result), after checking the init steps ended well."""
    status = pod["status"]
    for step in status["initContainerStatuses"]:
        assert step["state"]["terminated"]["exitCode"] == 0, step
    [push] = status["containerStatuses"]
    assert push["name"] == manifests.PUSH_CONTAINER
    return dict(json.loads(push["state"]["terminated"]["message"]))


def test_a_python_function_with_requirements_gets_its_dependency_image_pushed_by_the_push_step_and_answers(
    real_node: RealNode, s3_on_bridge: str, api_url: str, tmp_path: Path
) -> None:
    bed = real_node.bed
    t = Tenant(api_url, f"realnode-{secrets.token_hex(4)}")
    t.api("POST", "/ensure", expect=201)
    build_ns = build_namespace(real_node)
    op = Operator(bed, t.ns, build_ns, tmp_path, extra_env=operator_env(real_node, s3_on_bridge)).start()
    start = time.monotonic()
    try:
        with probe_index(real_node, tmp_path, ["no-credential-in-this-build"]) as requirements:
            t.api("POST", "/functions", json={"name": "deps", "runtime": "python3.11"}, expect=201)
            t.upload("deps", {"handler.py": "import sless_probe\n\ndef handle(event):\n"
                                            "    return {'probe': sless_probe.VERSION}\n",
                              "requirements.txt": requirements})  # fmt: skip
            t.api("POST", "/triggers", json={"name": "deps", "type": "http", "function": "deps"}, expect=201)

            def ready() -> dict[str, Any] | None:
                body: dict[str, Any] = t.api("GET", "/functions/deps", expect=200).json()
                if body["phase"] == "Failed":
                    raise AssertionError(f"the function failed: {body}\n{build_logs(real_node, build_ns)}")
                return body if body["phase"] == "Ready" else None

            body = bed.wait("the function with requirements Ready", ready, timeout=900, interval=2)
        print(f"requirements.txt: upload -> Ready (dependency image built and pushed): {time.monotonic() - start:.1f}s")
        assert body["image"].startswith(f"{real_node.registry}/sless/{t.ns}/deps:"), body
        pod = _pod_of(real_node, build_ns, f"{crd.LABEL_NAMESPACE}={t.ns},{crd.LABEL_COMPONENT}=build")
        assert [c["name"] for c in pod["spec"]["initContainers"]] == ["fetch-context", "kaniko"]
        result = _push_result(pod)
        assert result["image"] == body["image"] and result["digest"].startswith("sha256:"), result
        assert result["uploaded"] + result["mounted"] >= 1, result  # at least the dependency layer and the config
        repository, tag = body["image"].removeprefix(f"{real_node.registry}/").rsplit(":", 1)
        report = image_report(real_node.registry, repository, tag, None)
        assert report["uid"] == 0 and report["files"] > 100 and report["found"] == [], report

        def answered() -> object:
            resp = requests.get(t.fn_url("deps"), timeout=30)
            return resp.json() if resp.status_code == 200 else None

        assert bed.wait("/fn answers from the dependency image", answered, timeout=120) == {"probe": "0.1"}
    finally:
        op.stop()
        strip_finalizers(bed, t.ns)
        bed.kubectl("delete", "namespace", t.ns, build_ns, "--wait=false", check=False)


def _build(real_node: RealNode, config: OperatorConfig, build_ns: str, tenant: str, context_key: str,
           code: Path) -> dict[str, Any]:  # fmt: skip
    """The operator's build Job for CODE (a python function), run in BUILD_NS; returns its finished pod."""
    from minio import Minio

    code_hash = code_tree_hash(code)
    context = make_build_context(code, "python3.11", "handler.handle", real_node.image("sless/python3.11"),
                                 code_hash=code_hash)  # fmt: skip
    s3 = Minio(config.s3_endpoint, access_key=ACCESS, secret_key=SECRET_KEY, secure=False)
    s3.put_object(BUCKET, context_key, io.BytesIO(context), len(context))
    spec = FunctionSpec.from_user({"name": "hello", "runtime": "python3.11", "entrypoint": "handler.handle"}, 3600)
    ref = FunctionRef(tenant, "hello", spec, code_hash, context_key, Owner(crd.API_VERSION, "Function", "hello", "u"))
    job = manifests.build_job(config, ref)
    real_node.bed.apply(job)
    name = job["metadata"]["name"]

    def finished() -> str | None:
        conditions = (real_node.bed.get("job", name, "-n", build_ns) or {}).get("status", {}).get("conditions", [])
        done = [c["type"] for c in conditions if c["type"] in ("Complete", "Failed") and c["status"] == "True"]
        return done[0] if done else None

    outcome = real_node.bed.wait(f"build Job {name}", finished, timeout=900, interval=2)
    assert outcome == "Complete", build_logs(real_node, build_ns)
    return _pod_of(real_node, build_ns, f"{crd.LABEL_NAMESPACE}={tenant}")


def test_a_build_pushes_to_a_registry_behind_a_login_and_its_install_script_finds_no_credential(
    real_node: RealNode, s3_on_bridge: str, tmp_path: Path
) -> None:
    bed = real_node.bed
    user, password = "sless-push", secrets.token_urlsafe(24)
    cache_password = secrets.token_urlsafe(24)
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    build_ns = build_namespace(real_node)
    try:
        with login_registry(real_node, tmp_path / "registry", user, password) as registry, \
                probe_index(real_node, tmp_path, [password, auth, cache_password]) as requirements:  # fmt: skip
            push_config = {"auths": {registry: {"auth": auth, "username": user, "password": password}}}
            kaniko_config = {"auths": {"cache.test.invalid": {"username": "cache", "password": cache_password}}}
            bed.apply(*({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
                         "metadata": {"name": name, "namespace": build_ns},
                         "stringData": {".dockerconfigjson": json.dumps(content)}}
                        for name, content in (("push", push_config), ("kaniko-only", kaniko_config))))  # fmt: skip
            config = OperatorConfig.from_env({**operator_env(real_node, s3_on_bridge),
                                              "SLESS_REGISTRY": f"{registry}/sless", "SLESS_BUILD_NAMESPACE": build_ns,
                                              "SLESS_BUILD_REGISTRY_SECRET": "push"})  # fmt: skip
            code = tmp_path / "code"
            code.mkdir()
            (code / "handler.py").write_text("def handle(event):\n    return {}\n")
            (code / "requirements.txt").write_text(requirements)
            tenant = f"sless-{secrets.token_hex(8)}"
            start = time.monotonic()
            pod = _build(real_node, config, build_ns, tenant, f"contexts/{tenant}/hello/1.tar.gz", code)
            print(f"build with a push credential (kaniko without): {time.monotonic() - start:.1f}s")
            result = _push_result(pod)
            image = manifests.image_ref(config, tenant, "hello", code_tree_hash(code))
            assert result["image"] == image, result
            repository, tag = image.removeprefix(f"{registry}/").rsplit(":", 1)
            assert requests.get(f"http://{registry}/v2/{repository}/manifests/{tag}", timeout=10).status_code == 401
            report = image_report(registry, repository, tag, (user, password))
            assert report["uid"] == 0 and report["files"] > 100, report  # it ran as root and looked everywhere
            assert report["found"] == [], f"the install script read the push credential: {report['found']}"

            # control: the probe does find a credential kaniko holds (SLESS_BUILD_KANIKO_SECRET, the cache's)
            cached = dataclasses.replace(config, build_kaniko_secret="kaniko-only")
            (code / "handler.py").write_text("def handle(event):\n    return {'control': True}\n")
            other = f"sless-{secrets.token_hex(8)}"
            pod = _build(real_node, cached, build_ns, other, f"contexts/{other}/hello/1.tar.gz", code)
            image = manifests.image_ref(cached, other, "hello", code_tree_hash(code))
            repository, tag = image.removeprefix(f"{registry}/").rsplit(":", 1)
            found = image_report(registry, repository, tag, (user, password))["found"]
            assert any(p.startswith("/kaniko/.docker/") and p.endswith("#2") for p in found), found
            assert not any(p.endswith(("#0", "#1")) for p in found), f"the push credential was readable: {found}"
    finally:
        bed.kubectl("delete", "namespace", build_ns, "--wait=false", check=False)
