"""Code fetched at pod start, images only for dependencies, on a real apiserver with kwok pods.

Real: the apiserver (Pod Security ``restricted`` admits the runtime container that fetches its own code into
its code volume, and the fetch-code init container with the read-only code mount of a function on a
dependency image), the Deployment/ReplicaSet/Job controllers, the operator. kwok runs no containers: a Stage
decides that the runtime container exits 3 with the reason, as ``sless_fetch`` does on a SHA-256 mismatch.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from tests.support.stages import FETCH_FAILED
from tests.support.testbed import Testbed

if TYPE_CHECKING:
    from tests.support.kube_operator import Sless

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

CODE_1, CODE_2 = "1a" * 32, "2b" * 32
DEPS_X, DEPS_Y = "d1" * 32, "e2" * 32


def fetched(sless: Sless, name: str, code: str, deps: str = "", **spec: Any) -> None:
    key = f"code/{sless.ns}/{name}/{code[:8]}.tar.gz"
    body: dict[str, Any] = {"runtime": "python3.11", "codeHash": code, "codeKey": key, "codeSha256": code[::-1],
                            **spec}  # fmt: skip
    if deps:
        body.update(depsHash=deps, contextKey=f"contexts/{sless.ns}/{name}/{deps[:8]}.tar.gz", contextSha256=deps)
    sless.apply("Function", name, body)


def pod_spec(sless: Sless, name: str) -> dict[str, Any]:
    dep = sless.get("deployment", name)
    assert dep is not None
    return dict(dep["spec"]["template"]["spec"])


def deps_jobs(sless: Sless) -> list[dict[str, Any]]:
    return sless.labelled("jobs", f"sless.dev/component=build,sless.dev/namespace={sless.ns}", sless.op.build_namespace)


def test_code_only_change_rolls_out_without_a_build(sless: Sless) -> None:
    fetched(sless, "quick", CODE_1)
    status = sless.wait_phase("Function", "quick", "Ready")["status"]
    assert status["image"] == "runtimes.test.invalid/sless/python3.11:latest" and status["codeHash"] == CODE_1
    pod = pod_spec(sless, "quick")
    assert "initContainers" not in pod  # the Python runtime fetches its code itself
    [container] = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["SLESS_CODE_SHA256"]["value"] == CODE_1[::-1] and "envFrom" not in container
    assert env["SLESS_CODE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "sless-code-quick"  # no S3 credential
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "code"]
    assert mount == {"name": "code", "mountPath": "/app/function"}
    secret = sless.get("secret", "sless-code-quick")
    assert secret is not None and secret["metadata"]["ownerReferences"][0]["kind"] == "Function"
    assert status["codeUrl"]["key"] == f"code/{sless.ns}/quick/{CODE_1[:8]}.tar.gz"

    fetched(sless, "quick", CODE_2)
    body = sless.wait_phase("Function", "quick", "Ready")
    assert body["status"]["codeHash"] == CODE_2
    template = sless.get("deployment", "quick")["spec"]["template"]
    assert template["metadata"]["labels"]["sless.dev/code-hash"] == CODE_2[:16]
    assert {"name": "SLESS_CODE_SHA256", "value": CODE_2[::-1]} in template["spec"]["containers"][0]["env"]
    assert deps_jobs(sless) == [], "a code-only change built something"
    # the new pods are up (kwok: Ready), the old ReplicaSet scaled down
    pods = sless.labelled("pods", "sless.dev/function=quick")
    assert any(p["metadata"]["labels"].get("sless.dev/code-hash") == CODE_2[:16] for p in pods)


def test_dependencies_build_once_per_manifest_and_are_shared(sless: Sless) -> None:
    fetched(sless, "first", CODE_1, DEPS_X)
    status = sless.wait_phase("Function", "first", "Ready")["status"]
    image = f"registry.test.invalid/sless/{sless.ns}/deps:{DEPS_X[:32]}"
    assert status["image"] == image
    assert len(deps_jobs(sless)) == 1

    fetched(sless, "second", CODE_2, DEPS_X)  # other code, same manifest
    assert sless.wait_phase("Function", "second", "Ready")["status"]["image"] == image
    assert len(deps_jobs(sless)) == 1, "the same manifest built a second image"

    fetched(sless, "first", CODE_2, DEPS_X)  # code-only change of a function with dependencies
    assert sless.wait_phase("Function", "first", "Ready")["status"]["codeHash"] == CODE_2
    assert len(deps_jobs(sless)) == 1

    fetched(sless, "first", CODE_2, DEPS_Y)  # a dependency change builds
    status = sless.wait_phase("Function", "first", "Ready")["status"]
    assert status["image"] == f"registry.test.invalid/sless/{sless.ns}/deps:{DEPS_Y[:32]}"
    assert len(deps_jobs(sless)) == 2
    pod = pod_spec(sless, "first")
    assert pod["containers"][0]["image"] == status["image"]
    # a dependency image may have been built on an older runtime image: the init container fetches its code
    [init] = pod["initContainers"]
    assert init["name"] == "fetch-code" and f"--sha256={CODE_2[::-1]}" in init["args"] and "envFrom" not in init
    assert init["env"][0]["valueFrom"]["secretKeyRef"]["name"] == "sless-code-first"
    [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "code"]
    assert mount == {"name": "code", "mountPath": "/app/function", "subPath": "function", "readOnly": True}


@pytest.fixture
def fetch_code_fails(k8s_testbed: Testbed) -> Iterator[Any]:
    made: list[str] = []

    def make(namespace: str, function: str, message: str) -> None:
        name = f"sless-code-fails-{secrets.token_hex(4)}"
        expressions = [
            {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
            {"key": ".status.phase", "operator": "In", "values": ["Pending"]},
            {"key": ".metadata.namespace", "operator": "In", "values": [namespace]},
            {"key": '.metadata.labels["sless.dev/function"]', "operator": "In", "values": [function]},
            {"key": '.metadata.labels["sless.dev/code-hash"]', "operator": "In", "values": [CODE_2[:16]]},
        ]
        k8s_testbed.apply_stage(name, expressions, FETCH_FAILED % {"message": json.dumps(message)})
        made.append(name)

    try:
        yield make
    finally:
        for name in made:
            k8s_testbed.delete_stage(name)


def test_a_pod_that_cannot_fetch_its_code_fails_the_function_with_the_reason(
    sless: Sless, fetch_code_fails: Any
) -> None:
    fetched(sless, "broken", CODE_1)
    sless.wait_phase("Function", "broken", "Ready")
    reason = f"code archive: code archive code/{sless.ns}/broken/x.tar.gz has SHA-256 {'0' * 64}, expected"
    fetch_code_fails(sless.ns, "broken", reason)
    fetched(sless, "broken", CODE_2)
    status = sless.wait_phase("Function", "broken", "Failed", timeout=120)["status"]
    assert reason in status["message"], status
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "RolloutFailed")
    # the old version's pod keeps serving (zero downtime: maxUnavailable 0)
    pods = sless.labelled("pods", "sless.dev/function=broken")
    assert any(p["metadata"]["labels"].get("sless.dev/code-hash") == CODE_1[:16] for p in pods)


def test_a_function_cannot_name_another_tenants_code(sless: Sless) -> None:
    """Pods get a URL signed for the Function's own code key only; a key of another tenant or function
    is refused before anything is signed or deployed."""
    other = f"code/sless-{'f' * 16}/thief/{CODE_1[:8]}.tar.gz"
    sless.apply("Function", "thief", {"runtime": "python3.11", "codeHash": CODE_1, "codeKey": other,
                                      "codeSha256": CODE_1[::-1]})  # fmt: skip
    status = sless.wait_phase("Function", "thief", "Failed")["status"]
    assert "codeKey must be code/" in status["message"] and "its own code" in status["message"]
    assert sless.get("deployment", "thief") is None and sless.get("secret", "sless-code-thief") is None
    sibling = f"code/{sless.ns}/victim/{CODE_1[:8]}.tar.gz"  # the same tenant's other function
    sless.apply("Function", "thief", {"runtime": "python3.11", "codeHash": CODE_2, "codeKey": sibling,
                                      "codeSha256": CODE_1[::-1]})  # fmt: skip
    status = sless.wait_phase("Function", "thief", "Failed")["status"]
    assert "its own code" in status["message"] and sless.get("secret", "sless-code-thief") is None
