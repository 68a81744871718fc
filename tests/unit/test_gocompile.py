"""A Go function's code-only change compiles in a Job and its pods fetch the binary: the pure parts.

The compile Job and the Deployment of a compiled function are checked as built (Pod Security
``restricted``, no S3 credential, the right URLs in the right containers); the upload and fetch of a
binary run for real against the S3 test server through URLs the operator's signer makes.
tests/k8s/test_operator_gocompile.py drives the same through a real apiserver,
tests/realnode/test_realnode_gocompile.py on a real kubelet.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import secrets
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from sless_core import crd
from sless_core.buildcontext import make_deps_context
from sless_core.models import FunctionSpec
from sless_operator import binaryupload, codeurl, contextfetch, manifests
from sless_operator.config import OperatorConfig
from sless_operator.manifests import FunctionRef, Owner
from tests.support.services import S3Endpoint

NS = "sless-0123456789abcdef"
CODE_SHA = "c0" * 32
BIN_SHA = "b1" * 32
CONFIG = OperatorConfig(registry="registry.test/sless", s3_endpoint="http://minio:9000",
                        go_run_image="registry.test/static:nonroot", build_fetch_image="registry.test/platform:1")
BUILDER = "registry.test/sless/go1.23:latest"


def go_ref(name: str = "hello", entrypoint: str = "Handle", **fields: Any) -> FunctionRef:
    return FunctionRef(namespace=NS, name=name, spec=FunctionSpec(name=name, runtime="go1.23", entrypoint=entrypoint),
                       code_hash="ab" * 32, context_key="", owner=Owner(crd.API_VERSION, "Function", name, "uid-1"),
                       code_key=f"code/{NS}/{name}/0001-ab.tar.gz", code_sha256=CODE_SHA, **fields)  # fmt: skip


def all_containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def assert_restricted(pod: dict[str, Any]) -> None:
    """Pod Security ``restricted``, for every container (init containers too)."""
    assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    assert pod["automountServiceAccountToken"] is False
    for volume in pod["volumes"]:
        assert set(volume) <= {"name", "emptyDir", "projected"}, volume
    for c in all_containers(pod):
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0
        assert "envFrom" not in c  # no Secret's keys: no S3 credential anywhere


# -- the binary's key and the Job's name ------------------------------------------------------------------


def test_the_binary_key_names_what_it_is_compiled_from() -> None:
    ref = go_ref()
    key = manifests.binary_key(ref, BUILDER)
    assert key == manifests.binary_key(go_ref(), BUILDER)  # a retried reconcile finds the same binary
    assert key.startswith(f"binaries/{NS}/hello/0001-ab-") and key.endswith(".tar.gz")
    others = {manifests.binary_key(go_ref(entrypoint="Other"), BUILDER),
              manifests.binary_key(ref, "registry.test/sless/ns/deps:1"),
              manifests.binary_key(dataclasses.replace(ref, code_sha256="c1" * 32), BUILDER),
              manifests.binary_key(dataclasses.replace(ref, code_key=f"code/{NS}/hello/0002-ab.tar.gz"), BUILDER)}
    assert key not in others and len(others) == 4
    longest = go_ref(name="f" * 40)  # sless_core.naming.NAME_MAX
    assert len(manifests.compile_job_name(longest, manifests.binary_key(longest, BUILDER))) <= 63


def test_a_function_ref_takes_only_its_own_binary_from_the_status() -> None:
    def body(binary: Any) -> dict[str, Any]:
        return {"apiVersion": crd.API_VERSION, "kind": "Function",
                "metadata": {"name": "hello", "namespace": NS, "uid": "u"},
                "spec": {"runtime": "go1.23", "entrypoint": "Handle", "codeHash": "ab" * 32,
                         "codeKey": f"code/{NS}/hello/1.tar.gz", "codeSha256": CODE_SHA},
                "status": {"binary": binary}}  # fmt: skip

    own = FunctionRef.of(body({"key": f"binaries/{NS}/hello/1-x.tar.gz", "sha256": BIN_SHA}))
    assert (own.compiled, own.fetch_key, own.fetch_sha256) == (True, f"binaries/{NS}/hello/1-x.tar.gz", BIN_SHA)
    for bad in ({"key": f"binaries/{NS}/other/1-x.tar.gz", "sha256": BIN_SHA},
                {"key": f"code/{NS}/hello/1.tar.gz", "sha256": BIN_SHA},
                {"key": f"binaries/{NS}/hello/1-x.tar.gz", "sha256": "short"}, "not a map"):  # fmt: skip
        assert FunctionRef.of(body(bad)).fetch_key == "", bad


def test_the_status_remembers_the_last_binaries_compiled() -> None:
    known: dict[str, str] = {}
    for i in range(manifests.KEEP_BINARIES + 2):
        known = manifests.remember_binary(known, f"binaries/{NS}/hello/{i}.tar.gz", f"{i:064x}")
    assert len(known) == manifests.KEEP_BINARIES and list(known)[-1] == f"binaries/{NS}/hello/11.tar.gz"
    again = manifests.remember_binary(known, f"binaries/{NS}/hello/5.tar.gz", "5" * 64)
    assert list(again)[-1] == f"binaries/{NS}/hello/5.tar.gz" and len(again) == manifests.KEEP_BINARIES
    assert manifests.known_binaries({"binaries": {"k": "short", "j": "a" * 64, "x": 3}}) == {"j": "a" * 64}
    assert manifests.known_binaries({"binaries": ["not", "a", "map"]}) == {}


# -- the compile Job ------------------------------------------------------------------------------------


def test_the_compile_job_fetches_compiles_and_uploads_in_the_tenant_namespace_under_restricted() -> None:
    ref = go_ref()
    key = manifests.binary_key(ref, BUILDER)
    job = manifests.compile_job(CONFIG, ref, BUILDER, key, "http://s3/get?sig", "http://s3/put?sig")
    meta, spec = job["metadata"], job["spec"]
    assert meta["namespace"] == NS and meta["name"] == manifests.compile_job_name(ref, key)
    assert meta["ownerReferences"][0]["kind"] == "Function"
    assert meta["labels"]["sless.dev/component"] == "compile"
    assert spec["backoffLimit"] == 0 and spec["activeDeadlineSeconds"] == CONFIG.build_deadline_sec
    pod = spec["template"]["spec"]
    assert_restricted(pod)
    fetch, compile_ = pod["initContainers"]
    [upload] = pod["containers"]
    assert fetch["image"] == upload["image"] == CONFIG.build_fetch_image
    assert fetch["env"] == [{"name": "SLESS_CODE_URL", "value": "http://s3/get?sig"}]
    assert f"--sha256={CODE_SHA}" in fetch["args"] and f"--key={ref.code_key}" in fetch["args"]
    assert compile_["image"] == BUILDER
    assert compile_["command"] == ["/app/runtime/build.sh", "/workspace/function", "/workspace/out"]
    env = {e["name"]: e["value"] for e in compile_["env"]}
    assert env["GOPROXY"] == "off" and env["GOSUMDB"] == "off"  # the compile reaches no network
    assert env["SLESS_ENTRYPOINT"] == "Handle"
    assert compile_["securityContext"]["runAsUser"] == 1000  # the runtime image's build cache is its user's
    assert compile_["terminationMessagePolicy"] == "FallbackToLogsOnError"  # the compiler's messages
    assert upload["env"] == [{"name": "SLESS_PUT_URL", "value": "http://s3/put?sig"}]
    assert f"--key={key}" in upload["args"]
    assert all("SLESS_PUT_URL" not in json.dumps(c) for c in (fetch, compile_))


def test_a_compiled_function_runs_its_fetched_binary_on_the_go_run_image() -> None:
    ref = dataclasses.replace(go_ref(), binary_key=f"binaries/{NS}/hello/1-x.tar.gz", binary_sha256=BIN_SHA)
    dep = manifests.deployment(CONFIG, ref, CONFIG.go_run_image, 1)
    pod = dep["spec"]["template"]["spec"]
    assert_restricted(pod)
    [fetch] = pod["initContainers"]
    assert f"--key={ref.binary_key}" in fetch["args"] and f"--sha256={BIN_SHA}" in fetch["args"]
    assert fetch["env"][0]["valueFrom"]["secretKeyRef"]["name"] == "sless-code-hello"
    [fn] = pod["containers"]
    assert fn["image"] == CONFIG.go_run_image and fn["command"] == ["/app/bin/server"]
    assert {"name": "code", "mountPath": "/app/bin", "subPath": "function", "readOnly": True} in fn["volumeMounts"]
    assert fn["securityContext"]["runAsUser"] == 65532 and fn["securityContext"]["readOnlyRootFilesystem"]
    run = manifests.run_job(CONFIG, ref, CONFIG.go_run_image, Owner(crd.API_VERSION, "FunctionJob", "j", "u"), 1, {})
    assert run["spec"]["template"]["spec"]["containers"][0]["command"] == ["/app/bin/runner"]
    # another binary is another pod template: the rollout of a code change
    other = dataclasses.replace(ref, binary_key=f"binaries/{NS}/hello/2-y.tar.gz", binary_sha256="b2" * 32)
    again = manifests.deployment(CONFIG, other, CONFIG.go_run_image, 1)
    assert again["metadata"]["annotations"][manifests.SPEC_HASH] != dep["metadata"]["annotations"][manifests.SPEC_HASH]


def test_a_go_dependency_image_downloads_and_compiles_the_modules_for_the_runtime_user() -> None:
    data = make_deps_context("go1.23", {"go.mod": b"module x\n", "go.sum": b""}, "sless/go1.23:latest", "k" * 64)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        member = tar.extractfile("Dockerfile")
        assert member is not None
        dockerfile = member.read().decode()
        assert sorted(tar.getnames()) == ["Dockerfile", "function", "function/go.mod", "function/go.sum"]
    assert dockerfile.splitlines()[1] == "FROM sless/go1.23:latest"
    assert "go mod download all && for m in $(go list -m" in dockerfile and "chown -R 1000:1000 /app/go" in dockerfile
    assert "COPY function/ " not in dockerfile and dockerfile.rstrip().endswith("USER 1000:1000")


# -- upload and fetch, for real ---------------------------------------------------------------------------


def test_binaryupload_refuses_a_missing_binary_and_a_missing_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SLESS_PUT_URL", raising=False)
    assert binaryupload.main([f"--src={tmp_path}", "--url-env=SLESS_PUT_URL", "--key=k"]) == 2
    monkeypatch.setenv("SLESS_PUT_URL", "http://127.0.0.1:9/put")
    assert binaryupload.main([f"--src={tmp_path}", "--url-env=SLESS_PUT_URL", "--key=k"]) == 1
    assert "the compile step left no binary" in capsys.readouterr().err
    (tmp_path / "server").write_bytes(b"x" * 10)
    (tmp_path / "runner").write_bytes(b"x" * 10)
    assert binaryupload.main([f"--src={tmp_path}", "--url-env=SLESS_PUT_URL", "--key=k", "--max-bytes=15"]) == 1
    assert "larger than 15 bytes" in capsys.readouterr().err
    monkeypatch.setenv("SLESS_PUT_URL", "file:///etc/passwd")
    assert binaryupload.main([f"--src={tmp_path}", "--url-env=SLESS_PUT_URL", "--key=k"]) == 1
    assert "not http(s)" in capsys.readouterr().err


@pytest.mark.s3
def test_a_binary_goes_up_through_a_put_url_and_comes_down_verified(s3_endpoint: S3Endpoint, tmp_path: Path) -> None:
    from minio import Minio

    bucket = f"bin-{secrets.token_hex(6)}"
    Minio(s3_endpoint.endpoint, access_key=s3_endpoint.access_key, secret_key=s3_endpoint.secret_key,
          secure=False).make_bucket(bucket)  # fmt: skip
    config = OperatorConfig(s3_endpoint=s3_endpoint.endpoint, s3_bucket=bucket, s3_access_key=s3_endpoint.access_key,
                            s3_secret_key=s3_endpoint.secret_key)  # fmt: skip
    signer = codeurl.Signer(config)
    out = tmp_path / "out"
    out.mkdir()
    binary = bytes(range(256)) * 64
    (out / "server").write_bytes(binary)
    (out / "runner").write_bytes(binary)
    key = f"binaries/{NS}/hello/1-x.tar.gz"
    env = {"SLESS_PUT_URL": signer.sign_put(key, 300), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "sless_operator.binaryupload", f"--src={out}",
                           "--url-env=SLESS_PUT_URL", f"--key={key}"], env=env, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    stored = Minio(s3_endpoint.endpoint, access_key=s3_endpoint.access_key, secret_key=s3_endpoint.secret_key,
                   secure=False).get_object(bucket, key).read()  # fmt: skip
    assert hashlib.sha256(stored).hexdigest() == result["sha256"] and len(stored) == result["bytes"]
    dest = tmp_path / "ws" / "function"
    source = contextfetch.UrlSource(signer.sign(key, 300))
    contextfetch.fetch(source, "", key, dest, result["sha256"], contextfetch.Limits(what="binary"))
    for name in ("server", "runner"):
        assert (dest / name).read_bytes() == binary and (dest / name).stat().st_mode & 0o777 == 0o755
    with pytest.raises(contextfetch.FetchError, match="has SHA-256"):
        contextfetch.fetch(source, "", key, tmp_path / "ws2" / "function", "0" * 64, contextfetch.Limits())
