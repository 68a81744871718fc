"""A Go function's code change compiles in a Job of the tenant namespace, not in a kaniko build.

Real: the apiserver (Pod Security ``restricted`` admits the compile Job's pods and the function's
pods that fetch the binary), the Job, Deployment and ReplicaSet controllers, the operator. kwok runs
no containers: a Stage ends each compile pod as ``binaryupload`` would (its termination message
names the binary's SHA-256), or as a compile error does (the ``compile`` init container exits 1 with
the compiler's messages).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from sless_core.traffic import other_version_name
from tests.support.testbed import Testbed

if TYPE_CHECKING:
    from tests.support.kube_operator import Sless

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

CODE_1, CODE_2, CODE_BAD = "1a" * 32, "2b" * 32, "3c" * 32
BIN_1, BIN_2 = "b1" * 32, "b2" * 32
DEPS = "d1" * 32
GO_RUN_IMAGE = "gcr.io/distroless/static-debian12:nonroot"

# the compile pod as it ends: fetch-code and compile done, upload-binary's message names the binary
_COMPILED = """\
{{ $now := Now }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Initialized
initContainerStatuses:
{{ range .spec.initContainers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: true
  restartCount: 0
  state:
    terminated: {exitCode: 0, reason: Completed, startedAt: {{ $now | Quote }}, finishedAt: {{ $now | Quote }}}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: false
  restartCount: 0
  state:
    terminated:
      exitCode: 0
      reason: Completed
      message: %(message)s
      startedAt: {{ $now | Quote }}
      finishedAt: {{ $now | Quote }}
{{ end }}
phase: Succeeded
"""

# a compile error: fetch-code done, compile exits 1 with the compiler's messages, upload never starts
_COMPILE_FAILED = """\
{{ $now := Now }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "False"
  type: Initialized
initContainerStatuses:
- name: fetch-code
  image: {{ (index .spec.initContainers 0).image | Quote }}
  ready: true
  restartCount: 0
  state:
    terminated: {exitCode: 0, reason: Completed, startedAt: {{ $now | Quote }}, finishedAt: {{ $now | Quote }}}
- name: compile
  image: {{ (index .spec.initContainers 1).image | Quote }}
  ready: false
  restartCount: 0
  state:
    terminated:
      exitCode: 1
      reason: Error
      message: %(message)s
      startedAt: {{ $now | Quote }}
      finishedAt: {{ $now | Quote }}
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: false
  restartCount: 0
  state:
    waiting:
      reason: PodInitializing
{{ end }}
phase: Failed
"""


@pytest.fixture
def compile_ends(k8s_testbed: Testbed) -> Iterator[Any]:
    """``compile_ends(namespace, code_hash, template, message)``: how that code's compile pods end."""
    made: list[str] = []

    def make(namespace: str, code_hash: str, template: str, message: str) -> None:
        name = f"sless-compile-{secrets.token_hex(4)}"
        expressions = [
            {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
            {"key": ".status.phase", "operator": "In", "values": ["Pending"]},
            {"key": ".metadata.namespace", "operator": "In", "values": [namespace]},
            {"key": '.metadata.labels["sless.dev/component"]', "operator": "In", "values": ["compile"]},
            {"key": '.metadata.labels["sless.dev/code-hash"]', "operator": "In", "values": [code_hash[:16]]},
        ]
        k8s_testbed.apply_stage(name, expressions, template % {"message": json.dumps(message)})
        made.append(name)

    try:
        yield make
    finally:
        for name in made:
            k8s_testbed.delete_stage(name)


def go_function(sless: Sless, name: str, code: str, deps: str = "") -> None:
    body: dict[str, Any] = {"runtime": "go1.23", "entrypoint": "Handle", "codeHash": code,
                            "codeKey": f"code/{sless.ns}/{name}/{code[:8]}.tar.gz", "codeSha256": code[::-1]}
    if deps:
        body.update(depsHash=deps, contextKey=f"contexts/{sless.ns}/{name}/{deps[:8]}.tar.gz", contextSha256=deps)
    sless.apply("Function", name, body)


def compile_jobs(sless: Sless, name: str) -> list[dict[str, Any]]:
    return sless.labelled("jobs", f"sless.dev/component=compile,sless.dev/function={name}")


def kaniko_jobs(sless: Sless) -> list[dict[str, Any]]:
    return sless.labelled("jobs", f"sless.dev/component=build,sless.dev/namespace={sless.ns}", sless.op.build_namespace)


def template(sless: Sless, name: str) -> dict[str, Any]:
    dep = sless.get("deployment", name)
    assert dep is not None
    return dict(dep["spec"]["template"])


def test_a_go_code_change_compiles_in_the_tenant_namespace_and_rolls_out_without_an_image(
    sless: Sless, compile_ends: Any
) -> None:
    compile_ends(sless.ns, CODE_1, _COMPILED, json.dumps({"sha256": BIN_1, "bytes": 10}))
    go_function(sless, "gofn", CODE_1)
    status = sless.wait_phase("Function", "gofn", "Ready")["status"]
    assert status["image"] == GO_RUN_IMAGE and status["codeHash"] == CODE_1
    assert status["binary"]["sha256"] == BIN_1 and status["binary"]["key"].startswith(f"binaries/{sless.ns}/gofn/")
    [job] = compile_jobs(sless, "gofn")
    # the runtime's own image compiles code without dependencies; the apiserver admitted it under restricted
    builder = job["spec"]["template"]["spec"]["initContainers"][1]["image"]
    assert builder == "runtimes.test.invalid/sless/go1.23:latest"
    pod = template(sless, "gofn")["spec"]
    [fetch] = pod["initContainers"]
    assert f"--key={status['binary']['key']}" in fetch["args"] and f"--sha256={BIN_1}" in fetch["args"]
    assert pod["containers"][0]["command"] == ["/app/bin/server"]
    assert status["codeUrl"]["key"] == status["binary"]["key"]  # the pods' URL is signed for the binary

    compile_ends(sless.ns, CODE_2, _COMPILED, json.dumps({"sha256": BIN_2, "bytes": 10}))
    go_function(sless, "gofn", CODE_2)  # a code-only change
    status = sless.wait_phase("Function", "gofn", "Ready")["status"]
    assert status["codeHash"] == CODE_2 and status["binary"]["sha256"] == BIN_2
    assert f"--sha256={BIN_2}" in template(sless, "gofn")["spec"]["initContainers"][0]["args"]
    assert len(compile_jobs(sless, "gofn")) == 2
    assert kaniko_jobs(sless) == [], "a Go code change built an image"

    # rollback to the first code: the same inputs name the same binary, known to the status: nothing compiles
    go_function(sless, "gofn", CODE_1)
    status = sless.wait_phase("Function", "gofn", "Ready")["status"]
    assert status["codeHash"] == CODE_1 and status["binary"]["sha256"] == BIN_1
    assert len(compile_jobs(sless, "gofn")) == 2
    assert sorted(status["binaries"].values()) == [BIN_1, BIN_2]

    # a traffic split's other version (2) runs the binary compiled for it, beside the current one (3)
    assert [v["version"] for v in status["versions"]] == [1, 2, 3]
    sless.patch_spec("Function", "gofn", traffic=[{"version": 3, "weight": 50}, {"version": 2, "weight": 50}])
    split = sless.op.wait("the split's Deployment", lambda: sless.get("deployment", other_version_name("gofn")), 60)
    pod = split["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == GO_RUN_IMAGE and pod["containers"][0]["command"] == ["/app/bin/server"]
    assert f"--sha256={BIN_2}" in pod["initContainers"][0]["args"]
    assert len(compile_jobs(sless, "gofn")) == 2, "the split's version compiled again"


def test_code_that_does_not_compile_fails_the_function_with_the_compilers_message(
    sless: Sless, compile_ends: Any
) -> None:
    compile_ends(sless.ns, CODE_1, _COMPILED, json.dumps({"sha256": BIN_1, "bytes": 10}))
    go_function(sless, "broken", CODE_1)
    sless.wait_phase("Function", "broken", "Ready")
    error = "./handler.go:7:2: undefined: fmt.Printn"
    compile_ends(sless.ns, CODE_BAD, _COMPILE_FAILED, error)
    go_function(sless, "broken", CODE_BAD)
    status = sless.wait_phase("Function", "broken", "Failed")["status"]
    assert status["message"].startswith("compile failed") and error in status["message"], status
    built = next(c for c in status["conditions"] if c["type"] == "Built")
    assert (built["status"], built["reason"]) == ("False", "CompileFailed")
    # what served keeps serving: the Deployment still fetches the first binary
    assert f"--sha256={BIN_1}" in template(sless, "broken")["spec"]["initContainers"][0]["args"]
    assert status["binary"]["sha256"] == BIN_1


def test_go_dependencies_build_one_image_that_compiles_every_code_change(sless: Sless, compile_ends: Any) -> None:
    compile_ends(sless.ns, CODE_1, _COMPILED, json.dumps({"sha256": BIN_1, "bytes": 10}))
    compile_ends(sless.ns, CODE_2, _COMPILED, json.dumps({"sha256": BIN_2, "bytes": 10}))
    go_function(sless, "mods", CODE_1, DEPS)
    status = sless.wait_phase("Function", "mods", "Ready")["status"]
    deps_image = f"registry.test.invalid/sless/{sless.ns}/deps:{DEPS[:32]}"
    assert status["depsImage"] == deps_image and status["image"] == GO_RUN_IMAGE
    [job] = compile_jobs(sless, "mods")
    assert job["spec"]["template"]["spec"]["initContainers"][1]["image"] == deps_image
    go_function(sless, "mods", CODE_2, DEPS)
    assert sless.wait_phase("Function", "mods", "Ready")["status"]["binary"]["sha256"] == BIN_2
    assert len(kaniko_jobs(sless)) == 1, "a code-only change built the dependency image again"
