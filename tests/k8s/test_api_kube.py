"""The API's Kubernetes backend end to end: the real API process, a real API server, a real S3 server.

The API runs as its own process (uvicorn, ``SLESS_BACKEND=kubernetes``) and is driven over HTTP with
tenant tokens. What it writes is checked in the cluster with kubectl, what it uploads in S3. The
operator is not part of these tests: status is set the way the operator sets it, by patching the
custom resources' status subresource on the API server, and the API must read it back.

The API reaches the API server through :class:`Gate`, a TCP forwarder on loopback that counts the
bytes the API sends and can cut the connection, so tests can prove that invocations cost no API
server request and that an unreachable API server yields 503s instead of 500s.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from sless_core import crd, rebuild
from tests.support.kube_api import HELLO, KubeApi, cr, set_status, start_api, upload_raw, zip_hash
from tests.support.platform import Tenant, make_zip
from tests.support.services import S3Endpoint
from tests.support.testbed import Testbed

pytestmark = pytest.mark.k8s


@pytest.fixture
def tenant(kube_api: KubeApi) -> Tenant:
    t = kube_api.tenant()
    t.api("POST", "/ensure", expect=201)
    return t


# helpers on the cluster side


def context_files(api: KubeApi, key: str) -> dict[str, str]:
    with tarfile.open(fileobj=io.BytesIO(api.store().get_bytes(key)), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


# namespaces and tenancy

def test_ensure_creates_a_labelled_tenant_namespace(kube_api: KubeApi) -> None:
    t = kube_api.tenant()
    assert t.api("POST", "/ensure", expect=201).json() == {"namespace": t.ns, "created": True}
    assert t.api("POST", "/ensure", expect=200).json()["created"] is False
    labels = kube_api.bed.get("namespace", t.ns)["metadata"]["labels"]
    assert labels[crd.LABEL_MANAGED] == crd.MANAGED_BY
    assert labels["sless.dev/tenant"] == "true"
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_another_tenants_namespace_is_forbidden(kube_api: KubeApi, tenant: Tenant) -> None:
    intruder = kube_api.tenant("intruder")
    intruder.ns = tenant.ns  # the intruder's token, the victim's namespace in the path
    body = {"name": "sneaky", "runtime": "python3.11"}
    for method, rest, kw in (("GET", "/functions", {}), ("POST", "/functions", {"json": body}),
                             ("POST", "/ensure", {}), ("POST", "/jobs", {"json": {"name": "j", "function": "x"}})):
        resp = intruder.api(method, rest, **kw)
        assert resp.status_code == 403, (method, rest, resp.text)
    assert cr(kube_api.bed, crd.FUNCTION_PLURAL, tenant.ns, "sneaky") is None


def test_create_without_ensure_creates_the_namespace(kube_api: KubeApi) -> None:
    t = kube_api.tenant()
    t.api("POST", "/functions", json={"name": "first", "runtime": "python3.11"}, expect=201)
    assert kube_api.bed.get("namespace", t.ns)["metadata"]["labels"]["sless.dev/tenant"] == "true"


# functions

def test_function_crud_through_custom_resources(kube_api: KubeApi, tenant: Tenant) -> None:
    bed, ns = kube_api.bed, tenant.ns
    body = {"name": "hello", "runtime": "python3.11", "memory_mb": 256, "env_vars": {"B": "2", "A": "1"}}
    created = tenant.api("POST", "/functions", json=body, expect=201).json()
    assert (created["phase"], created["message"]) == ("Pending", "waiting for code: upload a zip")
    obj = cr(bed, crd.FUNCTION_PLURAL, ns, "hello")
    assert obj is not None
    assert obj["spec"]["runtime"] == "python3.11" and obj["spec"]["memoryMb"] == 256
    assert obj["spec"]["envVars"] == {"A": "1", "B": "2"}
    assert obj["metadata"]["labels"][crd.LABEL_MANAGED] == crd.MANAGED_BY

    dup = tenant.api("POST", "/functions", json={**body, "memory_mb": 512}, expect=409).json()
    assert dup["existing"]["memory_mb"] == 256 and dup["existing"]["name"] == "hello"

    updated = tenant.api("PUT", "/functions/hello", json={"env_vars": {"C": "3"}, "timeout_sec": 120},
                         expect=200).json()
    assert updated["env_vars"] == {"C": "3"} and updated["timeout_sec"] == 120
    obj = cr(bed, crd.FUNCTION_PLURAL, ns, "hello")
    assert obj is not None and obj["spec"]["envVars"] == {"C": "3"} and obj["spec"]["timeoutSec"] == 120
    assert "maxConcurrency" not in obj["spec"]  # 0, the default, is not written
    limited = tenant.api("PUT", "/functions/hello", json={"max_concurrency": 4}, expect=200).json()
    obj = cr(bed, crd.FUNCTION_PLURAL, ns, "hello")
    assert limited["max_concurrency"] == 4 and obj is not None and obj["spec"]["maxConcurrency"] == 4
    assert tenant.api("GET", "/functions/hello", expect=200).json()["max_concurrency"] == 4
    rv = obj["metadata"]["resourceVersion"]
    tenant.api("PUT", "/functions/hello", json={"memory_mb": 1}, expect=400)
    tenant.api("PUT", "/functions/hello", json={"env_vars": {"PORT": "1"}}, expect=400)
    assert cr(bed, crd.FUNCTION_PLURAL, ns, "hello")["metadata"]["resourceVersion"] == rv  # type: ignore[index]

    set_status(bed, crd.FUNCTION_PLURAL, ns, "hello", {
        "phase": "Failed", "message": "build failed:\nno module named x", "observedGeneration": 2})
    got = tenant.api("GET", "/functions/hello", expect=200).json()
    assert (got["phase"], got["message"]) == ("Failed", "build failed:\nno module named x")
    set_status(bed, crd.FUNCTION_PLURAL, ns, "hello", {
        "phase": "Ready", "message": "ready", "image": "registry.local/sless/hello:abc",
        "lastBuiltAt": "2026-11-30T03:00:00Z"})
    got = tenant.api("GET", "/functions/hello", expect=200).json()
    assert (got["phase"], got["image"], got["last_built_at"]) == (
        "Ready", "registry.local/sless/hello:abc", "2026-11-30T03:00:00Z")

    tenant.api("POST", "/functions", json={"name": "second", "runtime": "go1.23"}, expect=201)
    listed = tenant.api("GET", "/functions", expect=200).json()["items"]
    assert [(f["name"], f["phase"]) for f in listed] == [("hello", "Ready"), ("second", "Pending")]
    assert tenant.api("GET", "/functions?limit=1", expect=200).json()["next_cursor"]

    tenant.api("DELETE", "/functions/hello", expect=204)
    assert cr(bed, crd.FUNCTION_PLURAL, ns, "hello") is None
    assert tenant.api("GET", "/functions/hello", expect=404).json()["error"] == "function 'hello' not found"
    tenant.api("DELETE", "/functions/hello", expect=404)
    tenant.api("PUT", "/functions/hello", json={"memory_mb": 256}, expect=404)


def test_scale_without_keda_is_422_and_a_stored_scale_blocks_no_other_change(kube_api: KubeApi,
                                                                            tenant: Tenant) -> None:
    """On a cluster without KEDA the API writes no scale (422 naming it), yet a Function that has one (written
    with kubectl, or before KEDA went away) reads back with it and takes other changes, and its scale can go."""
    bed, ns = kube_api.bed, tenant.ns
    if '"scaledobjects"' in bed.kubectl("get", "--raw", "/apis/keda.sh/v1alpha1", check=False).stdout:
        pytest.skip("this test bed runs KEDA")
    refused = tenant.api("POST", "/functions", json={"name": "elastic", "runtime": "python3.11",
                                                     "scale": {"max": 3}}, expect=422).json()
    assert refused["field"] == "scale" and "scaling needs KEDA" in refused["error"]
    assert cr(bed, crd.FUNCTION_PLURAL, ns, "elastic") is None

    tenant.api("POST", "/functions", json={"name": "elastic", "runtime": "python3.11"}, expect=201)
    assert "scale" not in cr(bed, crd.FUNCTION_PLURAL, ns, "elastic")["spec"]  # type: ignore[index]
    bed.kubectl("patch", f"{crd.FUNCTION_PLURAL}.{crd.GROUP}", "elastic", "-n", ns, "--type=merge", "-p",
                '{"spec": {"scale": {"min": 1, "max": 3, "target": 5, "idleSec": 60}}}')
    scale = {"min": 1, "max": 3, "target": 5, "idle_sec": 60}
    assert tenant.api("GET", "/functions/elastic", expect=200).json()["scale"] == scale
    changed = tenant.api("PATCH", "/functions/elastic", json={"memory_mb": 256}, expect=200).json()
    assert (changed["memory_mb"], changed["scale"]) == (256, scale)
    obj = cr(bed, crd.FUNCTION_PLURAL, ns, "elastic")
    assert obj is not None and obj["spec"]["scale"] == {"min": 1, "max": 3, "target": 5, "idleSec": 60}
    tenant.api("PATCH", "/functions/elastic", json={"scale": {**scale, "max": 4}}, expect=422)
    tenant.api("PATCH", "/functions/elastic", json={"scale": None}, expect=200)
    assert "scale" not in cr(bed, crd.FUNCTION_PLURAL, ns, "elastic")["spec"]  # type: ignore[index]


def test_cluster_schema_rejections_are_400s_not_500s(kube_api: KubeApi, tenant: Tenant) -> None:
    # SLESS_MAX_TIMEOUT_SEC is 7200 in this API, the CRD allows at most 3600: the API server says no.
    resp = tenant.api("POST", "/functions", json={"name": "slow", "runtime": "python3.11", "timeout_sec": 5000},
                      expect=400)
    assert "rejected by the cluster" in resp.json()["error"] and "timeoutSec" in resp.json()["error"]
    assert cr(kube_api.bed, crd.FUNCTION_PLURAL, tenant.ns, "slow") is None


def test_upload_stores_zip_and_context_and_sets_the_code_hash(kube_api: KubeApi, tenant: Tenant) -> None:
    bed, ns, store = kube_api.bed, tenant.ns, kube_api.store()
    tenant.api("POST", "/functions", json={"name": "up", "runtime": "python3.11"}, expect=201)
    data, digest = zip_hash({**HELLO, "requirements.txt": "six==1.16.0\n"})
    record = upload_raw(tenant, "up", data)
    assert record.status_code == 202, record.text
    assert (record.json()["code_hash"], record.json()["phase"]) == (digest, "Building")  # waiting for the operator
    obj = cr(bed, crd.FUNCTION_PLURAL, ns, "up")
    assert obj is not None and obj["spec"]["codeHash"] == digest
    context_key = obj["spec"]["contextKey"]
    assert context_key.startswith(f"contexts/{ns}/up/") and context_key.endswith(f"-{digest[:12]}.tar.gz")
    zips = store.list(f"functions/{ns}/up/")
    assert len(zips) == 1 and store.get_bytes(zips[0]) == data
    # the code alone, fetched by the function's pods and checked against codeSha256
    code_key = obj["spec"]["codeKey"]
    assert code_key.startswith(f"code/{ns}/up/") and code_key.endswith(f"-{digest[:12]}.tar.gz")
    assert obj["spec"]["codeSha256"] == hashlib.sha256(store.get_bytes(code_key)).hexdigest()
    code = context_files(kube_api, code_key)
    assert code == {"handler.py": HELLO["handler.py"], "requirements.txt": "six==1.16.0\n"}
    # the build context installs the dependencies only: no code, so every code change reuses its image
    files = context_files(kube_api, context_key)
    assert set(files) == {"Dockerfile", "function/requirements.txt"}
    assert obj["spec"]["depsHash"] == rebuild.dependency_key("python3.11", {"requirements.txt": b"six==1.16.0\n"})
    assert obj["spec"]["contextSha256"] == hashlib.sha256(store.get_bytes(context_key)).hexdigest()
    assert "FROM sless/python3.11:latest" in files["Dockerfile"]
    assert digest not in files["Dockerfile"] and obj["spec"]["depsHash"] in files["Dockerfile"]
    assert "-r /app/manifest/requirements.txt" in files["Dockerfile"]

    # identical code: nothing is written, so nothing is rebuilt
    rv, generation = obj["metadata"]["resourceVersion"], obj["metadata"]["generation"]
    again = tenant.api("POST", "/functions/up/upload", files={"code": ("c.zip", data, "application/zip")},
                       expect=202).json()
    assert "identical code uploaded: no rebuild" in again["message"]
    obj = cr(bed, crd.FUNCTION_PLURAL, ns, "up")
    assert obj is not None and (obj["metadata"]["resourceVersion"], obj["metadata"]["generation"]) == (rv, generation)
    assert len(store.list(f"functions/{ns}/up/")) == 1

    source = tenant.api("GET", "/functions/up/source", expect=200).json()["files"]
    assert [f["name"] for f in source] == ["handler.py", "requirements.txt"]

    # the operator reports the build of this code; then new code arrives: not Ready until rebuilt
    set_status(bed, crd.FUNCTION_PLURAL, ns, "up", {"phase": "Ready", "message": "ready", "codeHash": digest,
                                                    "image": "r/up:1", "observedGeneration": generation})
    assert tenant.api("GET", "/functions/up", expect=200).json()["phase"] == "Ready"
    data2, digest2 = zip_hash({"handler.py": "def handle(event):\n    return 'v2'\n"})
    after = upload_raw(tenant, "up", data2).json()
    assert (after["code_hash"], after["phase"]) == (digest2, "Building")
    obj = cr(bed, crd.FUNCTION_PLURAL, ns, "up")
    # no requirements.txt any more: no build context, the runtime's image runs the new code
    assert obj is not None and obj["spec"]["codeHash"] == digest2 and obj["spec"]["codeKey"] != code_key
    assert (obj["spec"]["contextKey"], obj["spec"]["depsHash"]) == ("", "")
    assert obj["metadata"]["generation"] == generation + 1
    assert [f["content"] for f in tenant.api("GET", "/functions/up/source", expect=200).json()["files"]] == [
        "def handle(event):\n    return 'v2'\n"]
    assert len(store.list(f"contexts/{ns}/up/")) == 1 and len(store.list(f"code/{ns}/up/")) == 2


def test_bad_zips_are_refused_and_change_nothing(kube_api: KubeApi, tenant: Tenant) -> None:
    bed, ns, store = kube_api.bed, tenant.ns, kube_api.store()
    tenant.api("POST", "/functions", json={"name": "bad", "runtime": "python3.11"}, expect=201)
    rv = cr(bed, crd.FUNCTION_PLURAL, ns, "bad")["metadata"]["resourceVersion"]  # type: ignore[index]
    for data in (b"this is not a zip", make_zip({"../escape.py": "x = 1\n"}), make_zip({"/etc/passwd": "x"})):
        resp = upload_raw(tenant, "bad", data)
        assert resp.status_code == 400, resp.text
        assert "error" in resp.json()
    assert cr(bed, crd.FUNCTION_PLURAL, ns, "bad")["metadata"]["resourceVersion"] == rv  # type: ignore[index]
    assert store.list(f"functions/{ns}/bad/") == [] and store.list(f"contexts/{ns}/bad/") == []
    assert tenant.api("GET", "/functions/bad/source", expect=200).json() == {"files": []}
    assert upload_raw(tenant, "missing", make_zip(HELLO)).status_code == 404


def test_runtime_change_regenerates_the_build_context(kube_api: KubeApi, tenant: Tenant) -> None:
    bed, ns = kube_api.bed, tenant.ns
    tenant.api("POST", "/functions", json={"name": "poly", "runtime": "python3.11"}, expect=201)
    data, digest = zip_hash({"handler.js": "exports.handle = async () => 'hi'\n", "package.json": "{}",
                             "requirements.txt": "six\n", **HELLO})  # fmt: skip
    upload_raw(tenant, "poly", data)
    before = cr(bed, crd.FUNCTION_PLURAL, ns, "poly")["spec"]["contextKey"]  # type: ignore[index]
    tenant.api("PUT", "/functions/poly", json={"runtime": "nodejs20"}, expect=200)
    spec = cr(bed, crd.FUNCTION_PLURAL, ns, "poly")["spec"]  # type: ignore[index]
    assert spec["runtime"] == "nodejs20" and spec["codeHash"] == digest and spec["contextKey"] != before
    dockerfile = context_files(kube_api, spec["contextKey"])["Dockerfile"]
    assert "FROM sless/nodejs20:latest" in dockerfile and "npm install" in dockerfile
    assert spec["contextSha256"] == hashlib.sha256(kube_api.store().get_bytes(spec["contextKey"])).hexdigest()
    tenant.api("PUT", "/functions/poly", json={"memory_mb": 512}, expect=200)
    assert cr(bed, crd.FUNCTION_PLURAL, ns, "poly")["spec"]["contextKey"] == spec["contextKey"]  # type: ignore[index]


# triggers

def test_trigger_crud_through_custom_resources(kube_api: KubeApi, tenant: Tenant) -> None:
    bed, ns = kube_api.bed, tenant.ns
    fn = tenant.api("POST", "/functions", json={"name": "tfn", "runtime": "python3.11"}, expect=201).json()
    assert fn["name"] == "tfn"
    uid = cr(bed, crd.FUNCTION_PLURAL, ns, "tfn")["metadata"]["uid"]  # type: ignore[index]
    web = tenant.api("POST", "/triggers", json={"name": "web", "type": "http", "function": "tfn"},
                     expect=201).json()
    assert web["url"].endswith(f"/fn/{ns}/tfn") and web["enabled"] is True
    obj = cr(bed, crd.TRIGGER_PLURAL, ns, "web")
    assert obj is not None
    assert obj["spec"] == {"type": "http", "function": "tfn", "enabled": True, "auth": "public"}
    assert obj["metadata"]["ownerReferences"][0]["uid"] == uid
    assert obj["metadata"]["labels"][crd.LABEL_FUNCTION] == "tfn"

    tenant.api("POST", "/triggers", json={"name": "web", "type": "http", "function": "tfn"}, expect=409)
    tenant.api("POST", "/triggers", json={"name": "orphan", "type": "http", "function": "nope"}, expect=404)
    resp = tenant.api("POST", "/triggers", json={"name": "q", "type": "event", "function": "tfn", "queue": "jobs"},
                      expect=422)
    assert "SLESS_RABBITMQ_URL" in resp.json()["error"]
    assert cr(bed, crd.TRIGGER_PLURAL, ns, "q") is None

    patched = tenant.api("PATCH", "/triggers/web", json={"enabled": False, "auth": "token"}, expect=200).json()
    assert (patched["enabled"], patched["auth"]) == (False, "token")
    assert cr(bed, crd.TRIGGER_PLURAL, ns, "web")["spec"]["enabled"] is False  # type: ignore[index]
    tenant.api("PATCH", "/triggers/web", json={"type": "cron"}, expect=400)

    cron = tenant.api("POST", "/triggers", json={"name": "nightly", "type": "cron", "function": "tfn",
                                                 "schedule": "0 3 * * *"}, expect=201).json()
    assert cron["schedule"] == "0 3 * * *"
    assert cr(bed, crd.TRIGGER_PLURAL, ns, "nightly")["spec"]["schedule"] == "0 3 * * *"  # type: ignore[index]
    set_status(bed, crd.TRIGGER_PLURAL, ns, "nightly", {"lastFiredAt": "2026-11-30T03:00:00Z", "message": "fired"})
    got = tenant.api("GET", "/triggers/nightly", expect=200).json()
    assert (got["last_fired_at"], got["message"]) == ("2026-11-30T03:00:00Z", "fired")

    # moving a trigger to another function moves its owner reference
    tenant.api("POST", "/functions", json={"name": "tfn2", "runtime": "python3.11"}, expect=201)
    uid2 = cr(bed, crd.FUNCTION_PLURAL, ns, "tfn2")["metadata"]["uid"]  # type: ignore[index]
    tenant.api("PATCH", "/triggers/web", json={"function": "tfn2"}, expect=200)
    obj = cr(bed, crd.TRIGGER_PLURAL, ns, "web")
    assert obj is not None and [r["uid"] for r in obj["metadata"]["ownerReferences"]] == [uid2]
    assert obj["metadata"]["labels"][crd.LABEL_FUNCTION] == "tfn2"

    names = [t["name"] for t in tenant.api("GET", "/triggers", expect=200).json()["items"]]
    assert names == ["nightly", "web"]
    tenant.api("DELETE", "/triggers/nightly", expect=204)
    assert cr(bed, crd.TRIGGER_PLURAL, ns, "nightly") is None
    tenant.api("DELETE", "/triggers/nightly", expect=404)


def test_event_triggers_are_accepted_when_rabbitmq_is_configured(
        k8s_testbed: Testbed, s3_endpoint: S3Endpoint, tmp_path: Path) -> None:
    api = start_api(k8s_testbed, s3_endpoint, tmp_path, {"SLESS_RABBITMQ_URL": "amqp://guest:guest@127.0.0.1:1/"})
    try:
        t = api.tenant()
        t.api("POST", "/functions", json={"name": "consumer", "runtime": "python3.11"}, expect=201)
        t.api("POST", "/triggers", json={"name": "q", "type": "event", "function": "consumer", "queue": "orders"},
              expect=201)
        assert cr(k8s_testbed, crd.TRIGGER_PLURAL, t.ns, "q")["spec"]["queue"] == "orders"  # type: ignore[index]
    finally:
        assert api.stop(), api.log_tail()
        api.gate.close()


# jobs

def test_job_lifecycle_and_run_id_semantics(kube_api: KubeApi, tenant: Tenant) -> None:
    bed, ns = kube_api.bed, tenant.ns
    tenant.api("POST", "/functions", json={"name": "worker", "runtime": "python3.11"}, expect=201)
    job = tenant.api("POST", "/jobs", json={"name": "once", "function": "worker", "event": {"n": 7}},
                     expect=201).json()
    assert (job["phase"], job["run_id"]) == ("Pending", 1)
    obj = cr(bed, crd.JOB_PLURAL, ns, "once")
    assert obj is not None and obj["spec"] == {"function": "worker", "runId": 1, "event": {"n": 7}}
    assert obj["metadata"]["ownerReferences"][0]["name"] == "worker"

    set_status(bed, crd.JOB_PLURAL, ns, "once", {"phase": "Running", "runId": 1,
                                                 "startTime": "2026-11-30T03:00:00Z"})
    dup = tenant.api("POST", "/jobs", json={"name": "once", "function": "worker"}, expect=409).json()
    assert (dup["existing"]["phase"], dup["existing"]["started_at"]) == ("Running", "2026-11-30T03:00:00Z")
    busy = tenant.api("PATCH", "/jobs/once", json={"run_id": 2}, expect=409).json()
    assert busy["existing"]["phase"] == "Running"

    set_status(bed, crd.JOB_PLURAL, ns, "once", {"phase": "Succeeded", "runId": 1, "message": "{\"sum\": 7}",
                                                 "completionTime": "2026-11-30T03:00:05Z"})
    done = tenant.api("GET", "/jobs/once", expect=200).json()
    assert (done["phase"], done["message"], done["completed_at"]) == ("Succeeded", "{\"sum\": 7}",
                                                                      "2026-11-30T03:00:05Z")
    assert tenant.api("PATCH", "/jobs/once", json={"run_id": 1}, expect=200).json()["phase"] == "Succeeded"
    rerun = tenant.api("PATCH", "/jobs/once", json={"run_id": 2}, expect=200).json()
    assert (rerun["run_id"], rerun["phase"], rerun["message"]) == (2, "Pending", "")
    assert cr(bed, crd.JOB_PLURAL, ns, "once")["spec"]["runId"] == 2  # type: ignore[index]
    tenant.api("PATCH", "/jobs/once", json={"run_id": 1}, expect=400)
    set_status(bed, crd.JOB_PLURAL, ns, "once", {"phase": "Failed", "runId": 2, "message": "ZeroDivisionError"})
    assert tenant.api("PATCH", "/jobs/once", json={"run_id": 1}, expect=400).json()["field"] == "run_id"
    assert tenant.api("GET", "/jobs/once", expect=200).json()["phase"] == "Failed"

    recorded = tenant.api("POST", "/jobs", json={"name": "later", "function": "worker", "run_id": 0},
                          expect=201).json()
    assert recorded["phase"] == "Recorded"
    assert cr(bed, crd.JOB_PLURAL, ns, "later")["spec"]["runId"] == 0  # type: ignore[index]
    listed = tenant.api("GET", "/jobs?limit=1", expect=200).json()
    assert [j["name"] for j in listed["items"]] == ["later"] and listed["next_cursor"]
    rest = tenant.api("GET", "/jobs", params={"cursor": listed["next_cursor"]}, expect=200).json()
    assert [(j["name"], j["phase"]) for j in rest["items"]] == [("once", "Failed")] and rest["next_cursor"] is None
    tenant.api("POST", "/jobs", json={"name": "ghost", "function": "nope"}, expect=404)
    tenant.api("DELETE", "/jobs/later", expect=204)
    assert cr(bed, crd.JOB_PLURAL, ns, "later") is None
    tenant.api("GET", "/jobs/later", expect=404)


def test_deleting_a_function_removes_its_triggers_jobs_and_code(kube_api: KubeApi, tenant: Tenant) -> None:
    bed, ns, store = kube_api.bed, tenant.ns, kube_api.store()
    tenant.api("POST", "/functions", json={"name": "doomed", "runtime": "python3.11"}, expect=201)
    tenant.api("POST", "/functions", json={"name": "bystander", "runtime": "python3.11"}, expect=201)
    upload_raw(tenant, "doomed", make_zip(HELLO))
    upload_raw(tenant, "bystander", make_zip(HELLO))
    tenant.api("POST", "/triggers", json={"name": "doomed-web", "type": "http", "function": "doomed"}, expect=201)
    tenant.api("POST", "/triggers", json={"name": "keep-web", "type": "http", "function": "bystander"}, expect=201)
    tenant.api("POST", "/jobs", json={"name": "doomed-job", "function": "doomed"}, expect=201)
    # one made with kubectl, without an owner reference
    bed.apply({"apiVersion": crd.API_VERSION, "kind": "Trigger", "metadata": {"name": "manual", "namespace": ns},
               "spec": {"type": "http", "function": "doomed"}})
    tenant.api("DELETE", "/functions/doomed", expect=204)
    for plural, name in ((crd.FUNCTION_PLURAL, "doomed"), (crd.TRIGGER_PLURAL, "doomed-web"),
                         (crd.TRIGGER_PLURAL, "manual"), (crd.JOB_PLURAL, "doomed-job")):
        bed.wait(f"{plural}/{name} gone", lambda p=plural, n=name: cr(bed, p, ns, n) is None, timeout=30)
    assert store.list(f"functions/{ns}/doomed/") == [] and store.list(f"contexts/{ns}/doomed/") == []
    assert cr(bed, crd.TRIGGER_PLURAL, ns, "keep-web") is not None
    assert len(store.list(f"functions/{ns}/bystander/")) == 1
