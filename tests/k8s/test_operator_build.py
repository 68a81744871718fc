"""Build Jobs on a real apiserver: the fetch-context init container and what a failed fetch or push reports.

kwok runs no containers, so a kwok Stage decides the outcome: here the init container "fails"
the way ``sless_operator.contextfetch`` does (exit 1, its reason as the termination message) and
kaniko never starts, or the steps before the push end well and the push step fails the way
``sless_operator.imagepush`` does. The Job controller, the pod statuses and the operator's capture are real.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
import requests

from tests.support.kube_operator import CODE_A
from tests.support.metricdocs import undocumented_series
from tests.support.metrics import sample, scrape
from tests.support.stages import FETCH_FAILED
from tests.support.testbed import Testbed

if TYPE_CHECKING:
    from tests.support.kube_operator import Sless

pytestmark = [pytest.mark.k8s, pytest.mark.slow]


# the init containers (fetch-context, kaniko) ended well, the push step failed: what imagepush does when the
# registry refuses the credential
_PUSH_FAILED = """\
{{ $now := Now }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Initialized
- lastTransitionTime: {{ $now | Quote }}
  status: "False"
  type: Ready
initContainerStatuses:
{{ range .spec.initContainers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: true
  restartCount: 0
  state:
    terminated:
      exitCode: 0
      reason: Completed
      startedAt: {{ $now | Quote }}
      finishedAt: {{ $now | Quote }}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: false
  restartCount: 0
  state:
    terminated:
      exitCode: 1
      reason: Error
      message: %(message)s
      startedAt: {{ $now | Quote }}
      finishedAt: {{ $now | Quote }}
{{ end }}
phase: Failed
"""


@pytest.fixture
def fetch_fails(k8s_testbed: Testbed) -> Iterator[Any]:
    """``fetch_fails(namespace, labels, message)``: matching build pods fail in their init container."""
    made: list[str] = []

    def make(namespace: str, labels: dict[str, str], message: str, template: str = FETCH_FAILED) -> None:
        name = f"sless-fetch-fails-{secrets.token_hex(4)}"
        expressions = [
            {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
            {"key": ".status.phase", "operator": "In", "values": ["Pending"]},
            {"key": ".metadata.namespace", "operator": "In", "values": [namespace]},
            *({"key": f'.metadata.labels["{k}"]', "operator": "In", "values": [v]} for k, v in labels.items()),
        ]
        k8s_testbed.apply_stage(name, expressions, template % {"message": json.dumps(message)})
        made.append(name)

    try:
        yield make
    finally:
        for name in made:
            k8s_testbed.delete_stage(name)


def test_build_pod_fetches_the_context_in_an_init_container(sless: Sless) -> None:
    sless.function("fetched")
    sless.wait_phase("Function", "fetched", "Ready")
    [job] = sless.build_jobs("fetched")
    pod = job["spec"]["template"]["spec"]
    fetch, kaniko = pod["initContainers"]
    assert fetch["name"] == "fetch-context" and fetch["envFrom"][0]["secretRef"]["name"] == "sless-build-s3"
    assert f"--key=contexts/{sless.ns}/fetched/{CODE_A[:8]}.tar.gz" in fetch["args"]
    assert "envFrom" not in kaniko and "--context=dir:///workspace/context" in kaniko["args"]
    [push] = pod["containers"]  # kaniko leaves a tarball; the push step pushes it
    assert push["name"] == "push-image" and "--no-push" in kaniko["args"]
    # the apiserver accepted it in the build namespace (Pod Security baseline) and kwok ran it
    pods = sless.labelled("pods", "sless.dev/function=fetched,sless.dev/component=build", sless.op.build_namespace)
    assert pods and pods[0]["status"]["phase"] == "Succeeded"
    assert pods[0]["status"]["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    # counted once for Prometheus (the operator's /metrics answers only the scrape token)
    assert requests.get(sless.op.metrics_url + "/metrics", timeout=10).status_code == 401
    text = scrape(sless.op.metrics_url)
    assert sample(text, "sless_builds_total", runtime="python3.11", result="ready") == 1
    assert sample(text, "sless_build_duration_seconds_count", runtime="python3.11") == 1
    # the operator's own work: the Function's reconciles timed, the work queue's depth exposed
    assert sample(text, "sless_operator_reconcile_duration_seconds_count", kind="function") >= 1
    assert "sless_operator_queue_depth " in text
    assert undocumented_series(text) == []


def test_a_failed_context_fetch_is_what_the_function_reports(sless: Sless, fetch_fails: Any) -> None:
    reason = f"build context: build context contexts/{sless.ns}/nofetch/x.tar.gz has SHA-256 {'1' * 64}, expected"
    fetch_fails(sless.op.build_namespace, {"sless.dev/function": "nofetch", "sless.dev/code-hash": CODE_A[:16]},
                reason)  # fmt: skip
    sless.function("nofetch")
    body = sless.wait_phase("Function", "nofetch", "Failed", timeout=120)
    status = body["status"]
    assert reason in status["message"], status
    built = next(c for c in status["conditions"] if c["type"] == "Built")
    assert (built["status"], built["reason"]) == ("False", "BuildFailed")
    assert sless.get("deployment", "nofetch") is None
    assert sample(scrape(sless.op.metrics_url), "sless_builds_total", runtime="python3.11", result="failed") == 1


def test_a_failed_push_is_what_the_function_reports(sless: Sless, fetch_fails: Any) -> None:
    """kaniko built (exit 0); the push step, the pod's last container, failed: its termination message counts."""
    reason = "image push to registry.test/x:1: the registry's token server refused the push credential: HTTP 401"
    fetch_fails(sless.op.build_namespace, {"sless.dev/function": "nopush", "sless.dev/code-hash": CODE_A[:16]},
                reason, _PUSH_FAILED)  # fmt: skip
    sless.function("nopush")
    status = sless.wait_phase("Function", "nopush", "Failed", timeout=120)["status"]
    assert reason in status["message"], status
    built = next(c for c in status["conditions"] if c["type"] == "Built")
    assert (built["status"], built["reason"]) == ("False", "BuildFailed")
